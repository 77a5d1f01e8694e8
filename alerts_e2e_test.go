package edgelimit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
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
// EdgelimitFailOpen reaches Alertmanager; with Redis back it resolves.
func TestFailOpenAlert(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for real alert windows (about two minutes)")
	}
	promURL, amURL, promDir := testenv.PrometheusURL(t), testenv.AlertmanagerURL(t), testenv.PrometheusDir(t)
	redisSrv := testenv.Private(t, "redis")
	redis.SetLogger(quietRedis{}) // every failed dial while Redis is down is expected
	rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Get(t, "EDGELIMIT_REDIS_ADDR"), MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	lim, err := limiter.New(rdb, limiter.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxyConfig(t, "alert-gw")
	cfg.StoreDeadline = 50 * time.Millisecond
	cfg.FailurePolicy = gateway.FailOpen
	cfg.Plans = map[string]gateway.Plan{"anon": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "minute", Limit: 100000, Period: time.Minute}}}}}
	cfg.AnonymousPlan = "anon"
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(cfg, gateway.Options{Store: lim, Registry: reg, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
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
	writeFile(t, filepath.Join(promDir, "rules", name+".yml"), rules)
	writeFile(t, filepath.Join(promDir, "targets", name+".yml"), []byte(fmt.Sprintf("- targets: [%q]\n", admin)))
	resp, err := http.Post(promURL+"/-/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// Steady load, well above the rules' minimum-rate guards.
	testenv.Load(t, 1, 20*time.Millisecond, func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+traffic+"/x", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})

	firing := func() (bool, error) { return alertActive(amURL, "EdgelimitFailOpen", admin) }
	testenv.WaitFor(t, 60*time.Second, "Prometheus scraping the gateway", func() bool { return scraped(promURL, admin) })
	if on, err := firing(); err != nil || on {
		t.Fatalf("EdgelimitFailOpen active before Redis stopped (err %v)", err)
	}

	redisSrv.Halt(t)
	halted := time.Now()
	testenv.WaitFor(t, 3*time.Minute, "EdgelimitFailOpen in Alertmanager", func() bool { on, _ := firing(); return on })
	t.Logf("EdgelimitFailOpen reached Alertmanager %.1fs after Redis stopped", time.Since(halted).Seconds())

	redisSrv.Resume(t)
	resumed := time.Now()
	testenv.WaitFor(t, 4*time.Minute, "EdgelimitFailOpen to resolve", func() bool { on, err := firing(); return err == nil && !on })
	t.Logf("EdgelimitFailOpen resolved %.1fs after Redis returned", time.Since(resumed).Seconds())
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

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
}

// alertActive reports whether Alertmanager holds an active alert name for
// this gateway instance.
func alertActive(amURL, name, instance string) (bool, error) {
	q := url.Values{"filter": {fmt.Sprintf("alertname=%q", name), fmt.Sprintf("instance=%q", instance)}, "active": {"true"}, "silenced": {"false"}, "inhibited": {"false"}}
	resp, err := http.Get(amURL + "/api/v2/alerts?" + q.Encode())
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var alerts []struct {
		EndsAt time.Time `json:"endsAt"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&alerts); err != nil {
		return false, err
	}
	for _, a := range alerts {
		if a.EndsAt.After(time.Now()) {
			return true, nil
		}
	}
	return false, nil
}

// scraped reports whether Prometheus has a sample from instance.
func scraped(promURL, instance string) bool {
	resp, err := http.Get(promURL + "/api/v1/query?" + url.Values{"query": {fmt.Sprintf("up{instance=%q}", instance)}}.Encode())
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	return json.NewDecoder(resp.Body).Decode(&r) == nil && len(r.Data.Result) > 0
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
