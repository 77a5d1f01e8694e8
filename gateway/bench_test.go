package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

const benchKeys = 100_000

// benchConfig has the 3-rule plan of the benchmark; hot keys get
// limits no run reaches, so every request goes to the store.
func benchConfig(upstream string) Config {
	return Config{
		Plans: map[string]Plan{
			"bench": {Rules: []Rule{
				{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}},
				{Rule: limiter.Rule{Name: "hour", Limit: 5000, Period: time.Hour}},
				{Rule: limiter.Rule{Name: "day", Limit: 50000, Period: 24 * time.Hour}},
			}},
			"hot": {Rules: []Rule{
				{Rule: limiter.Rule{Name: "minute", Limit: 1 << 31, Period: time.Minute}},
				{Rule: limiter.Rule{Name: "hour", Limit: 1 << 31, Period: time.Hour}},
				{Rule: limiter.Rule{Name: "day", Limit: 1 << 31, Period: 24 * time.Hour}},
			}},
		},
		AnonymousPlan:  "bench",
		APIKeys:        []APIKey{{ID: "hot", SHA256: sha("hot-key"), Plan: "hot"}},
		TrustedProxies: []string{"127.0.0.1"},
		Upstreams:      map[string]Upstream{"app": {URL: upstream}},
		Routes: []Route{
			{Name: "limited", PathPrefix: "/", Upstream: "app"},
			{Name: "off", PathPrefix: "/off", Upstream: "app", Exempt: true},
		},
		// A closed-loop benchmark saturates both cores, and then a Redis
		// call now and then waits tens of milliseconds for a CPU; failing
		// open would make the limiter look cheaper than it is.
		StoreDeadline: time.Second,
	}
}

func benchIPs() []string {
	ips := make([]string, benchKeys)
	for i := range ips {
		ips[i] = fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
	}
	return ips
}

func benchRedis(b *testing.B) checker {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b), ContextTimeoutEnabled: true, PoolSize: 64})
	lim := storeOn(b, rdb, "gwbench"+randHex(4))
	if err := lim.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	return lim
}

// latencies collects durations from parallel goroutines.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d ...time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d...)
	l.mu.Unlock()
}

// take returns the durations collected so far, and starts afresh.
func (l *latencies) take() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	all := l.all
	l.all = nil
	return all
}

// report takes the durations and reports their median and 99th
// percentile as metrics named with prefix.
func (l *latencies) report(b *testing.B, prefix string) {
	all := l.take()
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), prefix+"p50-µs")
	b.ReportMetric(q(0.99), prefix+"p99-µs")
}

// BenchmarkGateway sends requests through a started gateway to a trivial
// upstream over loopback HTTP: the limiter off (an exempt route), the
// in-memory store, and Redis with 100k random keys or one hot key.
func BenchmarkGateway(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	b.Cleanup(up.Close)
	ips := benchIPs()
	cases := []struct {
		name   string
		store  func(*testing.B) checker
		path   string
		hot    bool
		events bool
	}{
		{"limiter=off", nil, "/off", false, false},
		{"limiter=memory/keys=random", nil, "/", false, false},
		{"limiter=redis/keys=random", benchRedis, "/", false, false},
		{"limiter=redis/keys=random/events=kafka", benchRedis, "/", false, true},
		{"limiter=redis/keys=hot", benchRedis, "/", true, false},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			var opts Options
			if bc.store != nil {
				opts.Store = bc.store(b)
			}
			if bc.events {
				opts.Publisher = benchPublisher(b)
			}
			gw := startGateway(b, benchConfig(up.URL), opts)
			cl := benchClient(b)
			measure(b, func() error { return benchGet(cl, gw.URL+bc.path, bc.hot, ips) })
			if n := counter(b, gw.m.failOpen); n > 0 {
				b.Errorf("%v requests failed open (store deadline missed)", n)
			}
		})
	}
}

// BenchmarkCheck measures the limit check alone, in process: identify,
// one limiter call, the verdict; no HTTP.
func BenchmarkCheck(b *testing.B) {
	ips := benchIPs()
	for _, bc := range []struct {
		name  string
		store func(*testing.B) checker
		hot   bool
	}{
		{"store=memory/keys=random", nil, false},
		{"store=redis/keys=random", benchRedis, false},
		{"store=redis/keys=hot", benchRedis, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var opts Options
			if bc.store != nil {
				opts.Store = bc.store(b)
			}
			gw := startGateway(b, benchConfig("http://127.0.0.1:1"), opts)
			st := gw.st.Load()
			hot := st.plans["hot"]
			ctx := context.Background()
			measure(b, func() error {
				l := limits{key: ipKey(ips[rand.IntN(len(ips))]), plan: st.anonymous}
				if bc.hot {
					l = limits{key: "k:hot", plan: hot}
				}
				if v := gw.decide(ctx, st, l, 1); !v.allowed || v.mode != event.ModeEnforced {
					return fmt.Errorf("verdict %+v", v)
				}
				return nil
			})
		})
	}
}

// measure runs op from 16 goroutines per CPU, b.N times in all, and
// reports the latencies of its calls; an error ends that goroutine's run.
func measure(b *testing.B, op func() error) {
	var lat latencies
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			start := time.Now()
			err := op()
			mine = append(mine, time.Since(start))
			if err != nil {
				b.Error(err)
				break
			}
		}
		lat.add(mine...)
	})
	b.StopTimer()
	lat.report(b, "")
}

// benchClient keeps enough idle connections for the parallel senders.
func benchClient(b *testing.B) *http.Client {
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	b.Cleanup(cl.CloseIdleConnections)
	return cl
}

// benchGet sends one GET to url as the hot key or, when not hot, from a
// random one of ips, and wants 200.
func benchGet(cl *http.Client, url string, hot bool, ips []string) error {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if hot {
		req.Header.Set("X-API-Key", "hot-key")
	} else {
		req.Header.Set("X-Forwarded-For", ips[rand.IntN(len(ips))])
	}
	return testenv.WantOK(cl.Do(req))
}

// timedStore records how long each limiter call takes.
type timedStore struct {
	next checker
	took latencies
}

func (t *timedStore) Allow(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	start := time.Now()
	d, err := t.next.Allow(ctx, key, rules, cost)
	t.took.add(time.Since(start))
	return d, err
}

// BenchmarkGatewayHalfLoad finds the gateway's closed-loop throughput on
// Redis, then sends b.N requests open-loop at half of it, and reports the
// in-process latency of the check itself (check-p99-µs; target < 1ms) and
// of whole requests.
func BenchmarkGatewayHalfLoad(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	b.Cleanup(up.Close)
	ips := benchIPs()
	for _, hot := range []bool{false, true} {
		name := "keys=random"
		if hot {
			name = "keys=hot"
		}
		// One gateway and one calibration per case, shared by the rounds
		// the benchmark framework runs to find b.N.
		ts := &timedStore{next: benchRedis(b)}
		cfg := benchConfig(up.URL)
		cfg.StoreDeadline = DefaultStoreDeadline // as deployed
		gw := startGateway(b, cfg, Options{Store: ts})
		cl := benchClient(b)
		send := func() error { return benchGet(cl, gw.URL+"/", hot, ips) }
		rate := calibrate(b, send) / 2

		b.Run(name, func(b *testing.B) {
			ts.took.take()
			failOpen := counter(b, gw.m.failOpen)
			// Open loop at half load: request i is due at start + i/rate,
			// whether or not earlier ones came back; 128 workers send them
			// and latency counts from the due time, queueing included.
			var lat latencies
			var reqs sync.WaitGroup
			due := make(chan time.Time, 1024)
			for range 128 {
				reqs.Go(func() {
					var mine []time.Duration
					for at := range due {
						if err := send(); err != nil {
							b.Error(err)
							continue
						}
						mine = append(mine, time.Since(at))
					}
					lat.add(mine...)
				})
			}
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
				if d := time.Until(at); d > 0 {
					time.Sleep(d) // pacing the load, not waiting for a condition
				}
				due <- at
			}
			close(due)
			reqs.Wait()
			b.StopTimer()
			lat.report(b, "")
			ts.took.report(b, "check-")
			b.ReportMetric(rate, "rps")
			b.ReportMetric(counter(b, gw.m.failOpen)-failOpen, "fail-open")
		})
	}
}

// calibrate runs send closed-loop from 32 workers for two seconds and
// returns the throughput per second.
func calibrate(b *testing.B, send func() error) float64 {
	var done sync.WaitGroup
	var total atomic.Int64
	start := time.Now()
	stop := start.Add(2 * time.Second)
	for range 32 {
		done.Go(func() {
			for time.Now().Before(stop) {
				if err := send(); err != nil {
					b.Error(err)
					return
				}
				total.Add(1)
			}
		})
	}
	done.Wait()
	return float64(total.Load()) / time.Since(start).Seconds()
}

// benchPublisher publishes to a fresh topic on the real Kafka broker, so
// the events=kafka case prices publishing against the same run's cases.
func benchPublisher(b *testing.B) *publish.Publisher {
	brokers := testenv.KafkaBrokers(b)
	topic := "bench-" + randHex(6)
	testenv.CreateTopics(b, brokers, 4, topic)
	pub, err := publish.New(publish.Config{Brokers: brokers, Topic: topic}, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pub.Close(ctx)
	})
	return pub
}

// BenchmarkBodyScan measures what the proxy path spends on a request's
// body before and while it streams upstream: a body no framework reads a
// form from (unscanned), and a small form (read for an API key, and on a
// route listing its methods for _method too).
func BenchmarkBodyScan(b *testing.B) {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Routes = []Route{
		{Name: "all", PathPrefix: "/", Upstream: "app"},
		{Name: "delete", PathPrefix: "/v1/items", Methods: []string{"DELETE"}, Upstream: "app"},
	}
	gw := startGateway(b, cfg, Options{})
	st := gw.st.Load()
	body := "a=1&b=" + strings.Repeat("x", 1000)
	for _, bc := range []struct{ name, path, contentType string }{
		{"unscanned", "/v1/other", "application/octet-stream"},
		{"form", "/v1/other", "application/x-www-form-urlencoded"},
		{"form/override", "/v1/items/7", "application/x-www-form-urlencoded"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rt := st.match("POST", bc.path)
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest("POST", bc.path, strings.NewReader(body))
				r.Header.Set("Content-Type", bc.contentType)
				rc, err := st.scanBody(r, r.Body, bc.path, rt)
				if err != nil {
					b.Fatal(err)
				}
				if n, err := io.Copy(io.Discard, rc); err != nil || n != int64(len(body)) {
					b.Fatalf("read %d bytes, %v; want %d", n, err, len(body))
				}
				_ = rc.Close()
			}
		})
	}
}
