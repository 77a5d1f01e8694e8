package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

type settler interface {
	allower
	Settle(ctx context.Context, key string, rules []Rule, delta int64, at time.Time) (Decision, error)
}

// TestSettle: a reservation charged by Allow is settled after the answer:
// what was used beyond it is charged even past the limit (the rule is
// overdrawn, and later checks wait), its debt stopping at one capacity,
// and what was not used comes back, never past the capacity. Every store
// and every algorithm agree on the same figures.
func TestSettle(t *testing.T) {
	month, err := ParseCalendar("month", "UTC", "")
	if err != nil {
		t.Fatal(err)
	}
	// Long periods: the refill of the test's milliseconds rounds away.
	algos := map[string]Rule{
		"token bucket":   {Name: "tokens", Limit: 10, Period: 24 * time.Hour},
		"sliding window": {Name: "tokens", Limit: 10, Period: 24 * time.Hour, Algorithm: SlidingWindow},
		"calendar":       {Name: "tokens", Limit: 10, Calendar: month},
	}
	stores := map[string]func(t *testing.T) settler{
		"memory": func(t *testing.T) settler { return NewMemory(newFakeClock().Now, 0) },
		"redis":  func(t *testing.T) settler { return mustLimiter(t, mustRedis(t), Config{DenyCache: -1}) },
		"redis-cluster": func(t *testing.T) settler {
			return mustLimiter(t, mustCluster(t), Config{DenyCache: -1})
		},
		"redis-deny-cache": func(t *testing.T) settler { return mustLimiter(t, mustRedis(t), Config{}) },
	}
	ctx := context.Background()
	for sname, mk := range stores {
		for aname, rule := range algos {
			t.Run(sname+"/"+aname, func(t *testing.T) {
				s := mk(t)
				key := uniqueKey(t)
				rules := []Rule{rule}
				remaining := func(d Decision, err error) int64 {
					t.Helper()
					if err != nil {
						t.Fatal(err)
					}
					if !d.Allowed {
						t.Fatalf("a settlement was denied: %+v", d)
					}
					if d.Seq != 0 {
						t.Fatalf("a settlement was numbered %d", d.Seq)
					}
					return d.Rules[0].Remaining
				}
				res, err := s.Allow(ctx, key, rules, 4)
				if err != nil || !res.Allowed || res.Rules[0].Remaining != 6 {
					t.Fatalf("reserve 4 of 10: %+v, %v", res, err)
				}
				// Used 14: 10 more, past the limit.
				if got := remaining(s.Settle(ctx, key, rules, 10, res.Time)); got != 0 {
					t.Fatalf("after settling 14 of 10: remaining %d, want 0", got)
				}
				d, err := s.Allow(ctx, key, rules, 1)
				if err != nil || d.Allowed {
					t.Fatalf("an overdrawn rule admitted a check: %+v, %v", d, err)
				}
				if d.RetryAfter() <= 0 {
					t.Fatalf("denied by an overdrawn rule without a retry: %+v", d)
				}
				// 100 more: the debt stops at one capacity (10 below empty).
				remaining(s.Settle(ctx, key, rules, 100, res.Time))
				remaining(s.Settle(ctx, key, rules, 1, res.Time))
				// So 10 back leaves it empty, and 5 more leave 5.
				if got := remaining(s.Settle(ctx, key, rules, -10, res.Time)); got != 0 {
					t.Fatalf("10 back after the debt's cap: remaining %d, want 0", got)
				}
				if got := remaining(s.Settle(ctx, key, rules, -5, res.Time)); got != 5 {
					t.Fatalf("5 more back: remaining %d, want 5", got)
				}
				// Never past the capacity.
				if got := remaining(s.Settle(ctx, key, rules, -50, res.Time)); got != 10 {
					t.Fatalf("50 back: remaining %d, want 10", got)
				}
				d, err = s.Allow(ctx, key, rules, 10)
				if err != nil || !d.Allowed || d.Rules[0].Remaining != 0 {
					t.Fatalf("a settled rule back at capacity did not admit 10: %+v, %v", d, err)
				}
			})
		}
	}
}

// TestSettleRefusesBadInput: a settlement of nothing, or of a bucket the
// door spreads over slots, is the caller's mistake.
func TestSettleRefusesBadInput(t *testing.T) {
	rule := Rule{Name: "tokens", Limit: 10, Period: time.Minute}
	tagged := Rule{Name: "d0", Limit: 10, Period: time.Minute, Bucket: "d0_x", Tag: "x"}
	for name, s := range map[string]settler{
		"memory": NewMemory(nil, 0),
		"redis":  mustLimiter(t, mustRedis(t), Config{}),
	} {
		for _, c := range []struct {
			rules []Rule
			delta int64
		}{{[]Rule{rule}, 0}, {[]Rule{tagged}, 3}, {nil, 3}, {[]Rule{rule}, MaxCost + 1}} {
			if _, err := s.Settle(context.Background(), "k", c.rules, c.delta, time.Now()); !errors.Is(err, ErrInput) {
				t.Errorf("%s: Settle(%v, %d): %v, want ErrInput", name, c.rules, c.delta, err)
			}
		}
	}
}
