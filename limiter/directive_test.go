package limiter

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestDirectivesRoundTrip(t *testing.T) {
	for name, mk := range map[string]func(testing.TB) redis.UniversalClient{
		"standalone": func(tb testing.TB) redis.UniversalClient { return mustRedis(tb) },
		"cluster":    func(tb testing.TB) redis.UniversalClient { return mustCluster(tb) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rdb := mk(t)
			store := NewDirectiveStore(rdb, uniqueKey(t))
			w := NewWatcher(store, time.Second)
			w.Refresh(ctx)
			if v := w.Current().Version; v != 0 {
				t.Fatalf("empty store: version %d, want 0", v)
			}
			exp := time.Now().Add(time.Minute).Truncate(time.Millisecond)
			split := SplitDirective{Key: "k:hot", Shares: map[string]float64{"gw1": 0.75, "gw2": 0.25}, Expires: exp}
			if err := store.WriteSplits(ctx, []SplitDirective{split}); err != nil {
				t.Fatal(err)
			}
			if err := store.WriteNATs(ctx, []NATDirective{{Key: "ip:203.0.113.7", Factor: 4, Clients: 40, Expires: exp}}); err != nil {
				t.Fatal(err)
			}
			w.Refresh(ctx)
			d := w.Current()
			if d.Version != 2 || len(d.Splits) != 1 || len(d.NATs) != 1 {
				t.Fatalf("Current() = %+v, want version 2 with one split and one NAT", d)
			}
			if got := d.Splits["k:hot"]; got.Shares["gw1"] != 0.75 || !got.Expires.Equal(exp) {
				t.Errorf("split = %+v, want %+v", got, split)
			}
			// The hashes expire with their newest directive.
			if ttl := rdb.PTTL(ctx, store.key("split")).Val(); ttl <= 0 || ttl > time.Minute {
				t.Errorf("PTTL(split) = %v, want within (0, 1m]", ttl)
			}
			// Removing the directive returns the key to its shared bucket.
			if err := store.WriteSplits(ctx, nil); err != nil {
				t.Fatal(err)
			}
			w.Refresh(ctx)
			if k, _, ok := w.Current().Split("k:hot", "gw1", benchRules, time.Now()); ok || k != "k:hot" {
				t.Errorf("after removal Split() = %q, %v; want the shared key", k, ok)
			}
			// A malformed entry is skipped, not applied.
			rdb.HSet(ctx, store.key("nat"), "ip:bad", "{not json")
			rdb.Incr(ctx, store.key("version"))
			loaded, bad, err := store.Load(ctx)
			if err != nil || bad != 1 || len(loaded.NATs) != 1 {
				t.Errorf("Load() with a malformed entry = %d NATs, bad %d, err %v; want 1, 1, nil", len(loaded.NATs), bad, err)
			}
		})
	}
}

func TestDirectiveApply(t *testing.T) {
	now := time.Now()
	rules := []Rule{{Name: "m", Limit: 100, Period: time.Minute, Burst: 20}, {Name: "d", Limit: 1000, Period: 24 * time.Hour}}
	d := &Directives{
		Splits: map[string]SplitDirective{
			"k:hot":  {Key: "k:hot", Shares: map[string]float64{"a": 0.75, "b": 0.25}, Expires: now.Add(time.Minute)},
			"k:cold": {Key: "k:cold", Shares: map[string]float64{"a": 1}, Expires: now.Add(-time.Second)},
		},
		NATs: map[string]NATDirective{"ip:1.2.3.4": {Key: "ip:1.2.3.4", Factor: 3, Expires: now.Add(time.Minute)}},
	}
	key, got, ok := d.Split("k:hot", "b", rules, now)
	if !ok || key != "k:hot/gw:b" || got[0].Limit != 25 || got[0].Burst != 5 || got[1].Limit != 250 {
		t.Errorf("Split(k:hot, b) = %q %+v %v, want k:hot/gw:b with a quarter of each rule", key, got, ok)
	}
	if _, _, ok := d.Split("k:cold", "a", rules, now); ok {
		t.Error("Split(k:cold) applied an expired directive")
	}
	if got, ok := d.NAT("ip:1.2.3.4", rules, now); !ok || got[0].Limit != 300 || got[0].Burst != 60 {
		t.Errorf("NAT(ip:1.2.3.4) = %+v %v, want limits tripled", got, ok)
	}
	if _, ok := d.NAT("ip:5.6.7.8", rules, now); ok {
		t.Error("NAT applied to an IP without a directive")
	}
	bad := []SplitDirective{
		{Key: "", Shares: map[string]float64{"a": 1}},
		{Key: "k", Shares: nil},
		{Key: "k", Shares: map[string]float64{"a": 0.5}},
		{Key: "k", Shares: map[string]float64{"a": math.NaN()}},
		{Key: "k", Shares: map[string]float64{"": 1}},
	}
	for _, s := range bad {
		if s.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want an error", s)
		}
	}
}

// TestSplitKeepsLimit: two gateways with a 3:1 traffic split and a split
// directive sized from it admit, together, the key's limit within 5 %.
func TestSplitKeepsLimit(t *testing.T) {
	rdb := mustRedis(t)
	ctx := context.Background()
	rules := []Rule{{Name: "sec", Limit: 200, Period: time.Second, Burst: 40}}
	key := uniqueKey(t)
	d := &Directives{Splits: map[string]SplitDirective{key: {Key: key, Shares: map[string]float64{"a": 0.75, "b": 0.25}, Expires: time.Now().Add(time.Hour)}}}
	gws := map[string]*Redis{"a": mustLimiter(t, rdb, Config{}), "b": mustLimiter(t, rdb, Config{})}
	start := redisTime(t, rdb)
	allowed := 0
	times := map[string][]time.Time{}
	var parts map[string]Rule
	for stop := time.Now().Add(2 * time.Second); time.Now().Before(stop); {
		// 3:1 uneven traffic: a sees three requests for each one b sees.
		for _, gw := range []string{"a", "a", "a", "b"} {
			k, r, _ := d.Split(key, gw, rules, time.Now())
			dec, err := gws[gw].Allow(ctx, k, r, 1)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Allowed {
				allowed++
			}
			if parts == nil {
				parts = map[string]Rule{}
			}
			parts[gw] = r[0]
			times[gw] = append(times[gw], dec.Time)
		}
	}
	elapsed := redisTime(t, rdb).Sub(start)
	want := 40 + 200*elapsed.Seconds()
	lost := 0.0
	for gw, r := range parts {
		lost += stalled(times[gw], float64(r.Burst), float64(r.Limit)/r.Period.Seconds())
	}
	t.Logf("admitted %d, limit over %v is %.1f, %.1f of it refilled while a gateway's caller stalled", allowed, elapsed, want, lost)
	if got := float64(allowed); got > want*1.05 || got < (want-lost)*0.95 {
		t.Errorf("admitted %d with a split, want %.1f (less what stalls left unasked, %.1f) ± 5%%", allowed, want, lost)
	}
}

// TestSplitSharesSumToTheLimit: whatever the shares, the gateways' parts of
// a rule sum to its limit and burst (issue 14 row 3: limit 10 split 20
// ways admitted 20 per period, limit 1 over 4 ways admitted 4, and a
// gateway the split did not name got 1 % more).
func TestSplitSharesSumToTheLimit(t *testing.T) {
	now := time.Now()
	even := func(n int) map[string]float64 {
		m := map[string]float64{}
		for i := range n {
			m[fmt.Sprintf("gw-%02d", i)] = 1 / float64(n)
		}
		return m
	}
	tests := []struct {
		name   string
		shares map[string]float64
		rule   Rule
	}{
		{"10 over 20", even(20), Rule{Name: "m", Limit: 10, Period: time.Minute}},
		{"1 over 4", even(4), Rule{Name: "m", Limit: 1, Period: time.Minute}},
		{"100 over 3", even(3), Rule{Name: "m", Limit: 100, Period: time.Minute, Burst: 10}},
		{"3:1", map[string]float64{"a": 0.75, "b": 0.25}, Rule{Name: "m", Limit: 7, Period: time.Second}},
		{"with others", map[string]float64{"a": 0.6, "b": 0.38, OtherGateways: 0.02}, Rule{Name: "m", Limit: 1000, Period: time.Hour}},
		{"others below a unit", map[string]float64{"a": 0.6, "b": 0.38, OtherGateways: 0.02}, Rule{Name: "m", Limit: 20, Period: time.Second}},
		{"uneven", map[string]float64{"a": 0.333, "b": 0.333, "c": 0.334}, Rule{Name: "m", Limit: 1_000_003, Period: 24 * time.Hour, Burst: 5}},
	}
	for _, tt := range tests {
		d := &Directives{Splits: map[string]SplitDirective{"k": {Key: "k", Shares: tt.shares, Expires: now.Add(time.Minute)}}}
		var limit, capacity int64
		split := 0
		for gw := range tt.shares {
			if gw == OtherGateways {
				continue // checked below, as an unnamed gateway
			}
			_, got, ok := d.Split("k", gw, []Rule{tt.rule}, now)
			if ok {
				split++
				limit += got[0].Limit
				capacity += got[0].Capacity()
			}
		}
		namedGateways := len(tt.shares)
		if _, ok := tt.shares[OtherGateways]; ok {
			namedGateways--
		}
		switch split {
		case 0: // not split: every gateway checks the shared, exact bucket
		case namedGateways:
			_, others, _ := d.Split("k", "gw-new", []Rule{tt.rule}, now)
			if _, ok := tt.shares[OtherGateways]; ok && others[0].Period != MaxPeriod {
				limit += others[0].Limit
				capacity += others[0].Capacity()
			}
			if limit != tt.rule.Limit || capacity != tt.rule.Capacity() {
				t.Errorf("%s: parts sum to limit %d capacity %d, want %d and %d", tt.name, limit, capacity, tt.rule.Limit, tt.rule.Capacity())
			}
		default:
			t.Errorf("%s: split applied on %d of %d gateways: the shared bucket and the split would both admit", tt.name, split, len(tt.shares))
		}
		// A gateway the split does not name checks the others' share, or
		// the shared bucket only when the whole split is off.
		k, got, ok := d.Split("k", "gw-new", []Rule{tt.rule}, now)
		_, hasOthers := tt.shares[OtherGateways]
		switch {
		case ok && k != "k/gw:"+OtherGateways:
			t.Errorf("%s: unnamed gateway checks %q, want the others' bucket", tt.name, k)
		case ok && !hasOthers && (got[0].Capacity() != 1 || got[0].Period != MaxPeriod):
			t.Errorf("%s: unnamed gateway without a reserved share gets %+v, want one unit per MaxPeriod", tt.name, got[0])
		case ok != (split > 0):
			t.Errorf("%s: unnamed gateway split %v while the named ones are %v", tt.name, ok, split > 0)
		}
	}
}
