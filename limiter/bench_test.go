package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var benchRules = []Rule{
	{Name: "minute", Limit: 100, Period: time.Minute},
	{Name: "hour", Limit: 5000, Period: time.Hour},
	{Name: "day", Limit: 50000, Period: 24 * time.Hour},
}

// BenchmarkAllow measures checks/s and latency percentiles with 64
// concurrent callers and 3 rules per key, over 100k random keys and over
// one hot key (served mostly by the deny cache once it is over its limit).
func BenchmarkAllow(b *testing.B) {
	for _, tc := range []struct {
		name string
		key  func(r *rand.Rand) string
	}{
		{"random-keys", func(r *rand.Rand) string { return fmt.Sprintf("bench:%d", r.IntN(100_000)) }},
		{"hot-key", func(*rand.Rand) string { return "bench:hot" }},
	} {
		b.Run("redis/"+tc.name, func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: mustRedis(b).Options().Addr, PoolSize: 16})
			defer rdb.Close()
			benchAllow(b, mustLimiter(b, rdb, Config{}), tc.key)
		})
		b.Run("memory/"+tc.name, func(b *testing.B) {
			benchAllow(b, NewMemory(nil, 0), tc.key)
		})
	}
}

func benchAllow(b *testing.B, a allower, key func(*rand.Rand) string) {
	ctx := context.Background()
	var mu sync.Mutex
	var all []time.Duration
	b.SetParallelism(max(1, 64/max(1, testingProcs())))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), processCPU()
	var st0 Stats
	if r, ok := a.(*Redis); ok {
		st0 = r.Stats()
	}
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 1))
		lat := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t0 := time.Now()
			if _, err := a.Allow(ctx, key(r), benchRules, 1); err != nil {
				b.Error(err)
				return
			}
			lat = append(lat, time.Since(t0))
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	})
	elapsed, cpu := time.Since(start), processCPU()-cpu
	b.StopTimer()
	slices.Sort(all)
	if len(all) > 0 {
		// This process's CPU (user and system) per check: the client's
		// cost, apart from Redis', whatever else shares the machine.
		b.ReportMetric(float64(cpu.Microseconds())/float64(len(all)), "cpu-µs/op")
		if r, ok := a.(*Redis); ok {
			st := r.Stats()
			b.ReportMetric(float64(st.Checks-st0.Checks)/float64(max(1, st.Pipelines-st0.Pipelines)), "checks/pipeline")
		}
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "checks/s")
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMemoryFull measures a store kept at its default bound of 1M
// states by new keys, reporting the slowest call: a call that sweeps the
// whole store stalls every caller behind its lock. "expired": every held
// state reads as full; "live": none does, so each new key evicts one.
func BenchmarkMemoryFull(b *testing.B) {
	for _, tc := range []struct {
		name string
		idle time.Duration
	}{{"expired", time.Hour}, {"live", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			clock := newFakeClock()
			m := NewMemory(clock.Now, 0)
			rules := []Rule{{Name: "hour", Limit: 5, Period: time.Hour}}
			for i := range 1 << 20 {
				m.Allow(ctx, "fill:"+strconv.Itoa(i), rules, 1)
			}
			clock.Add(tc.idle)
			var worst time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				m.Allow(ctx, "new:"+strconv.Itoa(i), rules, 1)
				worst = max(worst, time.Since(t0))
			}
			b.ReportMetric(float64(worst.Microseconds()), "max-µs")
		})
	}
}
