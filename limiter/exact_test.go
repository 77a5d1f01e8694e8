package limiter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Regression tests for issue 14's limiter rows, on every store. Each
// failed on the code before its fix.

// exactStores are the stores the rows below run on.
func exactStores(t *testing.T) map[string]func(t *testing.T) store {
	all := storesUnderTest(t)
	return map[string]func(t *testing.T) store{"memory": all["memory"], "redis": all["redis"], "redis-cluster": all["redis-cluster"]}
}

func forEachStore(t *testing.T, run func(t *testing.T, s store)) {
	for name, mk := range exactStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run(t, mk(t))
		})
	}
}

// TestRaisedLimit (row 7): a changed limit carries what was used: a raised
// one adds its difference to what is left, a lowered one takes it away
// (testCapacityFlip: clamping it let a raise and a lowering mint units).
// Before: 100/day → 10000/day after using 100 admitted 0 of 200.
func TestRaisedLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		key := uniqueKey(t)
		day := Rule{Name: "day", Limit: 100, Period: 24 * time.Hour}
		if d := mustAllow(t, s, key, []Rule{day}, 100); !d.Allowed {
			t.Fatalf("Allow(100 of 100/day) = %+v, want allowed", d)
		}
		raised := day
		raised.Limit = 10_000
		admitted := 0
		for range 200 {
			if mustAllow(t, s, key, []Rule{raised}, 1).Allowed {
				admitted++
			}
		}
		if admitted != 200 {
			t.Errorf("after raising 100/day to 10000/day: admitted %d of 200, want 200", admitted)
		}
		// 10000 - 100 - 200 left; lowering to 500 keeps the 300 used:
		// 200 left, not 9700 (nor 500, which forgot what was used).
		lowered := day
		lowered.Limit = 500
		d := mustAllow(t, s, key, []Rule{lowered}, 1)
		if !d.Allowed || d.Rules[0].Remaining != 199 {
			t.Errorf("after lowering to 500/day: Allow = %+v, want allowed with 199 remaining", d.Rules[0])
		}
	})
}

// TestPeriodChange (row 6): a sliding window whose period changes carries
// its use into the new period and never freezes; a token bucket keeps its
// tokens. Before: 100ms → 1s stayed denied past its own Retry-After (until
// the key expired).
func TestPeriodChange(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		for _, tc := range []struct {
			name     string
			from, to time.Duration
		}{
			{"short to long", 100 * time.Millisecond, time.Second},
			// The old window index runs ahead of the new one: before, the
			// window froze until the old key expired, past RetryAfter.
			{"slightly longer", time.Second, 1200 * time.Millisecond},
			{"long to short", time.Second, 100 * time.Millisecond},
		} {
			key := uniqueKey(t) + tc.name
			from := Rule{Name: "sw", Limit: 5, Period: tc.from, Algorithm: SlidingWindow}
			to := from
			to.Period = tc.to
			alignToWindow(t, s, max(tc.from, tc.to))
			if d := mustAllow(t, s, key, []Rule{from}, 5); !d.Allowed {
				t.Fatalf("%s: Allow(5 of 5/%v) = %+v, want allowed", tc.name, tc.from, d)
			}
			d := mustAllow(t, s, key, []Rule{to}, 1)
			if d.Allowed {
				// Use carried over: 5 were admitted a moment ago.
				t.Errorf("%s: right after the change to 5/%v: Allow = %+v, want denied", tc.name, tc.to, d)
				continue
			}
			if ra := d.RetryAfter(); ra <= 0 || ra > 2*tc.to+10*time.Millisecond {
				t.Errorf("%s: RetryAfter = %v, want within (0, %v]", tc.name, ra, 2*tc.to)
			}
			s.wait(d.RetryAfter())
			if d2 := mustAllow(t, s, key, []Rule{to}, 1); !d2.Allowed {
				t.Errorf("%s: after waiting RetryAfter %v: Allow = %+v, want allowed", tc.name, d.RetryAfter(), d2)
			}
		}
		// A token bucket keeps its tokens across a period change.
		key := uniqueKey(t) + "tb"
		tb := Rule{Name: "tb", Limit: 10, Period: time.Hour}
		mustAllow(t, s, key, []Rule{tb}, 4)
		tb.Period = 24 * time.Hour
		if d := mustAllow(t, s, key, []Rule{tb}, 1); !d.Allowed || d.Rules[0].Remaining != 5 {
			t.Errorf("token bucket after 1h → 24h: Allow = %+v, want allowed with 5 remaining", d.Rules[0])
		}
	})
}

// TestLargeRules (row 8): rules whose limit × period passes int64 (and
// 2^53, where Lua's doubles stop being exact) count exactly. Before: the
// memory store denied the first request with Retry-After 0.
func TestLargeRules(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		name string
		rule Rule
	}{
		{"5M per 30 days", Rule{Name: "r", Limit: 5_000_000, Period: 30 * day, Algorithm: SlidingWindow}},
		{"200M per day", Rule{Name: "r", Limit: 200_000_000, Period: day, Algorithm: SlidingWindow}},
		{"largest sliding window", Rule{Name: "r", Limit: maxCapacity, Period: MaxPeriod, Algorithm: SlidingWindow}},
		{"1e9 per 30 days", Rule{Name: "r", Limit: 1_000_000_000, Period: 30 * day}},
		{"largest bucket", Rule{Name: "r", Limit: maxCapacity, Period: MaxPeriod}},
		{"odd rate", Rule{Name: "r", Limit: 999_999_937, Period: 29*day + 7*time.Microsecond, Burst: maxCapacity - 3}},
	}
	forEachStore(t, func(t *testing.T, s store) {
		for _, tt := range tests {
			key := uniqueKey(t) + strings.ReplaceAll(tt.name, " ", "")
			rules := []Rule{tt.rule}
			c := tt.rule.Capacity()
			// One unit refills (or the window slides) after about
			// Period/Limit; never sooner, and at most a window away.
			perUnit := time.Duration(float64(tt.rule.Period) / float64(tt.rule.Limit))
			first := mustAllow(t, s, key, rules, 1)
			if !first.Allowed || first.Rules[0].Remaining != c-1 {
				t.Errorf("%s: first Allow = %+v, want allowed with %d remaining", tt.name, first.Rules[0], c-1)
				continue
			}
			drained := mustAllow(t, s, key, rules, c-1)
			// A fast bucket (the largest: one unit every 8ms) may refill a
			// unit between the calls on a loaded machine, by the store's
			// own clock; never more.
			refilled := int64(0)
			if tt.rule.algorithm() == TokenBucket {
				refilled = int64(drained.Time.Sub(first.Time) / perUnit)
			}
			if !drained.Allowed || drained.Rules[0].Remaining > refilled {
				t.Errorf("%s: Allow(rest %d) = %+v, want allowed with %d remaining at most", tt.name, c-1, drained.Rules[0], refilled)
				continue
			}
			if drained.Rules[0].Remaining > 0 {
				continue // refilled meanwhile: what follows assumes empty
			}
			d := mustAllow(t, s, key, rules, 1)
			if d.Allowed {
				// A fast rule (1e9 per 30 days: one every 2.6ms) may have
				// refilled one unit meanwhile, by the store's own clock:
				// since the first call, as the drain left the fraction
				// refilled before it in the bucket.
				if since := d.Time.Sub(first.Time); tt.rule.algorithm() == SlidingWindow || since < perUnit {
					t.Errorf("%s: Allow %v after draining = %+v, want denied", tt.name, since, d)
				}
			} else if ra := d.RetryAfter(); ra < perUnit-time.Second || ra > 2*tt.rule.Period {
				t.Errorf("%s: Allow after draining = %+v, want RetryAfter about %v", tt.name, d, perUnit)
			}
		}
	})
}

// TestSlidingWindowBound (row 5) pins what the sliding window counter
// guarantees (see SlidingWindow): at most Limit in each fixed window, and
// at most 2×Limit−1 in any interval of Period — a bound it can reach,
// which is why the old claim "never more than Limit in any Period" was
// wrong. A token bucket with Burst 1 is the exact way to forbid bursts.
func TestSlidingWindowBound(t *testing.T) {
	clock := newFakeClock()
	m := NewMemory(clock.Now, 0)
	s := store{a: m, wait: clock.Add, now: clock.Now}
	period := 2 * time.Second
	for _, tc := range []struct {
		rule Rule
		want int // the most admitted in any interval of period
	}{
		{Rule{Name: "sw", Limit: 10, Period: period, Algorithm: SlidingWindow}, 19},
		{Rule{Name: "gcra", Limit: 10, Period: period, Burst: 1}, 10},
	} {
		key := uniqueKey(t) + tc.rule.Name
		rules := []Rule{tc.rule}
		alignToWindow(t, s, period)
		// Idle until the end of the window, then hammer every 1ms for 2 periods.
		s.wait(period - time.Duration(clock.Now().UnixMicro()%period.Microseconds())*time.Microsecond - 50*time.Millisecond)
		var times []time.Time
		for range 2 * period / time.Millisecond {
			if mustAllow(t, s, key, rules, 1).Allowed {
				times = append(times, clock.Now())
			}
			s.wait(time.Millisecond)
		}
		most := 0
		for i := range times {
			j := i
			for j < len(times) && times[j].Sub(times[i]) < period {
				j++
			}
			most = max(most, j-i)
		}
		if most != tc.want {
			t.Errorf("%s: at most %d admitted within %v, want %d", tc.rule.Name, most, period, tc.want)
		}
	}
}

// TestRemainingWithinCapacity (row 13): Remaining never exceeds Capacity,
// and Capacity per Window is the quota to advertise beside it.
func TestRemainingWithinCapacity(t *testing.T) {
	tests := []struct {
		rule       Rule
		wantWindow time.Duration
	}{
		{Rule{Name: "a", Limit: 10, Period: time.Second, Burst: 50}, 5 * time.Second},
		{Rule{Name: "a", Limit: 100, Period: time.Minute, Burst: 10}, 6 * time.Second},
		{Rule{Name: "a", Limit: 3, Period: time.Second, Burst: 1}, 333334 * time.Microsecond},
		{Rule{Name: "a", Limit: 10, Period: time.Second}, time.Second},
		{Rule{Name: "a", Limit: 10, Period: time.Second, Burst: 50, Algorithm: SlidingWindow}, time.Second},
	}
	for _, tt := range tests {
		if got := tt.rule.Window(); got != tt.wantWindow {
			t.Errorf("%+v.Window() = %v, want %v", tt.rule, got, tt.wantWindow)
		}
	}
	forEachStore(t, func(t *testing.T, s store) {
		for _, tt := range tests {
			d := mustAllow(t, s, uniqueKey(t)+fmt.Sprint(tt.rule.Burst), []Rule{tt.rule}, 1)
			if r := d.Rules[0]; r.Remaining > tt.rule.Capacity() || r.Remaining != tt.rule.Capacity()-1 {
				t.Errorf("%+v: Remaining = %d, want %d (≤ Capacity %d)", tt.rule, r.Remaining, tt.rule.Capacity()-1, tt.rule.Capacity())
			}
		}
	})
}

// TestDecisionTime: a decision reports the store's clock.
func TestDecisionTime(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		before := s.now()
		d := mustAllow(t, s, uniqueKey(t), []Rule{{Name: "a", Limit: 1, Period: time.Second}}, 1)
		after := s.now()
		if d.Time.Before(before) || d.Time.After(after) {
			t.Errorf("Decision.Time = %v, want within [%v, %v]", d.Time, before, after)
		}
	})
}

// TestOlderScriptState: states in the previous layout written by an older
// allow.lua (no rule fields) are read as written under the current rule,
// and a sliding window whose index runs ahead (the old period-change
// freeze) recovers.
func TestOlderScriptState(t *testing.T) {
	rdb := mustRedis(t)
	l := mustLimiter(t, rdb, Config{DenyCache: -1, PreviousLayout: true})
	ctx := context.Background()
	key := uniqueKey(t)
	rules := []Rule{
		{Name: "tb", Limit: 10, Period: time.Hour},
		{Name: "sw", Limit: 5, Period: 200 * time.Millisecond, Algorithm: SlidingWindow},
	}
	keys := []string{ruleKey("rl", key, rules[0]), ruleKey("rl", key, rules[1])}
	now := redisTime(t, rdb).UnixMicro()
	// 4 tokens left a moment ago; a window index 1000 periods ahead.
	rdb.HSet(ctx, keys[0], "tk", 4_000_000, "ts", now)
	rdb.HSet(ctx, keys[1], "w", now/200_000+1000, "c", 3, "p", 1)
	d, err := l.Allow(ctx, key, rules[:1], 1)
	if err != nil || !d.Allowed || d.Rules[0].Remaining != 3 {
		t.Errorf("old token bucket state: Allow = %+v, %v; want allowed with 3 remaining", d, err)
	}
	d, err = l.Allow(ctx, key, rules[1:], 2)
	if err != nil || d.Allowed {
		t.Fatalf("old frozen window (4 used): Allow(2) = %+v, %v; want denied", d, err)
	}
	time.Sleep(d.RetryAfter())
	if d, err = l.Allow(ctx, key, rules[1:], 2); err != nil || !d.Allowed {
		t.Errorf("old frozen window after RetryAfter: Allow(2) = %+v, %v; want allowed", d, err)
	}
}

// TestShareGrows: a split's share that grows keeps the tokens it had. Its
// units moved from another gateway's share, whose bucket only clamps, so
// adding the difference (what a raised limit gets, TestRaisedLimit) minted
// them on every resize. Before: both gateways drained, each swap of a
// 50:50 split to 65:35 and back admitted 15 more. The period is a day, so
// the refill in the test's run is far below a unit.
func TestShareGrows(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		for _, rule := range []Rule{
			{Name: "day", Limit: 100, Period: 24 * time.Hour},
			{Name: "burst", Limit: 1000, Period: 24 * time.Hour, Burst: 100},
		} {
			key := uniqueKey(t) + rule.Name
			split := func(a float64) *Directives {
				return &Directives{Splits: map[string]SplitDirective{key: {Key: key, Shares: map[string]float64{"a": a, "b": 1 - a}, Expires: s.now().Add(time.Hour)}}}
			}
			drain := func(d *Directives, gw string) (admitted int64) {
				k, rules, ok := d.Split(key, gw, []Rule{rule}, s.now())
				if !ok || !rules[0].Share {
					t.Fatalf("Split(%q, %q) = %+v, %v: want a share", key, gw, rules, ok)
				}
				for mustAllow(t, s, k, rules, 1).Allowed {
					admitted++
					if admitted > rule.Capacity() {
						t.Fatalf("%s: gateway %s admitted more than the whole capacity %d", rule.Name, gw, rule.Capacity())
					}
				}
				return admitted
			}
			first := drain(split(0.5), "a") + drain(split(0.5), "b")
			if first != rule.Capacity() {
				t.Fatalf("%s: split 50:50 admitted %d, want the capacity %d", rule.Name, first, rule.Capacity())
			}
			var minted int64
			for i := range 6 {
				a := 0.65
				if i%2 == 1 {
					a = 0.5
				}
				minted += drain(split(a), "a") + drain(split(a), "b")
			}
			if minted != 0 {
				t.Errorf("%s: drained shares resized 6 times admitted %d more, want 0 (a day's refill is far below a unit)", rule.Name, minted)
			}
		}
	})
}

// TestFullShareGrows: a share that reads as full is full at its new size,
// as a bucket without state is, whether or not the store still holds the
// full state (Redis keeps it a second, the memory store forgets it).
func TestFullShareGrows(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		key := uniqueKey(t)
		rule := []Rule{{Name: "sec", Limit: 100, Period: 100 * time.Millisecond, Share: true}}
		half, more := rule[0], rule[0]
		half.Limit, more.Limit = 50, 65
		if d := mustAllow(t, s, key, []Rule{half}, 1); !d.Allowed {
			t.Fatalf("Allow(1 of 50) = %+v, want allowed", d)
		}
		s.wait(200 * time.Millisecond) // refills to full, well within the state's second
		admitted := int64(0)
		for mustAllow(t, s, key, []Rule{more}, 1).Allowed && admitted <= 1000 {
			admitted++
		}
		if admitted < 65 {
			t.Errorf("full share of 50 grown to 65: admitted %d, want at least 65", admitted)
		}
	})
}

// TestGiveBack: a rule with a negative Cost gives back exactly what
// it names, never past the capacity (token bucket) or below an empty
// current window (sliding window), always admits, and like every rule
// changes nothing when another rule of the check denies.
func TestGiveBack(t *testing.T) {
	ctx := context.Background()
	forEachStore(t, func(t *testing.T, s store) {
		for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
			t.Run(string(algo), func(t *testing.T) {
				m := s.a.(interface {
					allower
					Inspect(context.Context, string, []Rule) (KeyState, error)
				})
				k := uniqueKey(t)
				rule := Rule{Name: "r", Limit: 10, Period: time.Hour, Algorithm: algo}
				give := func(n int64) Rule { r := rule; r.Cost = -n; return r }
				remaining := func() int64 {
					t.Helper()
					ks, err := m.Inspect(ctx, k, []Rule{rule})
					if err != nil {
						t.Fatal(err)
					}
					return ks.Rules[0].Remaining
				}
				if d, _ := m.Allow(ctx, k, []Rule{rule}, 7); !d.Allowed {
					t.Fatalf("Allow(7) = %+v, want allowed", d)
				}
				d, err := m.Allow(ctx, k, []Rule{give(3)}, 1)
				if err != nil || !d.Allowed || d.Rules[0].Remaining != 6 {
					t.Fatalf("give back 3 = %+v, %v; want allowed with 6 remaining", d, err)
				}
				if got := remaining(); got != 6 {
					t.Errorf("after giving back 3 of 7: %d remaining, want 6", got)
				}
				// More than was used: full, never above.
				if d, _ := m.Allow(ctx, k, []Rule{give(MaxCost)}, 1); !d.Allowed || d.Rules[0].Remaining != 10 {
					t.Errorf("give back 2^53 = %+v, want allowed with 10 (the capacity) remaining", d)
				}
				if got := remaining(); got != 10 {
					t.Errorf("after giving back 2^53: %d remaining, want 10", got)
				}
				if d, _ := m.Allow(ctx, k, []Rule{rule}, 10); !d.Allowed {
					t.Errorf("Allow(10) when full = %+v, want allowed", d)
				}
				if d, _ := m.Allow(ctx, k, []Rule{rule}, 1); d.Allowed {
					t.Errorf("Allow(1) after 10 = %+v, want denied: the give-back added nothing above the capacity", d)
				}
				m.Allow(ctx, k, []Rule{give(5)}, 1)

				// All-or-nothing: a give-back beside a denying rule gives nothing.
				other := Rule{Name: "other", Limit: 1, Period: time.Hour, Algorithm: algo}
				d, _ = m.Allow(ctx, k, []Rule{give(2), other}, 2)
				if d.Allowed || !d.Rules[0].Allowed {
					t.Fatalf("give-back beside a denial = %+v, want denied, the give-back's own rule admitting", d)
				}
				if got := remaining(); got != 5 {
					t.Errorf("after a denied check with a give-back: %d remaining, want 5 (unchanged)", got)
				}
				// Beside a rule that admits, both apply in the one check.
				if d, _ := m.Allow(ctx, k, []Rule{give(2), other}, 1); !d.Allowed {
					t.Fatalf("give-back beside an admitting rule = %+v, want allowed", d)
				}
				if got := remaining(); got != 7 {
					t.Errorf("after giving back 2 beside another rule: %d remaining, want 7", got)
				}
			})
		}
	})
}
