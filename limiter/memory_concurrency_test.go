package limiter

import (
	"context"
	"fmt"
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

// TestMemoryStaleClockNoDoubleRefill replays, with a fake clock, what the
// race did: a call carrying an older time than the last write. It may be
// decided, but must not move the bucket's timestamp back, or the interval
// is refilled twice.
func TestMemoryStaleClockNoDoubleRefill(t *testing.T) {
	clock := newFakeClock()
	m := NewMemory(clock.Now, 0)
	rules := []Rule{{Name: "sec", Limit: 10, Period: time.Second}}
	ctx := context.Background()
	if d, _ := m.Allow(ctx, "k", rules, 5); !d.Allowed {
		t.Fatalf("Allow(5 of 10) = %+v, want allowed", d)
	}
	clock.Add(-500 * time.Millisecond)
	if d, _ := m.Allow(ctx, "k", rules, 1); !d.Allowed {
		t.Fatalf("stale Allow(1) = %+v, want allowed (4 tokens left)", d)
	}
	clock.Add(500 * time.Millisecond)
	admitted := 0
	for {
		d, _ := m.Allow(ctx, "k", rules, 1)
		if !d.Allowed {
			break
		}
		admitted++
	}
	if admitted != 4 {
		t.Errorf("after a stale call, admitted %d more, want 4 (no refill: no time passed since the last write)", admitted)
	}
}

// TestMemoryEvictionKeepsDrained (row 9): a store over capacity forgets
// the states closest to full, never a drained key's while a fuller one is
// held. Before: random eviction re-admitted a drained 10/hour key 350
// times in 100 s of churn.
func TestMemoryEvictionKeepsDrained(t *testing.T) {
	clock := newFakeClock()
	m := NewMemory(clock.Now, 100)
	ctx := context.Background()
	hot := []Rule{{Name: "hour", Limit: 10, Period: time.Hour}}
	churn := []Rule{{Name: "sec", Limit: 5, Period: time.Second}}
	admitted := 0
	for i := range 1000 { // 100 s in steps of 100 ms
		for j := range 20 {
			if _, err := m.Allow(ctx, fmt.Sprintf("churn:%d:%d", i, j), churn, 1); err != nil {
				t.Fatal(err)
			}
		}
		if d, _ := m.Allow(ctx, "hot", hot, 1); d.Allowed {
			admitted++
		}
		if n := m.Len(); n > 100 {
			t.Fatalf("Len() = %d, want ≤ 100", n)
		}
		clock.Add(100 * time.Millisecond)
	}
	// 10 at once plus 100 s of refill at 10/hour (0.28).
	if admitted > 10 {
		t.Errorf("10/hour key under churn: admitted %d in 100 s, want ≤ 10", admitted)
	}
}

// TestMemoryBoundedSweep (row 9): no call drops more than a few expired
// states; the rest go a few per call. Before: the call that found the store
// full swept all of it (1M states stalled an Allow for 110 ms).
func TestMemoryBoundedSweep(t *testing.T) {
	const n = 20_000
	clock := newFakeClock()
	m := NewMemory(clock.Now, n)
	ctx := context.Background()
	rules := []Rule{{Name: "sec", Limit: 5, Period: time.Second}}
	for i := range n {
		m.Allow(ctx, fmt.Sprintf("k%d", i), rules, 1)
	}
	clock.Add(time.Hour) // every state reads as full now
	m.Allow(ctx, "new", rules, 1)
	if got := m.Len(); got < n-sweepPerCall {
		t.Errorf("one Allow dropped %d states at once, want at most %d", n+1-got, sweepPerCall)
	}
	for range n / sweepPerCall {
		m.Allow(ctx, "new", rules, 1)
	}
	if got := m.Len(); got > 1 {
		t.Errorf("after %d more calls, Len() = %d expired states left, want 1", n/sweepPerCall, got)
	}
}
