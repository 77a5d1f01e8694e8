package envoyrls

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// benchRules is the load's configuration, shared with the peer's run in
// gateway/testdata/wrk/grpc.sh.
//
//go:embed testdata/bench.yaml
var benchRules string

const (
	benchKeys    = 100_000
	benchCallers = 64
)

// benchDescriptors are a request of the load: caller k's three quotas.
func benchDescriptors(k string) []*commonv3.RateLimitDescriptor {
	return descs(desc("minute", "u"+k), desc("hour", "u"+k), desc("day", "u"+k))
}

// latencies collects per-call latencies from many goroutines.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, start time.Time) {
	el := time.Since(start)
	slices.Sort(l.all)
	if n := len(l.all); n > 0 {
		b.ReportMetric(float64(n)/el.Seconds(), "req/s")
		b.ReportMetric(float64(l.all[n/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(l.all[n*99/100].Microseconds()), "p99-µs")
	}
}

// parallel runs b.N calls of op over benchCallers goroutines.
func parallel(b *testing.B, op func(w, i int) error) {
	b.SetParallelism((benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var lat latencies
	var worker atomic.Int64
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		w := int(worker.Add(1))
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := op(w, rng.IntN(benchKeys)); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		lat.add(mine)
	})
	b.StopTimer()
	lat.report(b, start)
}

// BenchmarkShouldRateLimit is the gRPC load: 3 descriptors over 100k
// random keys from 64 concurrent callers on one HTTP/2 connection and on
// four. EDGELIMIT_RLS_BENCH_ADDR points it at another rate limit service
// (e.g. envoyproxy/ratelimit loaded with benchRules) for a side-by-side
// figure; otherwise it starts the gateway's on the test Redis.
func BenchmarkShouldRateLimit(b *testing.B) {
	addr := os.Getenv("EDGELIMIT_RLS_BENCH_ADDR")
	if addr == "" {
		addr = serveBench(b, "")
	}
	benchRLS(b, addr)
}

// BenchmarkShouldRateLimitMemory is the same load on the gateway's
// in-memory store: the door's own cost, without Redis.
func BenchmarkShouldRateLimitMemory(b *testing.B) { benchRLS(b, serveBench(b, "memory")) }

func benchRLS(b *testing.B, addr string) {
	for _, conns := range []int{1, 4} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			clients := make([]rlsv3.RateLimitServiceClient, conns)
			for i := range clients {
				// WithNoProxy and a distinct authority keep the connections apart.
				cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(fmt.Sprintf("rls-%d", i)))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = cc.Close() })
				clients[i] = rlsv3.NewRateLimitServiceClient(cc)
			}
			b.ReportAllocs()
			parallel(b, func(w, k int) error {
				s := strconv.Itoa(k)
				req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: benchDescriptors(s)}
				resp, err := clients[w%conns].ShouldRateLimit(context.Background(), req)
				if err != nil {
					return err
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					return fmt.Errorf("over limit under the bench load: %v", resp)
				}
				return nil
			})
		})
	}
}

// BenchmarkHTTPCheck is the same load on POST /v1/check: a plan of three
// rules over 100k random client addresses, 64 concurrent callers.
func BenchmarkHTTPCheck(b *testing.B) {
	cfg := gatewayConfig()
	cfg.Plans = map[string]gateway.Plan{"bench": {Rules: []gateway.Rule{
		{Rule: limiter.Rule{Name: "second", Limit: 100000, Period: time.Second}},
		{Rule: limiter.Rule{Name: "minute", Limit: 1000000, Period: time.Minute}},
		{Rule: limiter.Rule{Name: "hour", Limit: 100000000, Period: time.Hour}},
	}}}
	cfg.AnonymousPlan = "bench"
	cfg.TrustedProxies = []string{"127.0.0.1"}
	gw, err := gateway.New(cfg, gatewayOptions(redisStore(b, testenv.RedisAddr(b))))
	if err != nil {
		b.Fatal(err)
	}
	srv := gw.Server()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(gw.Listener(ln)) }()
	b.Cleanup(func() { _ = srv.Close() })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchCallers}}
	url := "http://" + ln.Addr().String() + "/v1/check"
	b.ReportAllocs()
	parallel(b, func(_, k int) error {
		body := `{"ip":"10.` + strconv.Itoa(k>>16&255) + "." + strconv.Itoa(k>>8&255) + "." + strconv.Itoa(k&255) + `"}`
		return testenv.WantOK(client.Post(url, "application/json", bytes.NewBufferString(body)))
	})
}

// serveBench starts the gateway's gRPC service with benchRules on
// redisAddr (see startRLS).
func serveBench(b *testing.B, redisAddr string) string {
	b.Helper()
	r := startRLS(b, map[string]string{"bench.yaml": benchRules}, Config{}, gatewayConfig(), redisAddr)
	return r.conn.Target()
}
