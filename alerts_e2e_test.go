package edgelimit_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestFailOpenAlert: with real Prometheus and Alertmanager loading the
// shipped rules (deploy/prometheus/alerts.yml, unmodified), stopping Redis
// under load makes the gateway fail open, its metric climbs, and
// EdgelimitFailOpen reaches Alertmanager; with Redis back every alert of
// the gateway resolves. It reports both delays.
func TestFailOpenAlert(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for real alert windows (about two minutes)")
	}
	testenv.PrometheusURL(t) // skip or fail before starting anything
	// It waits out real alert windows, and shares nothing it stops.
	t.Parallel()
	redisSrv := testenv.Private(t, "redis")
	rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Get(t, "EDGELIMIT_REDIS_ADDR"), MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	lim, err := limiter.New(rdb, limiter.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxyConfig(t, "alert-gw")
	cfg.StoreDeadline = 250 * time.Millisecond // -race on busy cores: Redis up must not look down
	cfg.FailurePolicy = gateway.FailOpen
	cfg.Plans = map[string]gateway.Plan{"anon": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "minute", Limit: 100000, Period: time.Minute}}}}}
	cfg.AnonymousPlan = "anon"
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(cfg, gateway.Options{
		Store: lim, Registry: reg,
		Ping:   func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	traffic, admin := serveOn(t, gw.Server()), serveOn(t, &http.Server{Handler: boot.Admin{Registry: reg, Ready: gw.Ready}.Handler(), ReadHeaderTimeout: 5 * time.Second})

	// Prometheus scrapes this gateway (file_sd) and loads the shipped rules.
	rules, err := os.ReadFile("deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("failopen-%d", time.Now().UnixNano())
	testenv.PrometheusFile(t, "rules", name, rules)
	testenv.PrometheusFile(t, "targets", name, []byte(fmt.Sprintf("- targets: [%q]\n", admin)))

	// Steady load, well above the rules' minimum-rate guards.
	testenv.Load(t, 1, 20*time.Millisecond, func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+traffic+"/x", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})

	// The target is up and its series are in before Redis goes away.
	testenv.WaitFor(t, 60*time.Second, "Prometheus scraping the gateway", func() bool {
		return testenv.PrometheusHas(t, fmt.Sprintf("edgelimit_gateway_decisions_total{instance=%q}", admin))
	})
	firing := func() ([]string, error) { return testenv.ActiveAlerts(t, fmt.Sprintf("instance=%q", admin)) }
	if names, err := firing(); err != nil || len(names) != 0 {
		t.Fatalf("alerts active for the gateway before Redis stopped: %v (err %v)", names, err)
	}

	redisSrv.Halt(t)
	halted := time.Now()
	testenv.WaitFor(t, 3*time.Minute, "EdgelimitFailOpen in Alertmanager", func() bool {
		names, _ := firing()
		return slices.Contains(names, "EdgelimitFailOpen")
	})
	names, _ := firing()
	t.Logf("EdgelimitFailOpen reached Alertmanager %.1fs after Redis stopped (active: %v)", time.Since(halted).Seconds(), names)

	redisSrv.Resume(t)
	resumed := time.Now()
	testenv.WaitFor(t, 4*time.Minute, "the gateway's alerts to resolve", func() bool {
		names, err := firing()
		return err == nil && len(names) == 0
	})
	t.Logf("the gateway's alerts resolved %.1fs after Redis returned", time.Since(resumed).Seconds())
}

// proxyConfig starts an upstream that answers "ok" until the test ends,
// and returns the configuration of a gateway named id that proxies every
// path to it on loopback listeners; the caller adds the plans.
func proxyConfig(t *testing.T, id string) gateway.Config {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(upstream.Close)
	return gateway.Config{
		GatewayID:   id,
		Listen:      "127.0.0.1:0",
		AdminListen: "127.0.0.1:0",
		Upstreams:   map[string]gateway.Upstream{"app": {URL: upstream.URL}},
		Routes:      []gateway.Route{{Name: "api", PathPrefix: "/", Upstream: "app"}},
	}
}

// serveOn serves srv on a loopback port until the test ends, and returns
// its address.
func serveOn(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// quietRedis drops go-redis' log lines: every failed dial while a test's
// Redis is down is expected. Set once, in TestMain: the logger is global,
// and tests running in parallel log through it.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietRedis{})
	os.Exit(m.Run())
}
