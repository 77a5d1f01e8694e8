package analytics_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/analytics/analyticstest"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// mustDatabase creates a ClickHouse database of the test's own, migrated by
// the consumer's migrations, and drops it when the test ends.
func mustDatabase(tb testing.TB) driver.Conn {
	tb.Helper()
	conn, _ := testenv.NewDatabase(tb, testenv.ClickHouseAddr(tb), "analytics_test")
	if err := consumer.Migrate(context.Background(), conn, consumer.Retention{}); err != nil {
		tb.Fatalf("consumer.Migrate: %v", err)
	}
	return conn
}

func mustInsert(tb testing.TB, conn driver.Conn, rows []event.Decision) {
	tb.Helper()
	if err := analyticstest.Insert(context.Background(), conn, rows, consumer.Backfill); err != nil {
		tb.Fatalf("insert %d rows: %v", len(rows), err)
	}
}

// mustRedis connects to the real standalone Redis and gives the test a key
// prefix of its own.
func mustRedis(tb testing.TB) (*redis.Client, string) {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(tb)})
	tb.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("redis ping: %v", err)
	}
	return rdb, fmt.Sprintf("analytics-test-%d-%d", time.Now().UnixNano(), rand.IntN(1000))
}

// apiKey is the gateway's configuration of the API key raw: id on plan,
// stored as its SHA-256.
func apiKey(id, raw, plan string) gateway.APIKey {
	sum := sha256.Sum256([]byte(raw))
	return gateway.APIKey{ID: id, SHA256: hex.EncodeToString(sum[:]), Plan: plan}
}

// serveGateway starts a gateway of cfg and opts that proxies every path to
// an upstream answering "ok", and returns its traffic URL; both stop when
// the test ends.
func serveGateway(tb testing.TB, cfg gateway.Config, opts gateway.Options) string {
	tb.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	tb.Cleanup(up.Close)
	cfg.Upstreams = map[string]gateway.Upstream{"app": {URL: up.URL}}
	cfg.Routes = []gateway.Route{{Name: "api", PathPrefix: "/", Upstream: "app"}}
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	gw, err := gateway.New(cfg, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { gw.Close() })
	s := httptest.NewServer(gw.Handler())
	tb.Cleanup(s.Close)
	return s.URL
}

// fleetClock is a seeded fleet's "now": 30s into the minute before the
// real one, so the current minute is partial, as in production, and
// directive expiries (which Redis enforces on its own clock) lie ahead.
func fleetClock() time.Time {
	return time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Second)
}

// seededFleet is the standard synthetic fleet: 3 gateways, 300 ordinary
// keys over 10 minutes, one hot key (an API key named acme) at 60/s for
// 90s split 3:1:0, a busy
// key under the threshold, three NAT addresses (one an IPv6 /64), a near
// miss, and a fail-open outage on gw-c.
func seededFleet(fleetNow time.Time) (analyticstest.Fleet, []string, []string) {
	f := analyticstest.Fleet{
		Now:        fleetNow,
		Window:     10 * time.Minute,
		Gateways:   []string{"gw-a", "gw-b", "gw-c"},
		Keys:       300,
		PerKeyRate: 0.05,
		Hot: []analyticstest.HotKey{
			{KeyID: "hot-1", Name: "acme", Rate: 60, For: 90 * time.Second, Weights: map[string]float64{"gw-a": 3, "gw-b": 1}},
			{KeyID: "busy-not-hot", Rate: 5, For: 90 * time.Second},
		},
		NAT: []analyticstest.NATAddr{
			{IP: "198.51.100.7", Clients: 25, Requests: 500},
			{IP: "203.0.113.9", Clients: 40, Requests: 800},
			{IP: "2001:db8:aa:1::", Clients: 30, Requests: 600},
			{IP: "198.51.100.8", Clients: 6, Requests: 600}, // near miss: 6 keys, 6 agents
		},
		Outages: []analyticstest.Outage{
			{Gateway: "gw-c", From: fleetNow.Add(-6 * time.Minute).Truncate(time.Minute), For: 2 * time.Minute, Share: 0.6, Mode: event.ModeFailOpen},
		},
		Seed: 42,
	}
	return f, []string{"api_key:hot-1"}, []string{"ip:198.51.100.7", "ip:203.0.113.9", "ip:2001:db8:aa:1::/64"}
}
