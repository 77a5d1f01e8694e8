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

// TestMemoryGiveBack: a rule with a negative Cost gives back exactly what
// it names, never past the capacity (token bucket) or below an empty
// current window (sliding window), always admits, and like every rule
// changes nothing when another rule of the check denies.
func TestMemoryGiveBack(t *testing.T) {
	ctx := context.Background()
	for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
		t.Run(string(algo), func(t *testing.T) {
			m := NewMemory(newFakeClock().Now, 0)
			rule := Rule{Name: "r", Limit: 10, Period: time.Hour, Algorithm: algo}
			give := func(n int64) Rule { r := rule; r.Cost = -n; return r }
			remaining := func() int64 {
				t.Helper()
				ks, err := m.Inspect(ctx, "k", []Rule{rule})
				if err != nil {
					t.Fatal(err)
				}
				return ks.Rules[0].Remaining
			}
			if d, _ := m.Allow(ctx, "k", []Rule{rule}, 7); !d.Allowed {
				t.Fatalf("Allow(7) = %+v, want allowed", d)
			}
			d, err := m.Allow(ctx, "k", []Rule{give(3)}, 1)
			if err != nil || !d.Allowed || d.Rules[0].Remaining != 6 {
				t.Fatalf("give back 3 = %+v, %v; want allowed with 6 remaining", d, err)
			}
			if got := remaining(); got != 6 {
				t.Errorf("after giving back 3 of 7: %d remaining, want 6", got)
			}
			// More than was used: full, never above.
			if d, _ := m.Allow(ctx, "k", []Rule{give(MaxCost)}, 1); !d.Allowed || d.Rules[0].Remaining != 10 {
				t.Errorf("give back 2^53 = %+v, want allowed with 10 (the capacity) remaining", d)
			}
			if got := remaining(); got != 10 {
				t.Errorf("after giving back 2^53: %d remaining, want 10", got)
			}
			if d, _ := m.Allow(ctx, "k", []Rule{rule}, 10); !d.Allowed {
				t.Errorf("Allow(10) when full = %+v, want allowed", d)
			}
			if d, _ := m.Allow(ctx, "k", []Rule{rule}, 1); d.Allowed {
				t.Errorf("Allow(1) after 10 = %+v, want denied: the give-back added nothing above the capacity", d)
			}
			m.Allow(ctx, "k", []Rule{give(5)}, 1)

			// All-or-nothing: a give-back beside a denying rule gives nothing.
			other := Rule{Name: "other", Limit: 1, Period: time.Hour, Algorithm: algo}
			d, _ = m.Allow(ctx, "k", []Rule{give(2), other}, 2)
			if d.Allowed || !d.Rules[0].Allowed {
				t.Fatalf("give-back beside a denial = %+v, want denied, the give-back's own rule admitting", d)
			}
			if got := remaining(); got != 5 {
				t.Errorf("after a denied check with a give-back: %d remaining, want 5 (unchanged)", got)
			}
			// Beside a rule that admits, both apply in the one check.
			if d, _ := m.Allow(ctx, "k", []Rule{give(2), other}, 1); !d.Allowed {
				t.Fatalf("give-back beside an admitting rule = %+v, want allowed", d)
			}
			if got := remaining(); got != 7 {
				t.Errorf("after giving back 2 beside another rule: %d remaining, want 7", got)
			}
		})
	}
}
