package limiter

import (
	"context"
	"testing"
	"time"
)

// TestMemoryExactRefill: with a controlled clock, micro-token arithmetic
// admits exactly burst + refill × elapsed, even when every step is shorter
// than one token's refill time.
func TestMemoryExactRefill(t *testing.T) {
	clock := newFakeClock()
	m := NewMemory(clock.Now, 0)
	// 100/min: one token every 600 ms; step 7 ms, far below that.
	rules := []Rule{{Name: "minute", Limit: 100, Period: time.Minute, Burst: 10}}
	allowed := 0
	step := 7 * time.Millisecond
	steps := int(10 * time.Minute / step)
	for range steps {
		d, err := m.Allow(context.Background(), "k", rules, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
		clock.Add(step)
	}
	elapsed := time.Duration(steps-1) * step
	want := 10 + int(100*elapsed/time.Minute)
	if allowed != want {
		t.Errorf("allowed %d over %v, want exactly %d", allowed, elapsed, want)
	}
}

// TestMemoryClockBackwards: a clock stepping back never mints tokens.
func TestMemoryClockBackwards(t *testing.T) {
	clock := newFakeClock()
	m := NewMemory(clock.Now, 0)
	for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
		rules := []Rule{{Name: "r", Limit: 5, Period: time.Minute, Algorithm: algo}}
		key := "k" + string(algo)
		for range 5 {
			if d, _ := m.Allow(context.Background(), key, rules, 1); !d.Allowed {
				t.Fatalf("%s: burst denied early", algo)
			}
		}
		clock.Add(-2 * time.Minute)
		if d, _ := m.Allow(context.Background(), key, rules, 1); d.Allowed {
			t.Errorf("%s: after the clock stepped back 2m, Allow = %+v, want denied", algo, d)
		}
		clock.Add(2 * time.Minute)
	}
}

// TestMemoryBounded: idle state expires, and the store never holds more
// than its bound.
func TestMemoryBounded(t *testing.T) {
	clock := newFakeClock()
	m := NewMemory(clock.Now, 100)
	rules := []Rule{{Name: "r", Limit: 5, Period: time.Second}}
	for i := range 1000 {
		if _, err := m.Allow(context.Background(), "k"+string(rune(i)), rules, 1); err != nil {
			t.Fatal(err)
		}
		if n := m.Len(); n > 100 {
			t.Fatalf("after %d keys, Len() = %d, want ≤ 100", i+1, n)
		}
	}
	// An expired bucket reads as full again.
	for range 5 {
		m.Allow(context.Background(), "hot", rules, 1)
	}
	clock.Add(3 * time.Second)
	if d, _ := m.Allow(context.Background(), "hot", rules, 1); !d.Allowed || d.Rules[0].Remaining != 4 {
		t.Errorf("after expiry: Allow = %+v, want allowed with 4 remaining", d)
	}
}
