package analytics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestPrometheusAlertsEndToEnd runs deploy/prometheus/alerts.yml in a real
// Prometheus scraping a real gateway under load: Redis stops → the
// gateway fails open → EdgelimitFailOpen reaches the real Alertmanager;
// Redis returns → the alert resolves there. It reports both delays.
func TestPrometheusAlertsEndToEnd(t *testing.T) {
	promURL := testenv.PrometheusURL(t)
	amURL := testenv.AlertmanagerURL(t)
	promDir := testenv.PrometheusDir(t)
	srv := testenv.Private(t, "redis")
	addr := srv.Get(t, "EDGELIMIT_REDIS_ADDR")
	t.Parallel()

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	// go-redis logs every failed dial of the outage; the test reads the
	// gateway's metrics instead.
	redis.SetLogger(quietRedis{})
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	lim, err := limiter.New(rdb, limiter.Config{Prefix: "prom-e2e"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{
		Plans:         map[string]gateway.Plan{"free": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000000, Period: time.Minute}}}}},
		AnonymousPlan: "free",
		Upstreams:     map[string]gateway.Upstream{"app": {URL: up.URL}},
		Routes:        []gateway.Route{{Name: "all", PathPrefix: "/", Upstream: "app"}},
		Listen:        "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		FailurePolicy: gateway.FailOpen,
		StoreDeadline: 250 * time.Millisecond, // -race on busy cores: Redis up must not look down
	}
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(cfg, gateway.Options{
		Store: lim, Registry: reg,
		Ping:   func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	traffic := httptest.NewServer(gw.Handler())
	defer traffic.Close()
	admin := httptest.NewServer(boot.Admin{Registry: reg, Ready: gw.Ready}.Handler())
	defer admin.Close()
	instance := strings.TrimPrefix(admin.URL, "http://")

	// Prometheus scrapes this gateway and evaluates the rules as shipped.
	name := fmt.Sprintf("analytics-e2e-%d", time.Now().UnixNano())
	target := filepath.Join(promDir, "targets", name+".yml")
	rules := filepath.Join(promDir, "rules", name+".yml")
	shipped, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rules, shipped, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte(fmt.Sprintf("- targets: [%q]\n", instance)), 0o644); err != nil {
		t.Fatal(err)
	}
	reload := func() {
		resp, err := http.Post(promURL+"/-/reload", "", nil)
		if err != nil {
			t.Errorf("reload prometheus: %v", err)
			return
		}
		resp.Body.Close()
	}
	t.Cleanup(func() {
		os.Remove(target)
		os.Remove(rules)
		reload()
	})
	reload()

	// Load: 50 requests a second from a few clients until the test ends.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		c := &http.Client{Timeout: 2 * time.Second}
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, traffic.URL+"/x", nil)
			req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1", i%5)
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()

	// The target is up and its series are in before Redis goes away.
	testenv.WaitFor(t, 30*time.Second, "prometheus to scrape the gateway", func() bool {
		return promHas(t, promURL, `edgelimit_gateway_decisions_total{instance="`+instance+`"}`)
	})
	firing := func() []string { return amAlertNames(t, amURL, instance) }
	if f := firing(); len(f) != 0 {
		t.Fatalf("alerts firing for the gateway before the outage: %v", f)
	}

	srv.Halt(t)
	down := time.Now()
	testenv.WaitFor(t, 90*time.Second, "EdgelimitFailOpen in Alertmanager", func() bool {
		return strings.Contains(strings.Join(firing(), ","), "EdgelimitFailOpen")
	})
	t.Logf("Redis stopped → EdgelimitFailOpen in Alertmanager: %.1fs (firing: %v)", time.Since(down).Seconds(), firing())

	srv.Resume(t)
	back := time.Now()
	testenv.WaitFor(t, 150*time.Second, "the alerts to resolve in Alertmanager", func() bool {
		return len(firing()) == 0
	})
	t.Logf("Redis back → alerts resolved in Alertmanager: %.1fs", time.Since(back).Seconds())
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// promHas says whether an instant query returns any series.
func promHas(t *testing.T, promURL, query string) bool {
	t.Helper()
	resp, err := http.Get(promURL + "/api/v1/query?query=" + url.QueryEscape(query))
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

// amAlertNames lists the active alerts in Alertmanager for one gateway
// instance.
func amAlertNames(t *testing.T, amURL, instance string) []string {
	t.Helper()
	resp, err := http.Get(amURL + "/api/v2/alerts?filter=" + url.QueryEscape(`instance="`+instance+`"`))
	if err != nil {
		t.Logf("alertmanager: %v", err)
		return nil
	}
	defer resp.Body.Close()
	var as []struct {
		Labels map[string]string `json:"labels"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&as); err != nil {
		t.Logf("alertmanager: %v", err)
		return nil
	}
	var names []string
	for _, a := range as {
		names = append(names, a.Labels["alertname"])
	}
	return names
}
