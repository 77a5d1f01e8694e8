package analytics

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/edgelimit/edgelimit/limiter"
)

func defaults() Config { return Config{}.WithDefaults() }

func TestShares(t *testing.T) {
	all := int64(1 << 62) // every request allowed
	tests := []struct {
		name    string
		give    map[string]int64
		allowed int64
		floor   float64
		want    map[string]float64
	}{
		{"3:1 uneven load", map[string]int64{"a": 3000, "b": 1000}, all, 0.05, map[string]float64{"a": 0.75, "b": 0.25}},
		{"even", map[string]int64{"a": 10, "b": 10, "c": 10, "d": 10}, all, 0.05, map[string]float64{"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}},
		{"one gateway", map[string]int64{"a": 7}, all, 0.05, map[string]float64{"a": 1}},
		{"trickle gets the floor", map[string]int64{"a": 990, "b": 10}, all, 0.05, map[string]float64{"a": 0.95, "b": 0.05}},
		{"zero requests gets the floor", map[string]int64{"a": 500, "b": 500, "c": 0}, all, 0.1, map[string]float64{"a": 0.45, "b": 0.45, "c": 0.1}},
		// 2 % and 3 % pinned to 10 %; 80 % left for the others, 5:3.
		{"floor cascades", map[string]int64{"a": 600, "b": 360, "c": 20, "d": 20}, all, 0.1, map[string]float64{"a": 0.5, "b": 0.3, "c": 0.1, "d": 0.1}},
		{"floor too high for the count: equal", map[string]int64{"a": 99, "b": 1, "c": 0}, all, 0.4, map[string]float64{"a": 1.0 / 3, "b": 1.0 / 3, "c": 1.0 / 3}},
		{"no traffic: equal", map[string]int64{"a": 0, "b": 0}, all, 0.05, map[string]float64{"a": 0.5, "b": 0.5}},
		{"empty", map[string]int64{}, all, 0.05, map[string]float64{}},
		// Issue 14 row 4: a limit of 40/s over a minute (2,400 allowed), one
		// gateway flooding it, the other at 10/s: the quiet one keeps its
		// 600 (660 with the headroom), the flooded one gets the other 1,740,
		// not 95 %.
		{"saturated next to idle", map[string]int64{"a": 12000, "b": 600}, 2400, 0.05, map[string]float64{"a": 1740.0 / 2400, "b": 660.0 / 2400}},
		{"allowed exactly the demand", map[string]int64{"a": 3000, "b": 1000}, 4000, 0.05, map[string]float64{"a": 0.75, "b": 0.25}},
		// 3:1 at twice the limit: b asks for half the limit and keeps it
		// (with no room for the headroom).
		{"3:1 at twice the limit", map[string]int64{"a": 3000, "b": 1000}, 2000, 0.05, map[string]float64{"a": 0.5, "b": 0.5}},
		// Equal parts of 900 are 300: c's 100 is met (110 with the
		// headroom), then 395 each for a and b, of which b asks only 200
		// (220); a gets the other 570.
		{"water-filling cascades", map[string]int64{"a": 5000, "b": 200, "c": 100}, 900, 0.05, map[string]float64{"a": 570.0 / 900, "b": 220.0 / 900, "c": 110.0 / 900}},
		{"two saturated share equally", map[string]int64{"a": 5000, "b": 3000, "c": 100}, 1100, 0.05, map[string]float64{"a": 495.0 / 1100, "b": 495.0 / 1100, "c": 110.0 / 1100}},
		{"nothing allowed: by requests", map[string]int64{"a": 3000, "b": 1000}, 0, 0.05, map[string]float64{"a": 0.75, "b": 0.25}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Shares(tt.give, tt.allowed, tt.floor)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("Shares(%v, %d, %v) mismatch (-want +got):\n%s", tt.give, tt.allowed, tt.floor, diff)
			}
			sum := 0.0
			for _, s := range got {
				sum += s
				if s < min(tt.floor, 1/float64(len(got)))-1e-12 {
					t.Errorf("Shares(%v): share %v under the floor %v", tt.give, s, tt.floor)
				}
			}
			if len(got) > 0 && math.Abs(sum-1) > 1e-9 {
				t.Errorf("Shares(%v) sum to %v, want 1", tt.give, sum)
			}
		})
	}
}

func TestDetectHotKeys(t *testing.T) {
	cfg := defaults().Hot // 100/s, or 20 % of traffic at 10/s or more
	span := time.Minute
	recent := func(k KeyTraffic, n int64) KeyTraffic { k.Recent = n; return k }
	denied := func(k KeyTraffic, n int64) KeyTraffic { k.Denied = n; return k }
	k := func(id string, gws map[string]int64) KeyTraffic {
		return KeyTraffic{KeyID: id, KeyKind: "api_key", Gateways: gws}
	}
	tests := []struct {
		name  string
		keys  []KeyTraffic
		total int64
		split map[string]bool
		want  []HotKey
	}{
		{
			name:  "rate over the threshold, split 3:1",
			keys:  []KeyTraffic{k("hot", map[string]int64{"gw-a": 9000, "gw-b": 3000}), k("cold", map[string]int64{"gw-a": 600, "gw-b": 600})},
			total: 100000,
			want: []HotKey{{KeyID: "hot", KeyKind: "api_key", Requests: 12000, Rate: 200, Share: 0.12, Reason: "rate",
				Gateways: map[string]int64{"gw-a": 9000, "gw-b": 3000}, Shares: map[string]float64{"gw-a": 0.75, "gw-b": 0.25}}},
		},
		{
			name:  "just under the rate",
			keys:  []KeyTraffic{k("warm", map[string]int64{"gw-a": 5999})},
			total: 1000000,
		},
		{
			name:  "at the rate exactly",
			keys:  []KeyTraffic{k("hot", map[string]int64{"gw-a": 3000, "gw-b": 3000})},
			total: 1000000,
			want: []HotKey{{KeyID: "hot", KeyKind: "api_key", Requests: 6000, Rate: 100, Share: 0.006, Reason: "rate",
				Gateways: map[string]int64{"gw-a": 3000, "gw-b": 3000}, Shares: map[string]float64{"gw-a": 0.5, "gw-b": 0.5}}},
		},
		{
			name:  "share of a quiet fleet",
			keys:  []KeyTraffic{k("big", map[string]int64{"gw-a": 1200, "gw-b": 1200}), k("small", map[string]int64{"gw-a": 600})},
			total: 6000,
			want: []HotKey{{KeyID: "big", KeyKind: "api_key", Requests: 2400, Rate: 40, Share: 0.4, Reason: "share",
				Gateways: map[string]int64{"gw-a": 1200, "gw-b": 1200}, Shares: map[string]float64{"gw-a": 0.5, "gw-b": 0.5}}},
		},
		{
			name:  "share without the rate floor",
			keys:  []KeyTraffic{k("only", map[string]int64{"gw-a": 300, "gw-b": 200})},
			total: 500,
		},
		{
			name: "one gateway: hot but no split",
			keys: []KeyTraffic{k("solo", map[string]int64{"gw-a": 60000})},
			want: []HotKey{{KeyID: "solo", KeyKind: "api_key", Requests: 60000, Rate: 1000, Reason: "rate",
				Gateways: map[string]int64{"gw-a": 60000}}},
		},
		{
			name:  "split key cooling but above half the rate stays",
			keys:  []KeyTraffic{k("was-hot", map[string]int64{"gw-a": 2000, "gw-b": 2000})},
			total: 1000000,
			split: map[string]bool{"api_key:was-hot": true},
			want: []HotKey{{KeyID: "was-hot", KeyKind: "api_key", Requests: 4000, Rate: 4000.0 / 60, Share: 0.004, Reason: "cooling",
				Gateways: map[string]int64{"gw-a": 2000, "gw-b": 2000}, Shares: map[string]float64{"gw-a": 0.5, "gw-b": 0.5}}},
		},
		{
			name:  "split key under half the rate is lifted",
			keys:  []KeyTraffic{k("was-hot", map[string]int64{"gw-a": 1000, "gw-b": 1000})},
			total: 1000000,
			split: map[string]bool{"api_key:was-hot": true},
		},
		{
			// 4,500 requests in the window: 75/s over its 60s, but 1,800 of
			// them in the last 15s: 120/s, hot within seconds.
			name:  "turned hot within the window",
			keys:  []KeyTraffic{recent(k("new", map[string]int64{"gw-a": 3000, "gw-b": 1500}), 1800)},
			total: 1000000,
			want: []HotKey{{KeyID: "new", KeyKind: "api_key", Requests: 4500, Rate: 120, Share: 0.0045, Reason: "rate",
				Gateways: map[string]int64{"gw-a": 3000, "gw-b": 1500}, Shares: map[string]float64{"gw-a": 2.0 / 3, "gw-b": 1.0 / 3}}},
		},
		{
			// 1,400 in the last 15s is 93/s: not a rate of 100.
			name:  "recent rate under the threshold",
			keys:  []KeyTraffic{recent(k("warm", map[string]int64{"gw-a": 3000, "gw-b": 1500}), 1400)},
			total: 1000000,
		},
		{
			name:  "the same rate without a split is not hot",
			keys:  []KeyTraffic{k("warm", map[string]int64{"gw-a": 2000, "gw-b": 2000})},
			total: 1000000,
		},
		{
			// Issue 14: hotness is judged on what a key is allowed, so a
			// caller cannot win a split by sending traffic it is refused.
			name:  "denied traffic does not make a key hot",
			keys:  []KeyTraffic{denied(k("flood", map[string]int64{"gw-a": 9000, "gw-b": 3000}), 11000)},
			total: 1000000,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DetectHotKeys(cfg, tt.keys, tt.total, span, tt.split)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("DetectHotKeys mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDetectHotKeysOrderAndCap(t *testing.T) {
	cfg := defaults().Hot
	cfg.MaxKeys = 2
	var keys []KeyTraffic
	for i, n := range []int64{7000, 9000, 8000, 100} {
		keys = append(keys, KeyTraffic{KeyID: string(rune('a' + i)), KeyKind: "ip", Gateways: map[string]int64{"g1": n, "g2": n}})
	}
	got := DetectHotKeys(cfg, keys, 1e7, time.Minute, nil)
	var ids []string
	for _, h := range got {
		ids = append(ids, h.KeyID)
	}
	if want := []string{"b", "c"}; !cmp.Equal(ids, want) {
		t.Errorf("DetectHotKeys ids = %v, want %v (hottest first, capped at 2)", ids, want)
	}
	cfg.Disabled = true
	if got := DetectHotKeys(cfg, keys, 1e7, time.Minute, nil); got != nil {
		t.Errorf("DetectHotKeys(disabled) = %v, want nil", got)
	}
}

func TestHotThreshold(t *testing.T) {
	cfg := defaults().Hot
	tests := []struct {
		name  string
		total int64
		span  time.Duration
		want  int64
	}{
		// min(100/s × 60, max(10/s × 60, 20 % × 1M)) = 6000, × cool 0.5.
		{"busy fleet: the rate", 1000000, time.Minute, 3000},
		// min(6000, max(600, 20 % × 10000 = 2000)) = 2000, × 0.5.
		{"quiet fleet: the share", 10000, time.Minute, 1000},
		// min(6000, max(600, 200)) = 600, × 0.5.
		{"idle fleet: the share's rate floor", 1000, time.Minute, 300},
	}
	for _, tt := range tests {
		if got := cfg.Threshold(tt.total, tt.span); got != tt.want {
			t.Errorf("%s: Threshold(%d, %v) = %d, want %d", tt.name, tt.total, tt.span, got, tt.want)
		}
	}
}

func TestSplitDirectives(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	hot := []HotKey{
		{KeyID: "abc", KeyKind: "api_key", Shares: map[string]float64{"gw-a": 0.75, "gw-b": 0.25}},
		{KeyID: "solo", KeyKind: "api_key"},
	}
	got := SplitDirectives(hot, now, 2*time.Minute)
	want := []limiter.SplitDirective{{Key: limiter.DirectiveKey("api_key", "abc"), Shares: map[string]float64{"gw-a": 0.75 * 0.98, "gw-b": 0.25 * 0.98, limiter.OtherGateways: 0.02}, Expires: now.Add(2 * time.Minute)}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SplitDirectives mismatch (-want +got):\n%s", diff)
	}
	for _, d := range got {
		if err := d.Validate(); err != nil {
			t.Errorf("SplitDirectives made an invalid directive: %v", err)
		}
	}
}

func TestDetectNATs(t *testing.T) {
	cfg := defaults().NAT // 10 keys or 20 user agents, 100 requests; 0.5 per client up to 50
	tests := []struct {
		name    string
		rows    []IPTraffic
		flagged map[string]bool
		want    []NATIP
	}{
		{
			name: "many keys",
			rows: []IPTraffic{{IP: "198.51.100.1", Requests: 5000, Denied: 40, DistinctKeys: 40, DistinctUserAgents: 12}},
			want: []NATIP{{IP: "198.51.100.1", Key: "ip:198.51.100.1", Requests: 5000, Denied: 40, DistinctKeys: 40, DistinctUserAgents: 12, Clients: 40, Factor: 20, Reason: "keys"}},
		},
		{
			name: "many user agents",
			rows: []IPTraffic{{IP: "198.51.100.2", Requests: 800, DistinctKeys: 1, DistinctUserAgents: 30}},
			// User agents alone are cheap to forge: capped at
			// UserAgentMaxFactor.
			want: []NATIP{{IP: "198.51.100.2", Key: "ip:198.51.100.2", Requests: 800, DistinctKeys: 1, DistinctUserAgents: 30, Clients: 30, Factor: 2, Reason: "user_agents"}},
		},
		{
			name: "own denials are not evidence",
			rows: []IPTraffic{{IP: "198.51.100.3", Requests: 5000, Denied: 4950, DistinctKeys: 40, DistinctUserAgents: 40}},
		},
		{
			name: "ordinary clients",
			rows: []IPTraffic{
				{IP: "192.0.2.1", Requests: 10000, DistinctKeys: 1, DistinctUserAgents: 2},
				{IP: "192.0.2.2", Requests: 300, DistinctKeys: 9, DistinctUserAgents: 19},
			},
		},
		{
			name: "many keys but too little traffic",
			rows: []IPTraffic{{IP: "192.0.2.3", Requests: 99, DistinctKeys: 50, DistinctUserAgents: 50}},
		},
		{
			name: "factor capped",
			rows: []IPTraffic{{IP: "2001:db8:5:6::", Requests: 100000, DistinctKeys: 5000, DistinctUserAgents: 900}},
			want: []NATIP{{IP: "2001:db8:5:6::", Key: "ip:2001:db8:5:6::/64", Requests: 100000, DistinctKeys: 5000, DistinctUserAgents: 900, Clients: 5000, Factor: 50, Reason: "keys"}},
		},
		{
			name:    "flagged IP cooling stays while over half",
			rows:    []IPTraffic{{IP: "198.51.100.1", Requests: 60, DistinctKeys: 6, DistinctUserAgents: 3}},
			flagged: map[string]bool{"ip:198.51.100.1": true},
			want:    []NATIP{{IP: "198.51.100.1", Key: "ip:198.51.100.1", Requests: 60, DistinctKeys: 6, DistinctUserAgents: 3, Clients: 6, Factor: 3, Reason: "cooling"}},
		},
		{
			name:    "flagged IP under half is lifted",
			rows:    []IPTraffic{{IP: "198.51.100.1", Requests: 600, DistinctKeys: 4, DistinctUserAgents: 9}},
			flagged: map[string]bool{"ip:198.51.100.1": true},
		},
		{
			name: "not an address",
			rows: []IPTraffic{{IP: "", Requests: 100000, DistinctKeys: 5000}},
		},
		{
			name: "most clients first",
			rows: []IPTraffic{
				{IP: "198.51.100.1", Requests: 500, DistinctKeys: 12},
				{IP: "198.51.100.9", Requests: 500, DistinctKeys: 30},
			},
			want: []NATIP{
				{IP: "198.51.100.9", Key: "ip:198.51.100.9", Requests: 500, DistinctKeys: 30, Clients: 30, Factor: 15, Reason: "keys"},
				{IP: "198.51.100.1", Key: "ip:198.51.100.1", Requests: 500, DistinctKeys: 12, Clients: 12, Factor: 6, Reason: "keys"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DetectNATs(cfg, tt.rows, tt.flagged)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("DetectNATs mismatch (-want +got):\n%s", diff)
			}
			for _, d := range NATDirectives(got, time.Now(), time.Minute) {
				if err := d.Validate(); err != nil {
					t.Errorf("NATDirectives made an invalid directive: %v", err)
				}
			}
		})
	}
}

func TestNATFactor(t *testing.T) {
	cfg := defaults().NAT
	tests := []struct {
		clients int64
		want    float64
	}{{0, 1}, {1, 1}, {2, 1}, {3, 1.5}, {40, 20}, {100, 50}, {1e6, 50}}
	for _, tt := range tests {
		if got := NATFactor(cfg, tt.clients); got != tt.want {
			t.Errorf("NATFactor(%d) = %v, want %v", tt.clients, got, tt.want)
		}
	}
	cfg.MaxFactor = 2000 // Validate refuses it; the factor still stays in limiter's bound
	if got := NATFactor(cfg, 1e6); got != 1000 {
		t.Errorf("NATFactor(1e6) with MaxFactor 2000 = %v, want 1000", got)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   error
	}{
		{"defaults", func(*Config) {}, nil},
		{"interval too short", func(c *Config) { c.Interval = time.Millisecond }, ErrBadWindow},
		{"hot window too long", func(c *Config) { c.Hot.Window = 48 * time.Hour }, ErrBadWindow},
		{"negative hot rate", func(c *Config) { c.Hot.MinRate = -1 }, ErrBadThreshold},
		{"share over 1", func(c *Config) { c.Hot.MinShare = 1.5 }, ErrBadThreshold},
		{"floor over half", func(c *Config) { c.Hot.MinGatewayShare = 0.6 }, ErrBadThreshold},
		{"nat factor over limiter's bound", func(c *Config) { c.NAT.MaxFactor = 1001 }, ErrBadThreshold},
		{"nat without any test", func(c *Config) { c.NAT.MinDistinctKeys, c.NAT.MinDistinctUserAgents = -1, -1 }, ErrBadThreshold},
		{"nat user-agent raise under 1", func(c *Config) { c.NAT.UserAgentMaxFactor = 0.5 }, ErrBadThreshold},
		{"nat user-agent raise negative", func(c *Config) { c.NAT.UserAgentMaxFactor = -2 }, ErrBadThreshold},
		{"nat user-agent raise NaN", func(c *Config) { c.NAT.UserAgentMaxFactor = math.NaN() }, ErrBadThreshold},
		// A NaN floor made every share NaN, which failed every split's write.
		{"gateway share floor NaN", func(c *Config) { c.Hot.MinGatewayShare = math.NaN() }, ErrBadThreshold},
		{"hot share NaN", func(c *Config) { c.Hot.MinShare = math.NaN() }, ErrBadThreshold},
		{"hot cool ratio NaN", func(c *Config) { c.Hot.CoolRatio = math.NaN() }, ErrBadThreshold},
		{"nat cool ratio NaN", func(c *Config) { c.NAT.CoolRatio = math.NaN() }, ErrBadThreshold},
		{"nat keys test only", func(c *Config) { c.NAT.MinDistinctUserAgents = -1 }, nil},
		{"hot share test off", func(c *Config) { c.Hot.MinShare = -1 }, nil},
		{"ratio over 1", func(c *Config) { c.Alerts.FailOpenRatio = 2 }, ErrBadThreshold},
		{"alertmanager not a url", func(c *Config) { c.Alerts.AlertmanagerURL = "alertmanager:9093" }, ErrBadURL},
		{"webhook ftp", func(c *Config) { c.Alerts.WebhookURL = "ftp://x/y" }, ErrBadURL},
		{"urls ok", func(c *Config) {
			c.Alerts.AlertmanagerURL = "http://127.0.0.1:9093"
			c.Alerts.WebhookURL = "https://hooks.example/edge"
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := defaults()
			tt.modify(&c)
			if err := c.Validate(); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Validate() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestSplitsCurrent(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ttl := 2 * time.Minute
	live := map[string]limiter.SplitDirective{
		"k": {Key: "k", Shares: map[string]float64{"a": 0.75, "b": 0.25}, Expires: now.Add(90 * time.Second)},
	}
	next := func(a, b float64) []limiter.SplitDirective {
		return []limiter.SplitDirective{{Key: "k", Shares: map[string]float64{"a": a, "b": b}, Expires: now.Add(ttl)}}
	}
	tests := []struct {
		name string
		live map[string]limiter.SplitDirective
		next []limiter.SplitDirective
		now  time.Time
		want bool
	}{
		{"same", live, next(0.75, 0.25), now, true},
		{"shares drift a little", live, next(0.76, 0.24), now, true},
		{"shares moved", live, next(0.7, 0.3), now, false},
		{"expiry due", live, next(0.75, 0.25), now.Add(31 * time.Second), false},
		{"new key", live, append(next(0.75, 0.25), limiter.SplitDirective{Key: "j"}), now, false},
		{"removed", live, nil, now, false},
		{"nothing either way", nil, nil, now, true},
		{"live one expired, none next", live, nil, now.Add(2 * time.Minute), true},
	}
	for _, tt := range tests {
		if got := splitsCurrent(tt.live, tt.next, tt.now, ttl); got != tt.want {
			t.Errorf("%s: splitsCurrent = %v, want %v", tt.name, got, tt.want)
		}
	}
	nlive := map[string]limiter.NATDirective{"ip:1.2.3.4": {Key: "ip:1.2.3.4", Factor: 10, Expires: now.Add(10 * time.Minute)}}
	for _, tt := range []struct {
		name   string
		factor float64
		want   bool
	}{{"same", 10, true}, {"within 5%", 10.4, true}, {"moved", 12, false}} {
		next := []limiter.NATDirective{{Key: "ip:1.2.3.4", Factor: tt.factor}}
		if got := natsCurrent(nlive, next, now, 15*time.Minute); got != tt.want {
			t.Errorf("natsCurrent %s = %v, want %v", tt.name, got, tt.want)
		}
	}
}
