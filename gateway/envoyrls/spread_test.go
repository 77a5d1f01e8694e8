package envoyrls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestDomainSpreadsOverCluster: one domain, three descriptors over 100k
// random values, 64 callers, on a 3-master Cluster of its own (so that
// nothing else loads it): no master holds more than half of the keys or
// spends more than half of the Redis CPU. A domain's buckets live where
// their own descriptor hashes, not under one tag for the domain.
func TestDomainSpreadsOverCluster(t *testing.T) {
	srv := testenv.Private(t, "redis-cluster-ha")
	addrs := strings.Split(srv.Get(t, "EDGELIMIT_REDIS_CLUSTER_ADDRS"), ",")
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, limiter.Config{Prefix: "spread"})
	if err != nil {
		t.Fatal(err)
	}
	r := startRLSOn(t, map[string]string{"bench.yaml": benchRules}, Config{}, gatewayConfig(), lim)
	masters := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		masters[i] = redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = masters[i].Close() })
	}
	ctx := context.Background()
	cpu := func() []float64 {
		out := make([]float64, len(masters))
		for i, m := range masters {
			info := m.Info(ctx, "cpu").Val()
			for _, line := range strings.Split(info, "\r\n") {
				if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
					f, _ := strconv.ParseFloat(v, 64)
					out[i] += f
				}
				if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
					f, _ := strconv.ParseFloat(v, 64)
					out[i] += f
				}
			}
		}
		return out
	}
	const callers, each = benchCallers, 100
	before := cpu()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for range each {
				k := strconv.Itoa(rng.IntN(benchKeys))
				resp, err := r.try("bench", 0, benchDescriptors(k)...)
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Errorf("ShouldRateLimit = %v, %v; want OK", resp, err)
					return
				}
			}
		})
	}
	wg.Wait()
	after := cpu()
	var keys, used []float64
	var allKeys, allCPU float64
	for i, m := range masters {
		n := 0.0
		iter := m.Scan(ctx, 0, "spread:*", 1000).Iterator()
		for iter.Next(ctx) {
			n++
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, n)
		used = append(used, after[i]-before[i])
		allKeys += n
		allCPU += after[i] - before[i]
	}
	t.Logf("keys per master %v, Redis CPU per master %v s", keys, fmt.Sprintf("%.3f", used))
	for i := range masters {
		if keys[i] > allKeys/2 {
			t.Errorf("master %d holds %.0f of %.0f keys, over half", i, keys[i], allKeys)
		}
		if used[i] > allCPU/2 {
			t.Errorf("master %d spent %.3f of %.3f s of Redis CPU, over half", i, used[i], allCPU)
		}
	}
}
