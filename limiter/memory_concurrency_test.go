package limiter

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMemoryConcurrentRefill: 32 goroutines hammer one key on the real
// clock; the store may admit at most burst + rate × elapsed. Reading the
// clock before taking the lock let a goroutine that waited write an older
// timestamp, and the next caller refilled that interval a second time.
// EDGELIMIT_MEMORY_RATE sets the rate (per second) to measure other loads.
func TestMemoryConcurrentRefill(t *testing.T) {
	rate := int64(20_000)
	if s := os.Getenv("EDGELIMIT_MEMORY_RATE"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("EDGELIMIT_MEMORY_RATE=%q: %v", s, err)
		}
		rate = n
	}
	const goroutines = 32
	burst := max(1, rate/100)
	rules := []Rule{{Name: "sec", Limit: rate, Period: time.Second, Burst: burst}}
	m := NewMemory(time.Now, 0)
	var allowed, calls atomic.Int64
	start := time.Now()
	stop := start.Add(time.Second)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for time.Now().Before(stop) {
				d, err := m.Allow(context.Background(), "k", rules, 1)
				if err != nil {
					t.Error(err)
					return
				}
				calls.Add(1)
				if d.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := float64(burst) + float64(rate)*elapsed.Seconds()
	ratio := float64(allowed.Load()) / bound
	t.Logf("rate %d/s, %d goroutines, %v: admitted %d of %d calls; burst + rate×elapsed = %.0f; admitted/expected = %.3f",
		rate, goroutines, elapsed.Round(time.Millisecond), allowed.Load(), calls.Load(), bound, ratio)
	if ratio > 1 {
		t.Errorf("admitted/expected = %.3f, want ≤ 1", ratio)
	}
}
