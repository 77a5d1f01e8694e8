package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestCalendarPlanConfig: a plan as sold, a rate beside a monthly quota,
// loads from YAML; what cannot work is refused at load, naming the rule.
func TestCalendarPlanConfig(t *testing.T) {
	const base = `
plans:
  pro:
    rules:
      - {name: per-second, limit: 5, period: 1s}
      - {name: monthly, limit: 100000, %s}
upstreams: {app: {url: "http://127.0.0.1:9000"}}
routes: [{path_prefix: /, upstream: app}]
anonymous_plan: pro
`
	tests := []struct {
		name, give string
		want       string // "" for valid
	}{
		{"unit alone", `calendar: month`, ""},
		{"billing day in a zone", `calendar: {every: month, zone: America/New_York, start: "15 00:00"}`, ""},
		{"ISO week", `calendar: {every: week, zone: Europe/Berlin}`, ""},
		{"the 31st or last", `calendar: {every: month, start: "31 or last"}`, ""},
		{"unknown zone", `calendar: {every: month, zone: America/New_Yrok}`,
			`plans.pro.rules[1]: limiter: invalid rule "monthly": calendar month in America/New_Yrok: unknown time zone "America/New_Yrok"`},
		{"the 31st", `calendar: {every: month, start: "31"}`, `not every month has a 31st: write "31 or last"`},
		{"burst", `calendar: month, burst: 200000`, `plans.pro.rules[1]: limiter: invalid rule "monthly": a calendar rule has no burst`},
		{"sliding window of a month", `calendar: month, algorithm: sliding_window`, `no sliding window of a calendar month`},
		{"period too", `calendar: month, period: 720h`, `a calendar rule has no period`},
		{"unknown field", `calendar: {every: month, zon: UTC}`, `field zon not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			dec := yaml.NewDecoder(bytes.NewReader([]byte(strings.Replace(base, "%s", tt.give, 1))))
			dec.KnownFields(true)
			err := dec.Decode(&c)
			if err == nil {
				err = c.WithDefaults().Validate()
			}
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("load(%s) = %v, want valid", tt.give, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("load(%s) = %v, want an error saying %q", tt.give, err, tt.want)
			}
		})
	}
}

// TestCalendarFleetAcrossMonthEnd: three gateways on one Redis, their
// limiters' clocks 1.5s behind, right and 1.2s ahead, serve a plan of a
// rate beside a monthly quota whose month (January, New York) ends 400ms
// after Redis' now (the calendar Shifted, since Redis' clock cannot be
// set). The quota holds once across the fleet in each month, the full
// quota comes back at the boundary, and the headers count down to it:
// RateLimit's t for the quota is under a second before the boundary and
// February's 28 days after it.
func TestCalendarFleetAcrossMonthEnd(t *testing.T) {
	addr := testenv.RedisAddr(t)
	rdb := newRedisClient(addr)
	t.Cleanup(func() { _ = rdb.Close() })
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	rnow, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	boundary := time.Date(2026, 2, 1, 0, 0, 0, 0, ny)
	shift := boundary.Sub(rnow.Add(400 * time.Millisecond))
	const quota = 30
	cfg := testConfig(newTestUpstream(t).URL)
	cfg.Plans["pro"] = Plan{Rules: []Rule{
		{Rule: limiter.Rule{Name: "per-second", Limit: 500, Period: time.Second, Burst: 20}},
		{Rule: limiter.Rule{Name: "monthly", Limit: quota, Calendar: limiter.MustCalendar(limiter.Month, "America/New_York", "").Shifted(shift)}},
	}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("acme-key"), Plan: "pro"}}
	cfg.StoreDeadline = 2 * time.Second
	prefix := "gwcal" + randHex(6)
	var gws []*testGateway
	for i, skew := range []time.Duration{-1500 * time.Millisecond, 0, 1200 * time.Millisecond} {
		lim, err := limiter.New(newRedisClient(addr), limiter.Config{Prefix: prefix, Now: func() time.Time { return time.Now().Add(skew) }})
		if err != nil {
			t.Fatal(err)
		}
		cfg.GatewayID = fmt.Sprintf("gw%d", i)
		gws = append(gws, startGateway(t, cfg, Options{Store: lim}))
	}
	const feb = 28 * 24 * 3600 // February 2026's length, s
	var mu sync.Mutex
	admitted := map[string]int{} // "january" or "february"
	var bad []string
	var wg sync.WaitGroup
	stop := boundary.Add(-shift).Add(500 * time.Millisecond)
	for w := range 6 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				r := get(t, gws[w%3].URL+"/", "X-API-Key", "acme-key")
				mt, ok := rateLimitT(r.header.Get("RateLimit"), "monthly")
				month := "february"
				switch {
				case !ok:
					mu.Lock()
					bad = append(bad, "no monthly item in RateLimit: "+r.header.Get("RateLimit"))
					mu.Unlock()
					continue
				case mt <= 1:
					month = "january"
				case mt != feb:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("monthly t=%d: neither under a second to the boundary nor February's %d", mt, feb))
					mu.Unlock()
				}
				if want := `"per-second";q=20;w=1, "monthly";q=30;w=2682000`; r.header.Get("RateLimit-Policy") != want {
					mu.Lock()
					bad = append(bad, "RateLimit-Policy "+r.header.Get("RateLimit-Policy")+", want "+want)
					mu.Unlock()
				}
				mu.Lock()
				if r.status == http.StatusOK {
					admitted[month]++
				} else if r.status == http.StatusTooManyRequests && month == "january" && r.retryAfter(t) < 1 {
					bad = append(bad, fmt.Sprintf("429 in January with Retry-After %d", r.retryAfter(t)))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("admitted %v", admitted)
	for _, b := range bad[:min(len(bad), 5)] {
		t.Error(b)
	}
	if admitted["january"] != quota || admitted["february"] != quota {
		t.Errorf("admitted %v, want the quota, %d, in each month", admitted, quota)
	}
}

// rateLimitT is the t parameter of the named item of a RateLimit header.
func rateLimitT(h, name string) (int64, bool) {
	for item := range strings.SplitSeq(h, ",") {
		item = strings.TrimSpace(item)
		if !strings.HasPrefix(item, `"`+name+`";`) {
			continue
		}
		_, t, ok := strings.Cut(item, ";t=")
		n, err := strconv.ParseInt(t, 10, 64)
		return n, ok && err == nil
	}
	return 0, false
}

// TestAdminGrant: on-call grants a key more of its monthly quota through
// the admin API, takes some back, and it is audited as resets are; on
// Redis, Cluster and the in-memory store.
func TestAdminGrant(t *testing.T) {
	for name, mk := range map[string]func(t *testing.T) Options{
		"redis": func(t *testing.T) Options {
			lim, _ := redisStore(t)
			return Options{Store: lim}
		},
		"cluster": func(t *testing.T) Options { return Options{Store: clusterStore(t)} },
		"memory":  func(*testing.T) Options { return Options{} },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := adminConfig(newTestUpstream(t).URL)
			cfg.Plans["pro"] = Plan{Rules: []Rule{
				{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}},
				{Rule: limiter.Rule{Name: "monthly", Limit: 2, Calendar: limiter.MustCalendar(limiter.Month, "America/New_York", "15")}},
			}}
			rig := startAdminOn(t, cfg, mk(t), map[string]Secret{"oncall": testAdminToken})
			auth := []string{"Authorization", "Bearer " + testAdminToken}
			send := func() int { return get(t, rig.gw.URL+"/", "X-API-Key", rawAPIKey).status }
			for i, want := range []int{200, 200, 429} {
				if got := send(); got != want {
					t.Fatalf("request %d = %d, want %d", i, got, want)
				}
			}
			grant := func(units string) grantView {
				t.Helper()
				resp := rig.call(t, http.MethodPost, "grant?api_key=alice&rule=monthly&units="+units, auth...)
				if resp.status != http.StatusOK {
					t.Fatalf("grant %s = %d %s", units, resp.status, resp.body)
				}
				var v grantView
				resp.json(t, &v)
				return v
			}
			v := grant("3")
			if len(v.Grants) != 1 || v.Grants[0].Granted != 3 || v.Grants[0].Remaining != 3 || v.Grants[0].Count != 2 {
				t.Fatalf("grant 3 = %+v, want 3 granted, 2 counted, 3 remaining", v)
			}
			// (JSON keeps the zone's offset, not its name)
			if g := v.Grants[0]; g.WindowStart.Day() != 15 || g.WindowEnd.Day() != 15 || g.WindowStart.Hour() != 0 || !g.WindowEnd.After(time.Now()) {
				t.Errorf("grant window [%v, %v), want from the 15th to the 15th, midnight in New York, holding now", g.WindowStart, g.WindowEnd)
			}
			if v := grant("-1"); v.Grants[0].Granted != 2 || v.Grants[0].Remaining != 2 {
				t.Errorf("take back 1 = %+v, want 2 granted, 2 remaining", v.Grants[0])
			}
			// Waiting for the cached denial is not needed: the grant's own
			// gateway forgot it.
			for i, want := range []int{200, 200, 429} {
				if got := send(); got != want {
					t.Errorf("after the grant, request %d = %d, want %d", i, got, want)
				}
			}
			sv := rig.show(t, "api_key=alice")
			if rv := rulesOf(t, sv, "plan", "")[1]; rv.Granted != 2 || rv.Count != 4 || rv.Remaining != 0 || rv.WindowEnd == nil {
				t.Errorf("show monthly = %+v, want 2 granted, 4 counted, 0 remaining, a window", rv)
			}
			for _, give := range []string{"grant?api_key=alice&rule=minute&units=5", "grant?api_key=alice&rule=monthly&units=0", "grant?api_key=alice&rule=monthly", "reset?api_key=alice&rule=monthly"} {
				if resp := rig.call(t, http.MethodPost, give, auth...); resp.status != http.StatusBadRequest {
					t.Errorf("POST %s = %d %s, want 400", give, resp.status, resp.body)
				}
			}
			logs := rig.log.String()
			for _, want := range []string{`"msg":"admin key grant"`, `"actor":"oncall"`, `"rule":"monthly"`, `"units":3`, `"units":-1`, `"granted":2`} {
				if !strings.Contains(logs, want) {
					t.Errorf("log lacks %s:\n%s", want, logs)
				}
			}
			rig.pub.mu.Lock()
			defer rig.pub.mu.Unlock()
			var audits []event.Decision
			for _, e := range rig.pub.events {
				if e.Mode == event.ModeAdmin {
					audits = append(audits, e)
				}
			}
			if len(audits) != 2 || audits[0].Admin != (event.AdminAction{Action: "grant", Actor: "oncall"}) ||
				audits[0].BindingRule != "monthly" || audits[0].Limit != 5 || audits[1].Limit != 4 || audits[0].Cost != 0 {
				t.Errorf("admin records %+v, want two grants of monthly, limit 5 then 4, costing nothing", audits)
			}
		})
	}
}

// TestCalendarHeadersNearBoundary: the headers docs/configuration.md
// shows for a monthly quota near January's end in New York.
func TestCalendarHeadersNearBoundary(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Date(2026, 1, 31, 23, 59, 58, 0, ny)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	set := func(t time.Time) {
		mu.Lock()
		defer mu.Unlock()
		now = t
	}
	store := limiter.NewMemory(clock, 0)
	monthly := limiter.Rule{Name: "monthly", Limit: 100000, Calendar: limiter.MustCalendar(limiter.Month, "America/New_York", "")}
	cfg := testConfig(newTestUpstream(t).URL)
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "per-second", Limit: 5, Period: time.Second}}, {Rule: monthly}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("acme-key"), Plan: "pro"}}
	gw := startGateway(t, cfg, Options{Store: store, Now: clock})
	key := gw.st.Load().keyByID("acme").identity().key
	if d, err := store.Allow(context.Background(), key, []limiter.Rule{monthly}, 99998); err != nil || !d.Allowed {
		t.Fatalf("using 99,998 of January: %+v, %v", d, err)
	}
	check := func(at time.Time, status int, want map[string]string) {
		t.Helper()
		set(at)
		r := get(t, gw.URL+"/", "X-API-Key", "acme-key")
		if r.status != status {
			t.Errorf("%v: status %d, want %d", at, r.status, status)
		}
		for h, v := range want {
			if got := r.header.Get(h); got != v {
				t.Errorf("%v: %s: %s, want %s", at, h, got, v)
			}
		}
	}
	check(time.Date(2026, 1, 31, 23, 59, 58, 0, ny), 200, map[string]string{
		"RateLimit-Policy":      `"per-second";q=5;w=1, "monthly";q=100000;w=2682000`,
		"RateLimit":             `"per-second";r=4;t=1, "monthly";r=1;t=2`,
		"X-RateLimit-Limit":     "100000",
		"X-RateLimit-Remaining": "1",
		"X-RateLimit-Reset":     "2",
	})
	check(time.Date(2026, 1, 31, 23, 59, 59, 0, ny), 200, nil)
	check(time.Date(2026, 1, 31, 23, 59, 59, 5e8, ny), 429, map[string]string{"Retry-After": "1"})
	check(time.Date(2026, 2, 1, 0, 0, 0, 2e8, ny), 200, map[string]string{
		"RateLimit":             `"per-second";r=4;t=1, "monthly";r=99999;t=2419200`,
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "4",
		"X-RateLimit-Reset":     "1",
	})
}
