package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// downStore is a shared store that is always unavailable.
type downStore struct{}

func (downStore) Allow(context.Context, string, []limiter.Rule, int64) (limiter.Decision, error) {
	return limiter.Decision{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
}

// fixedDirectives hands out the same directives always.
type fixedDirectives struct{ d *limiter.Directives }

func (f fixedDirectives) Current() *limiter.Directives { return f.d }

// fakeClock is a settable clock for the breaker and the local store.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// enforceN runs n calls for the API key acme through the enforcement step
// and counts those allowed.
func enforceN(t *testing.T, g *Gateway, n int) int {
	t.Helper()
	st := g.st.Load()
	k := st.lookupKey("acme-raw-key")
	if k == nil {
		t.Fatal("acme key not configured")
	}
	ok := 0
	for range n {
		id := k.identity()
		q := call{id: id, limits: st.limitsFor(id, nil, false), cost: 1, route: "test", method: http.MethodGet}
		v := g.enforce(t.Context(), st, &q)
		if v.err != nil {
			t.Fatal(v.err)
		}
		if v.allowed {
			ok++
		}
	}
	return ok
}

func localConfig(rule limiter.Rule, gateways int) Config {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.GatewayID = "gw-a"
	cfg.KeyHashSecret = "exact-test-secret"
	cfg.FailurePolicy = FailLocal
	cfg.ExpectedGateways = gateways
	cfg.Plans["paid"] = Plan{Rules: []Rule{{Rule: rule}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("acme-raw-key"), Plan: "paid"}}
	return cfg
}

// TestLocalFallbackKeepsSplitShare: with the store down, a gateway under a
// split enforces its split share, not the whole limit (issue 14 row 10:
// share 0.2 of 50/h admitted 50).
func TestLocalFallbackKeepsSplitShare(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	cfg := localConfig(limiter.Rule{Name: "hour", Limit: 50, Period: time.Hour}, 1)
	cfg.SplitMaxPeriod = time.Hour
	g, err := New(cfg, Options{Store: downStore{}, Now: clock.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	keyID := g.keys.id(limiter.APIKeyKey("acme"))
	dirs := &limiter.Directives{Splits: map[string]limiter.SplitDirective{
		limiter.DirectiveKey("api_key", keyID): {Shares: map[string]float64{"gw-a": 0.2, "gw-b": 0.8}, Expires: clock.Now().Add(time.Hour)},
	}}
	g.directives = fixedDirectives{dirs}
	if got := enforceN(t, g, 60); got != 10 {
		t.Errorf("store down, split share 0.2 of 50/h: admitted %d, want 10", got)
	}
}

// TestLocalShareRate: the gateways' local shares together refill no faster
// than the rule (issue 14 row 10: limit 2/min over 5 gateways admitted
// 1/min on each, 5/min in all).
func TestLocalShareRate(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	const gateways = 5
	cfg := localConfig(limiter.Rule{Name: "minute", Limit: 2, Period: time.Minute}, gateways)
	g, err := New(cfg, Options{Store: downStore{}, Now: clock.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 60 * 10 { // 10 minutes, a request a second
		admitted += enforceN(t, g, 1)
		clock.Add(time.Second)
	}
	// One gateway's share: 2 per 5 minutes, plus the one unit every
	// gateway admits at the start of an outage.
	if max := 1 + 10*2/gateways; admitted > max {
		t.Errorf("one of %d gateways admitted %d in 10 min of a 2/min rule, want at most %d", gateways, admitted, max)
	}
	if admitted < 10*2/gateways {
		t.Errorf("one of %d gateways admitted %d in 10 min of a 2/min rule, want at least %d", gateways, admitted, 10*2/gateways)
	}
}

// TestOpenCircuitKeepsCachedDenials: a caller Redis denied stays denied
// while the circuit is open, whatever the failure policy (issue 14 row 11:
// fail-open admitted 20 of 20 while the denial was cached).
func TestOpenCircuitKeepsCachedDenials(t *testing.T) {
	srv := testenv.Private(t, "redis")
	lim := storeOn(t, newRedisClient(srv.Get(t, "EDGELIMIT_REDIS_ADDR")), "opencircuit")
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 2, Period: time.Minute}}}}
	cfg.FailurePolicy = FailOpen
	cfg.StoreDeadline = testDeadline
	cfg.Breaker = BreakerConfig{Failures: 1, Open: time.Minute}
	cfg.TrustedProxies = []string{"127.0.0.1"}
	gw := startGateway(t, cfg, Options{Store: lim})

	for i := range 3 {
		r, _ := timedGet(t, gw, "192.0.2.1")
		if want := i < 2; (r.status == http.StatusOK) != want {
			t.Fatalf("Redis up, request %d: status %d", i, r.status)
		}
	}
	srv.Halt(t)
	// Another caller's request fails and opens the circuit.
	if r, _ := timedGet(t, gw, "192.0.2.2"); r.status != http.StatusOK {
		t.Fatalf("fail open: status %d", r.status)
	}
	if c := gw.breaker.current(); c != circuitOpen {
		t.Fatalf("circuit %v, want open", c)
	}
	admitted := 0
	for range 20 {
		if r, _ := timedGet(t, gw, "192.0.2.1"); r.status == http.StatusOK {
			admitted++
		}
	}
	if admitted != 0 {
		t.Errorf("circuit open: a caller with a cached denial was admitted %d of 20", admitted)
	}
}

// TestDenyCacheFollowsDirectives: a denial the deny cache holds never
// outlives a change of the rules a directive makes; once a NAT directive
// raises an address's limit, the raise is admitted at once (issue 14 row
// 12; with row 7, a raised limit adds its difference).
func TestDenyCacheFollowsDirectives(t *testing.T) {
	ctx := context.Background()
	rig := newDirectiveRig(t)
	up := newTestUpstream(t)
	gw := rig.start(t, testConfig(up.URL)) // 5/min per IP
	if got := admitted(t, gw.URL+"/", 6); got != 5 {
		t.Fatalf("5/min: admitted %d of 6", got)
	}
	if err := rig.store.WriteNATs(ctx, []limiter.NATDirective{{Key: "ip:127.0.0.1", Factor: 3, Clients: 3, Expires: time.Now().Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	rig.watcher.Refresh(ctx)
	if got := admitted(t, gw.URL+"/", 11); got != 10 {
		t.Errorf("NAT raised 5/min to 15/min after 5 were used: admitted %d of 11, want 10", got)
	}
}

// TestDenyCacheAfterNATLapse: a denial cached before a NAT raise does not
// answer once the raise has lapsed. Under the raise the address refilled
// at the raised rate, so Redis admits what the cached denial, made for
// the plan's rules, would still refuse. Before, that denial answered
// until its own retry time (a minute here); now the first directed check
// drops it.
func TestDenyCacheAfterNATLapse(t *testing.T) {
	ctx := context.Background()
	lim, _ := redisStore(t)
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	base := limiter.Rule{Name: "minute", Limit: 1, Period: time.Minute}
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: base}}}
	dirs := &modelDirectives{}
	gw := startGateway(t, cfg, Options{Store: lim, Directives: dirs})
	key := ipKey("127.0.0.1")
	nat := func(expires time.Time) {
		dirs.p.Store(&limiter.Directives{NATs: map[string]limiter.NATDirective{key: {Key: key, Factor: 1000, Clients: 100, Expires: expires}}})
	}

	if got := admitted(t, gw.URL+"/", 2); got != 1 {
		t.Fatalf("1/min: admitted %d of 2", got)
	}
	nat(time.Now().Add(time.Hour)) // 1000/min
	if got := admitted(t, gw.URL+"/", 1); got != 1 {
		t.Fatalf("NAT raise to 1000/min: admitted %d of 1", got)
	}
	// Await the raised bucket's refill to full: 1000 tokens, of which the
	// plan's 1/min keeps one when the raise lapses.
	raised, _ := dirs.Current().NAT(key, []limiter.Rule{base}, time.Now())
	for deadline := time.Now().Add(5 * time.Second); ; {
		s, err := lim.Inspect(ctx, key, raised)
		if err != nil {
			t.Fatal(err)
		}
		if s.Rules[0].Remaining == raised[0].Limit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("raised bucket at %d of %d after 5s", s.Rules[0].Remaining, raised[0].Limit)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis for the refill
	}
	nat(time.Now().Add(-time.Second)) // lapsed
	if got := admitted(t, gw.URL+"/", 3); got != 1 {
		t.Errorf("NAT raise lapsed with the raised bucket full: admitted %d of 3, want 1 (what Redis admits)", got)
	}
}

// splitFleet is a fleet of gateways ids, each expecting the fleet's size
// and checking store, that read their split directives from dirs (nil
// until the test sets them): the acme key's limit, shared as the test's
// splits say. keyID is the acme key's id in a split.
func splitFleet(t *testing.T, store checker, limit int64, ids ...string) (fleet []*Gateway, dirs *fixedDirectives, keyID string) {
	t.Helper()
	dirs = &fixedDirectives{}
	for _, id := range ids {
		cfg := localConfig(limiter.Rule{Name: "hour", Limit: limit, Period: time.Hour}, len(ids))
		cfg.GatewayID = id
		cfg.SplitMaxPeriod = time.Hour
		g, err := New(cfg, Options{Store: store, Directives: dirs, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, g)
	}
	return fleet, dirs, fleet[0].keys.id(limiter.APIKeyKey("acme"))
}

// reserveFleet is three gateways under one split of the acme key's 10/h:
// half to gw-a, half reserved for the gateways the split does not name
// (gw-b and gw-c), which must check one bucket together; all check store.
func reserveFleet(t *testing.T, store checker) []*Gateway {
	t.Helper()
	fleet, dirs, keyID := splitFleet(t, store, 10, "gw-a", "gw-b", "gw-c")
	dirs.d = &limiter.Directives{Splits: map[string]limiter.SplitDirective{
		limiter.DirectiveKey("api_key", keyID): {Shares: map[string]float64{"gw-a": 0.5, limiter.OtherGateways: 0.5}, Expires: time.Now().Add(time.Hour)},
	}}
	return fleet
}

// TestSplitReserve: the gateways a split does not name share its reserve.
// With the store up they check it in one bucket ({key/gw:*}), so the fleet
// admits the rule, not the reserve once per unnamed gateway (found by
// TestGatewayModel: two unnamed gateways each checked a bucket of their
// own, 15 of a 10/h rule). With the store down an unnamed gateway enforces
// its local share of the reserve, not the whole reserve, so the unnamed
// gateways together stay within it but for the local policy's rounding
// (capacity at least 1 each).
func TestSplitReserve(t *testing.T) {
	tests := []struct {
		name  string
		store func(t *testing.T) checker
		want  int
	}{
		{"store up: one reserve bucket", func(t *testing.T) checker { lim, _ := redisStore(t); return lim }, 10},
		// gw-a its 5; gw-b and gw-c each ⌊5/3⌋ = 1 of the reserve.
		{"store down: local shares of the reserve", func(*testing.T) checker { return downStore{} }, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			admitted := 0
			for _, g := range reserveFleet(t, tt.store(t)) {
				admitted += enforceN(t, g, 10)
			}
			if admitted != tt.want {
				t.Errorf("split 10/h half to gw-a, half reserved for gw-b and gw-c: fleet admitted %d, want %d", admitted, tt.want)
			}
		})
	}
}

// TestSplitResizeMintsNothing: two saturated gateways whose split shares
// of the acme key's 100/h swap back and forth every round admit, over the
// run, one capacity and the refill, never more: a share that grows keeps
// the tokens it had. Before: each round's grown share got the 15 units
// the other gateway's bucket had already spent, 15 per round.
func TestSplitResizeMintsNothing(t *testing.T) {
	lim, _ := redisStore(t)
	const limit = 100
	fleet, dirs, keyID := splitFleet(t, lim, limit, "gw-a", "gw-b")
	start := time.Now()
	admitted := 0
	const rounds = 8
	for i := range rounds {
		a := []float64{0.5, 0.65, 0.35}[i%3]
		dirs.d = &limiter.Directives{Version: int64(i + 1), Splits: map[string]limiter.SplitDirective{
			limiter.DirectiveKey("api_key", keyID): {Shares: map[string]float64{"gw-a": a, "gw-b": 1 - a}, Expires: time.Now().Add(time.Hour)},
		}}
		// Saturated: each gateway asks for more than the whole limit.
		for _, g := range fleet {
			admitted += enforceN(t, g, limit+1)
		}
	}
	// One capacity, and the refill of the run rounded up (under a unit
	// unless the run takes 36s).
	want := limit + int(time.Since(start)*limit/time.Hour) + 1
	t.Logf("admitted %d over %d resizes, bound %d", admitted, rounds, want)
	if admitted > want {
		t.Errorf("split of %d/h resized %d times between saturated gateways: admitted %d, want at most %d", limit, rounds, admitted, want)
	}
	if admitted < limit {
		t.Errorf("split of %d/h: admitted %d, want at least the capacity %d", limit, admitted, limit)
	}
}
