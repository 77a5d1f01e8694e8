package edgelimit_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// storeCall is one limiter call as the gateway made it.
type storeCall struct {
	start time.Time
	took  time.Duration
	ok    bool
}

// recordingStore is the gateway's *limiter.Redis, every store call
// recorded: Allow, and AllowUncachedWithin, which the gateway calls after asking
// the deny cache itself. Embedding keeps the cache (CachedDenial) visible.
type recordingStore struct {
	*limiter.Redis
	mu    sync.Mutex
	calls []storeCall
}

func (s *recordingStore) Allow(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	return s.record(ctx, key, rules, cost, s.Redis.Allow)
}

func (s *recordingStore) AllowUncachedWithin(ctx context.Context, within time.Duration, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	return s.record(ctx, key, rules, cost, func(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
		return s.Redis.AllowUncachedWithin(ctx, within, key, rules, cost)
	})
}

func (s *recordingStore) record(ctx context.Context, key string, rules []limiter.Rule, cost int64,
	call func(context.Context, string, []limiter.Rule, int64) (limiter.Decision, error)) (limiter.Decision, error) {
	start := time.Now()
	d, err := call(ctx, key, rules, cost)
	s.mu.Lock()
	s.calls = append(s.calls, storeCall{start: start, took: time.Since(start), ok: err == nil})
	s.mu.Unlock()
	return d, err
}

// TestSentinelFailover kills the Redis primary (SIGKILL) under load: a
// gateway on Sentinel (the gateway's own client tuning, through
// boot.NewRedis) keeps answering through its failure policy (open), no
// store call waits for the failover, and the gateway follows the promoted
// replica by itself. The figures (seconds without the store, slowest
// store call, writes lost) are logged: they are the report, not
// assertions.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and three Sentinels")
	}
	t.Parallel()
	ha := testenv.Private(t, "redis-ha")
	link := boot.Redis{
		SentinelAddrs:  strings.Split(ha.Get(t, "EDGELIMIT_REDIS_SENTINEL_ADDRS"), ","),
		SentinelMaster: ha.Get(t, "EDGELIMIT_REDIS_SENTINEL_MASTER"),
	}
	primary, replica := ha.Get(t, "EDGELIMIT_TEST_REDIS_PRIMARY_ADDR"), ha.Get(t, "EDGELIMIT_TEST_REDIS_REPLICA_ADDR")
	failover(t, link, "failover:{writes}", func(redis.UniversalClient) (string, time.Time) {
		at := time.Now()
		ha.Halt(t)
		return "primary " + primary, at
	})
	// The replica is the master now.
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	if role, err := rc.Do(context.Background(), "ROLE").Slice(); err != nil || len(role) == 0 || role[0] != "master" {
		t.Errorf("replica ROLE = %v, %v; want master after the failover", role, err)
	}
}

// TestClusterFailover is TestSentinelFailover for a Redis Cluster: the
// master holding the gateway's keys is killed and its replica takes over.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster of three masters and three replicas")
	}
	t.Parallel()
	ha := testenv.Private(t, "redis-cluster-ha")
	link := boot.Redis{ClusterAddrs: strings.Split(ha.Get(t, "EDGELIMIT_REDIS_CLUSTER_ADDRS"), ",")}
	// The writes' set shares the hash slot of the gateway's one key ("").
	failover(t, link, "", func(rdb redis.UniversalClient) (string, time.Time) {
		cc := rdb.(*redis.ClusterClient)
		ctx := context.Background()
		var victim *redis.Client
		var pid int
		var addr string
		var mu sync.Mutex
		cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, "failover*").Result()
			if err != nil || len(keys) == 0 {
				return err
			}
			info, err := c.Info(ctx, "server").Result()
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			victim, addr = c, c.Options().Addr
			for _, line := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
					pid, _ = strconv.Atoi(v)
				}
			}
			return nil
		})
		if victim == nil || pid == 0 {
			t.Fatalf("no master holds the gateway's keys")
		}
		// The node is this test's own (started by Private): a crash.
		at := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return "master " + addr, at
	})
}

// failover runs a gateway on link under load, calls kill (after a second
// of it; kill says what it killed and when) and measures until the store
// has answered for a second again.
// writes is the key of the set that measures lost writes; "": one in the
// hash slot of the gateway's keys.
func failover(t *testing.T, link boot.Redis, writes string, kill func(redis.UniversalClient) (what string, at time.Time)) {
	t.Helper()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	// cmd/gateway's tuning (openStore): no retries, a 1s socket bound,
	// context deadlines on the socket.
	rdb, err := boot.NewRedis(link, boot.RedisTuning{Timeout: time.Second, MaxRetries: -1, MinIdleConns: 4, ContextTimeout: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := boot.PingRedis(context.Background(), rdb, link); err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(rdb, limiter.Config{Prefix: "failover"})
	if err != nil {
		t.Fatal(err)
	}
	store := &recordingStore{Redis: lim}

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer upstream.Close()
	// 100ms: a store deadline of milliseconds that -race on two shared
	// cores still meets when Redis is up.
	const deadline = 100 * time.Millisecond
	url := serveGateway(t, gateway.Config{
		GatewayID:     "failover-gw",
		KeyHashSecret: "failover",
		StoreDeadline: deadline,
		FailurePolicy: "open",
		Plans:         map[string]gateway.Plan{"anon": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1_000_000, Period: time.Minute}}}}},
		AnonymousPlan: "anon",
		Upstreams:     map[string]gateway.Upstream{"app": {URL: upstream.URL}},
		Routes:        []gateway.Route{{Name: "api", PathPrefix: "/", Upstream: "app"}},
	}, gateway.Options{Store: store, Logger: log})

	// Load: a few clients, each request after the last.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var requests, non200 atomic.Int64
	for range 4 {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			for !stop.Load() {
				resp, err := client.Get(url + "/x")
				requests.Add(1)
				if err != nil {
					non200.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					non200.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second)

	// Asynchronous replication loses the writes the primary acknowledged
	// but had not sent to the replica when it died. Every limiter check is
	// one such write (one EVALSHA), so writes beside them, one after
	// another on the same client and in the same hash slot, measure how
	// many checks' consumption a failover forgets: over-admission, in
	// requests. Each write adds its own member to a set, so a write whose
	// answer was lost (it may have happened) does not blur the count.
	if writes == "" {
		writes = "failover-writes:" + gatewayTag(t, rdb)
	}
	var acked []any
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			if rdb.SAdd(ctx, writes, i).Err() == nil {
				acked = append(acked, i)
			}
			cancel()
		}
	})
	time.Sleep(500 * time.Millisecond)
	what, killed := kill(rdb)

	// Wait until the store has answered for a second after a failure, or
	// give up after 30s.
	recovered := func() (failed bool, back time.Time) {
		store.mu.Lock()
		defer store.mu.Unlock()
		var lastFail time.Time
		for _, c := range store.calls {
			if c.start.After(killed) && !c.ok {
				failed, lastFail = true, c.start
			}
		}
		for _, c := range store.calls {
			if c.ok && c.start.After(lastFail) && c.start.After(killed) {
				return failed, c.start
			}
		}
		return failed, time.Time{}
	}
	var back time.Time
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if failed, b := recovered(); failed && !b.IsZero() && time.Since(b) > time.Second {
			back = b
			break
		}
	}
	stop.Store(true)
	wg.Wait()

	store.mu.Lock()
	calls := slices.Clone(store.calls)
	store.mu.Unlock()
	var slowest time.Duration
	var during, failedDuring, overDeadline int
	for _, c := range calls {
		slowest = max(slowest, c.took)
		if c.took > deadline+50*time.Millisecond {
			overDeadline++
		}
		if c.start.After(killed) && (back.IsZero() || c.start.Before(back)) {
			during++
			if !c.ok {
				failedDuring++
			}
		}
	}
	if back.IsZero() {
		t.Fatalf("the gateway did not follow the promoted replica within 30s of killing the %s (%d store calls after the kill)", what, during)
	}
	t.Logf("%s killed; the store answered again after %.2fs (%d calls in the gap, %d failed and were covered by fail-open); "+
		"%d requests in all, slowest store call %v (deadline %v), %d calls over deadline+50ms",
		what, back.Sub(killed).Seconds(), during, failedDuring, requests.Load(), slowest.Round(time.Millisecond), deadline, overDeadline)

	have, err := rdb.SMIsMember(context.Background(), writes, acked...).Result()
	if err != nil {
		t.Fatalf("read the writes on the new master: %v", err)
	}
	lost := 0
	for _, ok := range have {
		if !ok {
			lost++
		}
	}
	t.Logf("asynchronous replication: %d acknowledged writes, %d of them lost with the %s (the over-admission a failover allows, in checks)", len(acked), lost, what)

	if n := non200.Load(); n != 0 {
		t.Errorf("%d of %d requests did not get a 200; the open failure policy should cover the failover", n, requests.Load())
	}
	// A coarse bound, not a timing assertion: a call that waited for the
	// failover (seconds) or the 1s socket timeout is a bug; the figure
	// above is the measurement.
	if slowest >= time.Second {
		t.Errorf("a store call took %v: requests waited past the store deadline (%v) for the failover", slowest, deadline)
	}
}

// gatewayTag is the hash tag ("{...}") of the gateway's limiter keys, the
// only ones under the prefix "failover".
func gatewayTag(t *testing.T, rdb redis.UniversalClient) string {
	t.Helper()
	var keys []string
	var mu sync.Mutex
	scan := func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, "failover:*").Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(context.Background(), scan)
	} else {
		keys, err = rdb.Keys(context.Background(), "failover:*").Result()
	}
	if err != nil || len(keys) == 0 {
		t.Fatalf("the gateway's keys: %v, %v", keys, err)
	}
	i, j := strings.Index(keys[0], "{"), strings.Index(keys[0], "}")
	if i < 0 || j < i {
		t.Fatalf("key %q has no hash tag", keys[0])
	}
	return keys[0][i : j+1]
}

// serveGateway serves a gateway of cfg and opts on a loopback port until
// the test ends, and returns its base URL.
func serveGateway(t *testing.T, cfg gateway.Config, opts gateway.Options) string {
	t.Helper()
	gw, err := gateway.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := gw.Server()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

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
