package analytics_test

import (
	"context"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/limiter"
)

// BenchmarkWhatIf replays 10M stored decisions (EDGELIMIT_BENCH_EVENTS to
// change; benchSeed's 2,000 keys over 6 hours) from a real ClickHouse
// through a proposal of two plans of two rules each, and reports the
// seconds per replay, decisions per second and the peak Go heap during the
// replay (sampled every 10ms) beside the process' peak RSS. Seeding is not
// timed.
//
//	deploy/local/testenv.sh go test -run '^$' -bench WhatIf -benchtime 1x ./analytics/
func BenchmarkWhatIf(b *testing.B) {
	conn, start, end, n := seedBench(b)
	ctx := context.Background()
	rules := func(perMinute int64) []limiter.Rule {
		return []limiter.Rule{
			{Name: "per_minute", Limit: perMinute, Period: time.Minute},
			{Name: "per_hour", Limit: 40 * perMinute, Period: time.Hour, Algorithm: limiter.SlidingWindow},
		}
	}
	q := analytics.WhatIfQuery{
		Range:    analytics.Range{From: start, To: end},
		Proposal: analytics.Proposal{Plans: map[string][]limiter.Rule{"free": rules(15), "pro": rules(30)}},
		Top:      20,
	}
	r := analytics.NewReader(conn)
	b.ReportAllocs()
	var rep analytics.WhatIfReport
	var peak atomic.Uint64
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	cpu0 := cpu()
	for b.Loop() {
		runtime.GC()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			// runtime/metrics, not ReadMemStats: no stop of the world
			// every 10ms to slow the replay measured.
			sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
			for {
				metrics.Read(sample)
				if n := sample[0].Value.Uint64() + sample[1].Value.Uint64(); n > peak.Load() {
					peak.Store(n)
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		var err error
		rep, err = r.WhatIf(ctx, q)
		close(stop)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
	}
	if rep.Read != n {
		b.Fatalf("replayed %d decisions, want %d", rep.Read, n)
	}
	cpuSec := (cpu() - cpu0).Seconds() / float64(b.N)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	sec := b.Elapsed().Seconds() / float64(b.N)
	// The CPU time is this process' (scan and replay), not ClickHouse's:
	// on a shared machine it says more than the wall clock does.
	b.Logf("replayed %d decisions of %d keys in %.2fs (%.0f/s, %.2fs of this process' CPU); peak heap %.1f MiB, peak RSS %.1f MiB; would deny %d, were denied %d",
		rep.Read, rep.Keys, sec, float64(rep.Read)/sec, cpuSec, float64(peak.Load())/(1<<20), float64(ru.Maxrss)/1024, rep.Totals.WouldDeny, rep.Totals.WasDenied)
	b.ReportMetric(sec, "s/replay")
	b.ReportMetric(float64(rep.Read)/sec, "decisions/s")
	b.ReportMetric(cpuSec, "cpu_s/replay")
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak_heap_MiB")
}
