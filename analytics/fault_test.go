package analytics_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestFaultStaleData (issue 10, row 6): data stops arriving (a stuck
// consumer, a dead-letter loop). A run on the stale data keeps the split
// directive still in force and resolves no alert, with requests = 0 or
// otherwise; the staleness is in the report and the metrics.
func TestFaultStaleData(t *testing.T) {
	conn := mustDatabase(t)
	rdb, prefix := mustRedis(t)
	fleetNow := fleetClock()
	f, _, _ := seededFleet(fleetNow)
	mustInsert(t, conn, f.Rows())

	var mu sync.Mutex
	var posts []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		posts = append(posts, string(b))
		mu.Unlock()
	}))
	defer hook.Close()

	now := fleetNow
	clock := func() time.Time { return now }
	cfg := analytics.Config{
		Hot:    analytics.HotConfig{TTL: 10 * time.Minute},
		Alerts: analytics.AlertConfig{Window: 10 * time.Minute, WebhookURL: hook.URL},
	}.WithDefaults()
	store := limiter.NewDirectiveStore(rdb, prefix)
	det, err := analytics.NewDetector(cfg, analytics.Deps{
		Reader:     analytics.NewReader(conn),
		Directives: store,
		Alerter:    analytics.NewAlerter(cfg.Alerts, nil, clock),
		Now:        clock,
		Log:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rep := det.RunOnce(ctx)
	if len(rep.Errors) > 0 || !rep.SplitsWritten || rep.Freshness.Stale {
		t.Fatalf("fresh run: errors %v, splits written %v, freshness %+v; want a split written on fresh data", rep.Errors, rep.SplitsWritten, rep.Freshness)
	}
	firing := 0
	for _, a := range rep.Alerts {
		if a.Firing {
			firing++
		}
	}
	if firing == 0 {
		t.Fatalf("fresh run fired no alert: %+v", rep.Alerts)
	}

	now = fleetNow.Add(5 * time.Minute) // no data since
	rep = det.RunOnce(ctx)
	t.Logf("stale run: freshness %+v, splits written %v, alerts %d", rep.Freshness, rep.SplitsWritten, len(rep.Alerts))
	if !rep.Freshness.Stale {
		t.Errorf("run 5 minutes after the last data: freshness %+v, want stale", rep.Freshness)
	}
	live, _, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := live.Splits[limiter.DirectiveKey("api_key", "hot-1")]; !ok {
		t.Errorf("split directive of hot-1 gone after a run on stale data; it is valid for %v more", cfg.Hot.TTL-5*time.Minute)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range posts {
		if strings.Contains(p, `"resolved"`) {
			t.Errorf("an alert was posted resolved on stale data: %s", p)
		}
	}
}

// TestFaultUserAgentRotation (issue 10, row 7): one anonymous client rotates
// its User-Agent on every request and drives itself into denials. It is not
// raised 50×: its user agents alone earn at most UserAgentMaxFactor, and its
// denials are no evidence at all.
func TestFaultUserAgentRotation(t *testing.T) {
	conn := mustDatabase(t)
	now := fleetClock()
	var rows []event.Decision
	for i := range 600 {
		rows = append(rows, event.Decision{
			Time: now.Add(-time.Duration(i) * 500 * time.Millisecond), GatewayID: "gw-a",
			KeyID: "192.0.2.50", KeyKind: event.KindIP, ClientIP: "192.0.2.50",
			UserAgentHash: uint64(1000 + i), Route: "/a", Method: "GET", Plan: "anon", BindingRule: "per_minute",
			Allowed: i%2 == 0, Limit: 100,
		})
	}
	mustInsert(t, conn, rows)
	cfg := analytics.Config{}.WithDefaults().NAT
	from, to := now.Add(-cfg.Window), now.Add(time.Minute)
	nats, err := analytics.NewReader(conn).NATIPs(context.Background(), cfg, from, to, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NAT findings: %+v", nats)
	for _, n := range nats {
		if n.Factor > cfg.UserAgentMaxFactor {
			t.Errorf("one client rotating user agents flagged %+v, want a factor of at most %v", n, cfg.UserAgentMaxFactor)
		}
		if n.DistinctUserAgents > 301 {
			t.Errorf("evidence counts %d user agents, want only the allowed requests' (300)", n.DistinctUserAgents)
		}
	}
}
