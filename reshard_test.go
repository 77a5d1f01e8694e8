package edgelimit_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestClusterReshard moves the hash slot of one busy key from one Cluster
// master to another, as redis-cli --cluster reshard does (SETSLOT
// IMPORTING and MIGRATING, MIGRATE, SETSLOT NODE), while two gateways,
// each on a client of its own with cmd/gateway's tuning, take concurrent
// requests for that key. A reshard is routine: every request must be
// decided by the store (the policy here is closed, so a check the store
// failed would be a 503), and the gateways together must admit the limit
// exactly, no fewer (a check charged twice) and no more.
func TestClusterReshard(t *testing.T) {
	addrs := testenv.RedisClusterAddrs(t)
	link := boot.Redis{ClusterAddrs: addrs}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	prefix := fmt.Sprintf("reshard%x", rand.Uint32())
	const limit = 150
	rule := limiter.Rule{Name: "hour", Limit: limit, Period: time.Hour}

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer upstream.Close()
	var urls []string
	var stores []*limiter.Redis
	for i := range 2 {
		// cmd/gateway's tuning (openStore).
		rdb, err := boot.NewRedis(link, boot.RedisTuning{Timeout: time.Second, MaxRetries: -1, MinIdleConns: 4, ContextTimeout: true}, log)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		// One sender: concurrent checks share pipelines, as under load.
		lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix, Senders: 1, DenyCache: -1})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, lim)
		urls = append(urls, serveGateway(t, gateway.Config{
			GatewayID:     fmt.Sprintf("reshard-%d", i),
			KeyHashSecret: "reshard",
			StoreDeadline: time.Second, // -race on two busy cores; a reshard is no outage
			FailurePolicy: "closed",
			Plans:         map[string]gateway.Plan{"anon": {Rules: []gateway.Rule{{Rule: rule}}}},
			AnonymousPlan: "anon",
			Upstreams:     map[string]gateway.Upstream{"app": {URL: upstream.URL}},
			Routes:        []gateway.Route{{Name: "api", PathPrefix: "/", Upstream: "app"}},
		}, gateway.Options{Store: lim, Logger: log})+"/x")
	}

	// Every request comes from 127.0.0.1: one key, on both gateways.
	start := time.Now()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	var done atomic.Int64
	for i := range 6 {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			for !stop.Load() {
				status := 0
				if resp, err := client.Get(urls[i%2]); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
				done.Add(1)
			}
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	// Some requests first, so the key has its state on the source.
	awaitRequests := func(what string, n int64) {
		t.Helper()
		from := done.Load()
		testenv.WaitFor(t, time.Minute, fmt.Sprintf("%d requests %s", n, what), func() bool { return done.Load() >= from+n })
	}
	awaitRequests("before the reshard", 20)

	cc, err := boot.NewRedis(link, boot.RedisTuning{Timeout: 5 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ip, _ := limiter.IPKey("127.0.0.1")
	key := prefix + ":{" + ip + "}" // the identity's container (limiter's layout)
	slot, err := cc.(*redis.ClusterClient).ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	m := testenv.MigrateSlot(t, cc.(*redis.ClusterClient), slot)
	awaitRequests("while the key is on the source of a migrating slot", 30)
	m.Move(t)
	awaitRequests("while the key is on the target of a migrating slot", 30)
	m.Finish(t)
	awaitRequests("after the reshard", 20)
	stop.Store(true)
	wg.Wait()

	var checks, pipelines int64
	for _, s := range stores {
		st := s.Stats()
		checks, pipelines = checks+st.Checks, pipelines+st.Pipelines
	}
	t.Logf("responses by status: %v; %d checks in %d pipelines", statuses, checks, pipelines)
	if statuses[http.StatusServiceUnavailable] > 0 || statuses[0] > 0 || len(statuses) > 2 {
		t.Errorf("responses by status %v: every request should be decided by the store (200 or 429) through the reshard", statuses)
	}
	// Beside the limit, what the rule refilled while the test ran.
	refill := int(time.Since(start)*limit/rule.Period) + 1
	if got := statuses[http.StatusOK]; got < limit || got > limit+refill {
		t.Errorf("%d requests admitted, want the limit, %d (and at most %d units refilled meanwhile)", got, limit, refill)
	}
	if pipelines >= checks {
		t.Errorf("%d checks in %d pipelines: no pipeline carried several, so the reshard never met a shared one", checks, pipelines)
	}
}
