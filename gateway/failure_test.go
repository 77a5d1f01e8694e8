package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

const (
	// testDeadline is short against a hung store, yet long enough that a
	// live Redis under -race on two busy cores rarely misses it.
	testDeadline = 250 * time.Millisecond
	// margin is generous for -race on two busy cores, yet far below the
	// seconds go-redis would wait on its own (3s read, 5s dial timeouts).
	margin = time.Second
)

// timedGet sends one request as client ip (via a trusted proxy) and
// reports how long it took.
func timedGet(t testing.TB, gw *testGateway, ip string) (reply, time.Duration) {
	t.Helper()
	start := time.Now()
	r := get(t, gw.URL+"/", "X-Forwarded-For", ip)
	return r, time.Since(start)
}

// TestRedisStoppedMidRun stops a private Redis under three gateways, one
// per failure policy, and starts it again.
func TestRedisStoppedMidRun(t *testing.T) {
	srv := testenv.Private(t, "redis")
	addr := srv.Get(t, "EDGELIMIT_REDIS_ADDR")
	up := newTestUpstream(t)

	policies := []FailurePolicy{FailOpen, FailClosed, FailLocal}
	gws := map[FailurePolicy]*testGateway{}
	for _, pol := range policies {
		cfg := testConfig(up.URL)
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 10, Period: time.Minute}}}}
		cfg.FailurePolicy = pol
		cfg.StoreDeadline = testDeadline
		cfg.Breaker = BreakerConfig{Failures: 3, Open: 200 * time.Millisecond}
		cfg.ExpectedGateways = 2
		cfg.TrustedProxies = []string{"127.0.0.1"}
		cfg.ReadyRequiresStore = pol == FailClosed
		// Default go-redis timeouts: the gateway's deadline must bound the
		// wait, not the client's.
		rdb := newRedisClient(addr)
		lim := storeOn(t, rdb, "fail-"+string(pol))
		ping := func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
		gws[pol] = startGateway(t, cfg, Options{Store: lim, Ping: ping})
		if err := gws[pol].WarmUp(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	// Redis up: enforced. Each phase uses a client of its own, since the
	// limiter's deny cache rightly remembers earlier denials.
	for _, pol := range policies {
		for i := range 11 {
			r, _ := timedGet(t, gws[pol], "192.0.2.1")
			if want := i < 10; (r.status == http.StatusOK) != want {
				t.Fatalf("%s, Redis up, request %d: status %d", pol, i, r.status)
			}
		}
		if err := gws[pol].Ready(t.Context()); err != nil {
			t.Errorf("%s: not ready with Redis up: %v", pol, err)
		}
	}

	srv.Halt(t)
	for _, pol := range policies {
		gw := gws[pol]
		var statuses []int
		var slowest time.Duration
		for range 12 {
			r, took := timedGet(t, gw, "192.0.2.2")
			slowest = max(slowest, took)
			statuses = append(statuses, r.status)
			switch pol {
			case FailOpen:
				if r.header.Get("RateLimit-Policy") != `"minute";q=10;w=60` || r.header.Get("X-RateLimit-Remaining") != "" {
					t.Errorf("open: headers %v: want the policy, and no remaining (unknown)", r.header)
				}
			case FailClosed:
				if r.status == http.StatusServiceUnavailable {
					var p problem
					r.json(t, &p)
					if r.retryAfter(t) < 1 || p.Type != probUnavailable {
						t.Errorf("closed: Retry-After %q, problem %+v", r.header.Get("Retry-After"), p)
					}
				}
			case FailLocal:
				if got := r.header.Get("X-RateLimit-Limit"); got != "5" {
					t.Errorf("local: X-RateLimit-Limit %q, want this gateway's share 5", got)
				}
			}
		}
		want := map[FailurePolicy]string{
			FailOpen:   "[200 200 200 200 200 200 200 200 200 200 200 200]",
			FailClosed: "[503 503 503 503 503 503 503 503 503 503 503 503]",
			FailLocal:  "[200 200 200 200 200 429 429 429 429 429 429 429]",
		}[pol]
		if got := fmt.Sprint(statuses); got != want {
			t.Errorf("%s, Redis stopped: statuses %s, want %s", pol, got, want)
		}
		if slowest > testDeadline+margin {
			t.Errorf("%s, Redis stopped: a request took %v, more than the store deadline %v + %v", pol, slowest, testDeadline, margin)
		}
		// Only the gateway that asks for it leaves its load balancer: the
		// others' policies answer, which readiness must not defeat.
		if err := gw.Ready(t.Context()); (err == nil) == gw.st.Load().cfg.ReadyRequiresStore {
			t.Errorf("%s (ready_requires_store %v): Ready with Redis stopped = %v", pol, gw.st.Load().cfg.ReadyRequiresStore, err)
		}
		m := gw.m
		if n := counter(t, m.storeUnavailable.WithLabelValues("error")) + counter(t, m.storeUnavailable.WithLabelValues("timeout")); n < 3 {
			t.Errorf("%s: store_unavailable{error|timeout} = %v, want ≥ 3", pol, n)
		}
		if n := counter(t, m.storeUnavailable.WithLabelValues("circuit_open")); n < 1 {
			t.Errorf("%s: the breaker never opened (circuit_open %v)", pol, n)
		}
		if n := counter(t, m.circuitOpens); n < 1 {
			t.Errorf("%s: circuit_opens_total = %v", pol, n)
		}
		switch pol {
		case FailOpen:
			if n := counter(t, m.failOpen); n != 12 {
				t.Errorf("fail_open_total = %v, want 12", n)
			}
		case FailClosed:
			if n := counter(t, m.failClosed); n != 12 {
				t.Errorf("fail_closed_total = %v, want 12", n)
			}
		case FailLocal:
			if n := counter(t, m.decisions.WithLabelValues("denied", "minute", "local_fallback")); n != 7 {
				t.Errorf("local_fallback denials = %v, want 7", n)
			}
		}
	}

	srv.Resume(t)
	for _, pol := range policies {
		gw := gws[pol]
		// Enforcement resumes by itself: the breaker probes, and the
		// shared store's full limit is back in the headers.
		testenv.WaitFor(t, 10*time.Second, string(pol)+" to use Redis again", func() bool {
			r, took := timedGet(t, gw, "192.0.2.3")
			if took > testDeadline+margin {
				t.Errorf("%s, Redis back: a request took %v", pol, took)
			}
			return r.status == http.StatusOK && r.header.Get("X-RateLimit-Limit") == "10"
		})
		if c := gw.breaker.current(); c != circuitClosed {
			t.Errorf("%s: circuit %v after recovery", pol, c)
		}
		if got := counter(t, gw.m.circuitState); got != 0 {
			t.Errorf("%s: circuit_state gauge %v, want 0", pol, got)
		}
		denied := false
		for range 10 {
			if r, _ := timedGet(t, gw, "192.0.2.3"); r.status == http.StatusTooManyRequests {
				denied = r.header.Get("X-RateLimit-Limit") == "10"
				break
			}
		}
		if !denied {
			t.Errorf("%s: no enforced 429 after Redis returned", pol)
		}
	}
}

// TestStoreHangs points the gateway at a "Redis" that accepts connections
// and never answers: every request still returns within the deadline, the
// first few as timeouts, the rest at once through the open breaker.
func TestStoreHangs(t *testing.T) {
	lim := storeOn(t, newRedisClient(testenv.Serve(t, nil)), "")
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.StoreDeadline = testDeadline
	cfg.Breaker = BreakerConfig{Failures: 3, Open: time.Hour}
	gw := startGateway(t, cfg, Options{Store: lim})

	for i := range 20 {
		r, took := timedGet(t, gw, "")
		if r.status != http.StatusOK {
			t.Errorf("request %d: status %d, want 200 (fail open)", i, r.status)
		}
		if took > testDeadline+margin {
			t.Errorf("request %d took %v, more than the store deadline %v + %v", i, took, testDeadline, margin)
		}
	}
	if n := counter(t, gw.m.storeUnavailable.WithLabelValues("timeout")); n != 3 {
		t.Errorf("store_unavailable{timeout} = %v, want 3 (then the breaker opens)", n)
	}
	if n := counter(t, gw.m.storeUnavailable.WithLabelValues("circuit_open")); n != 17 {
		t.Errorf("store_unavailable{circuit_open} = %v, want 17", n)
	}
	if n := counter(t, gw.m.circuitState); n != float64(circuitOpen) {
		t.Errorf("circuit_state = %v, want open", n)
	}
	if m := scrape(t, gw); !strings.Contains(m, `edgelimit_gateway_check_duration_seconds_count{status="timeout",store="shared"} 3`) {
		t.Errorf("check latency of timeouts not recorded")
	}
}

// migratingStore answers every check as limiter.Redis does when a Cluster
// slot is still moving at the deadline.
type migratingStore struct{}

func (migratingStore) Allow(context.Context, string, []limiter.Rule, int64) (limiter.Decision, error) {
	return limiter.Decision{}, fmt.Errorf("run limiter script: %w: TRYAGAIN Multiple keys request during rehashing of slot", limiter.ErrMigrating)
}

// TestMigratingSlotKeepsCircuitClosed: checks refused because their
// Cluster slot is being migrated are answered by the failure policy, but do
// not open the circuit: the store is up, and an open circuit would hand
// every other key of the gateway to the failure policy too.
func TestMigratingSlotKeepsCircuitClosed(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Breaker = BreakerConfig{Failures: 3, Open: time.Hour}
	gw := startGateway(t, cfg, Options{Store: migratingStore{}})
	for i := range 10 {
		if r := get(t, gw.URL+"/"); r.status != http.StatusOK {
			t.Errorf("request %d: status %d, want 200 (fail open)", i, r.status)
		}
	}
	if n := counter(t, gw.m.storeUnavailable.WithLabelValues("migrating")); n != 10 {
		t.Errorf("store_unavailable{migrating} = %v, want 10", n)
	}
	if c := gw.breaker.current(); c != circuitClosed {
		t.Errorf("circuit = %v after 10 checks of a migrating slot, want closed", c)
	}
}
