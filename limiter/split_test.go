package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/ratemodel"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// farFuture is a split's expiry past every clock of these tests (the memory
// store's fake one starts in 2027).
var farFuture = time.Unix(1<<34, 0)

func splitOf(key string, shares map[string]float64) *Directives {
	return &Directives{Splits: map[string]SplitDirective{key: {Key: key, Shares: shares, Expires: farFuture}}}
}

// TestSplitSwitchAdmitsTheRuleOnce (issue 28, rows 1 and 2): a switch into
// or out of a split carries what the key used, so a key under a split, out
// of it and back admits the rule once. Through the limiter, any caller:
// the stores check every share with the key's own bucket.
//
// Before: over shared, split, shared, split, 20/min admitted 40 (the
// split's shares 15 + 5 more after the shared bucket's 20), 1000/day 2000,
// a burst of 30 60, a sliding window of 40 88: each split started afresh.
func TestSplitSwitchAdmitsTheRuleOnce(t *testing.T) {
	for name, mk := range storesUnderTest(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := mk(t)
			for _, tc := range []struct {
				name   string
				rule   Rule
				shares map[string]float64
			}{
				{"minute", Rule{Name: "minute", Limit: 20, Period: time.Minute}, map[string]float64{"a": 0.75, "b": 0.25}},
				{"day", Rule{Name: "day", Limit: 1000, Period: 24 * time.Hour}, map[string]float64{"a": 0.5, "b": 0.3, "c": 0.2}},
				{"burst", Rule{Name: "burst", Limit: 600, Period: time.Hour, Burst: 30}, map[string]float64{"a": 0.5, "b": 0.5}},
				{"window", Rule{Name: "window", Limit: 40, Period: time.Hour, Algorithm: SlidingWindow}, map[string]float64{"a": 0.6, "b": 0.4}},
			} {
				key := uniqueKey(t) + tc.name
				gateways := slices.Sorted(func(yield func(string) bool) {
					for g := range tc.shares {
						if !yield(g) {
							return
						}
					}
				})
				var admitted int64
				var first, last time.Time
				drain := func(d *Directives) {
					for _, gw := range gateways {
						k, rules, _ := d.Split(key, gw, []Rule{tc.rule}, s.now())
						for n := 0; n < 10000; n++ {
							dec := mustAllow(t, s, k, rules, 1)
							if first.IsZero() {
								first = dec.Time
							}
							if !dec.Allowed {
								break
							}
							admitted++
							last = dec.Time
						}
					}
				}
				// Shared, split, shared, split, with the other split's
				// shares the second time.
				drain(nil)
				drain(splitOf(key, tc.shares))
				drain(nil)
				other := map[string]float64{}
				for i, g := range gateways {
					other[g] = tc.shares[gateways[(i+1)%len(gateways)]]
				}
				drain(splitOf(key, other))
				// The refill of the run, from the decisions' own times.
				refill := tc.rule.Limit * last.Sub(first).Microseconds() / tc.rule.Period.Microseconds()
				if want := tc.rule.Capacity() + refill; admitted > want {
					t.Errorf("%+v: shared, split %v, shared, split %v admitted %d, want at most %d (the capacity and %d refilled)", tc.rule, tc.shares, other, admitted, want, refill)
				}
			}
		})
	}
}

// TestSplitModel drives a key through random switch sequences (shared;
// splits with shares for two gateways, one not in the fleet, a reserve
// for the others; changed shares; lifts), with two callers per gateway on
// three gateways (two limiters, one of them with its deny cache, as two
// gateways' would), and one gateway switching late, a random part into
// each phase, as a gateway polling the directives a second later does.
// Every admission, through the shared bucket or any share, is replayed in
// the stores' time order through the exact model of the key's rule
// (internal/ratemodel): each must have room in it, with no tolerance, so
// the key admits at most the rule in every window, whatever the switches.
//
// Before: 100 to 400 admissions of each rule set without room in the
// model, on every store (a share or the shared bucket started afresh at
// every switch).
func TestSplitModel(t *testing.T) {
	budget := testenv.Duration(t, "EDGELIMIT_MODEL_DURATION", 1600*time.Millisecond)
	for name, mk := range map[string]func(t *testing.T) ([]allower, func() time.Time){
		"memory": func(t *testing.T) ([]allower, func() time.Time) {
			var mu sync.Mutex
			now := time.Unix(1_800_000_000, 0)
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				now = now.Add(time.Duration(1 + rand.Int64N(int64(200*time.Microsecond))))
				return now
			}
			return []allower{NewMemory(clock, 0)}, clock
		},
		"redis": func(t *testing.T) ([]allower, func() time.Time) {
			rdb := mustRedis(t)
			return []allower{mustLimiter(t, rdb, Config{DenyCache: -1}), mustLimiter(t, rdb, Config{})}, time.Now
		},
		"redis-cluster": func(t *testing.T) ([]allower, func() time.Time) {
			rdb := mustCluster(t)
			return []allower{mustLimiter(t, rdb, Config{DenyCache: -1}), mustLimiter(t, rdb, Config{})}, time.Now
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := testenv.Seed(t, "EDGELIMIT_MODEL_SEED")
			stores, clock := mk(t)
			_, memory := stores[0].(*Memory)
			r := rand.New(rand.NewPCG(seed, 28))
			sets := splitRuleSets(r, memory)
			phaseLen := 150 * time.Millisecond
			phases := max(4, int(budget/phaseLen))
			if memory {
				phases = 24
			}
			t.Logf("seed %d (EDGELIMIT_MODEL_SEED), %d phases", seed, phases)
			keys := make([]string, len(sets))
			for i := range sets {
				keys[i] = uniqueKey(t) + strconv.Itoa(i)
			}
			gateways := []string{"gw-a", "gw-b", "gw-c"}
			var prev, cur []*Directives // by set
			for range sets {
				prev, cur = append(prev, nil), append(cur, nil)
			}
			var events []splitEvent
			var mu sync.Mutex
			for p := range phases {
				copy(prev, cur)
				for i := range sets {
					cur[i] = drawSplit(r, keys[i])
				}
				lag := time.Duration(r.Int64N(int64(phaseLen)))
				start := time.Now()
				var calls atomic.Int64
				more := func() bool {
					if memory {
						return calls.Add(1) <= 600
					}
					return time.Since(start) < phaseLen
				}
				var wg sync.WaitGroup
				for c := range 2 * len(gateways) {
					wg.Go(func() {
						cr := rand.New(rand.NewPCG(seed, uint64(1000*p+c)))
						gw := gateways[c%len(gateways)]
						s := stores[c%len(stores)]
						var mine []splitEvent
						for more() {
							set := cr.IntN(len(sets))
							d := cur[set]
							if gw == "gw-b" && time.Since(start) < lag {
								d = prev[set] // this gateway has not read the change yet
							}
							rules := sets[set]
							cost := 1 + cr.Int64N(min(3, minCapacity(rules)))
							k, rs, split := d.Split(keys[set], gw, rules, clock())
							dec, err := s.Allow(context.Background(), k, rs, cost)
							if err != nil {
								t.Errorf("Allow(%q): %v", k, err)
								return
							}
							if dec.Allowed {
								mine = append(mine, splitEvent{set: set, phase: p, at: dec.Time.UnixNano(), cost: cost, split: split, gw: gw})
							}
							if !memory {
								time.Sleep(time.Duration(cr.Int64N(int64(time.Millisecond))))
							}
						}
						mu.Lock()
						events = append(events, mine...)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			for i, rules := range sets {
				replaySplits(t, seed, rules, events, i)
			}
		})
	}
}

type splitEvent struct {
	set, phase int
	at         int64 // ns, as the decision reports it
	cost       int64
	split      bool
	gw         string
}

// splitRuleSets are the keys' rules: a token bucket, a GCRA, a sliding
// window, and all three with a long quota (which a split divides too).
func splitRuleSets(r *rand.Rand, memory bool) [][]Rule {
	period := func() time.Duration {
		return 40*time.Millisecond + time.Duration(r.Int64N(int64(200*time.Millisecond)))
	}
	if memory {
		period = func() time.Duration { return 10*time.Millisecond + time.Duration(r.Int64N(int64(2*time.Second))) }
	}
	tb := Rule{Name: "tb", Limit: 8 + r.Int64N(40), Period: period()}
	if r.IntN(2) == 0 {
		tb.Burst = 3 + r.Int64N(2*tb.Limit)
	}
	gcra := Rule{Name: "gcra", Limit: 20 + r.Int64N(60), Period: period(), Burst: 4}
	sw := Rule{Name: "sw", Limit: 8 + r.Int64N(40), Period: period(), Algorithm: SlidingWindow}
	quota := Rule{Name: "quota", Limit: 300 + r.Int64N(300), Period: time.Hour}
	return [][]Rule{{tb}, {gcra}, {sw}, {tb, gcra, sw, quota}}
}

func minCapacity(rules []Rule) int64 {
	c := int64(maxCapacity)
	for _, r := range rules {
		c = min(c, r.Capacity())
	}
	return c
}

// drawSplit draws the next phase's directive for key: none (the shared
// bucket), or shares for some of gw-a and gw-b, maybe a gateway not in the
// fleet, maybe a reserve for the others (gw-c checks it).
func drawSplit(r *rand.Rand, key string) *Directives {
	if r.IntN(3) == 0 {
		return nil
	}
	shares := map[string]float64{"gw-a": 0.1 + r.Float64()}
	if r.IntN(3) != 0 {
		shares["gw-b"] = 0.1 + r.Float64()
	}
	if r.IntN(3) == 0 {
		shares["gw-x"] = 0.1 + r.Float64()
	}
	if r.IntN(2) == 0 {
		shares[OtherGateways] = 0.01 + 0.3*r.Float64()
	}
	sum := 0.0
	for _, s := range shares {
		sum += s
	}
	for g := range shares {
		shares[g] /= sum
	}
	return splitOf(key, shares)
}

// replaySplits replays set's admissions, shared and split alike, through
// the exact model of each of its rules.
func replaySplits(t *testing.T, seed uint64, rules []Rule, events []splitEvent, set int) {
	t.Helper()
	var mine []splitEvent
	for _, e := range events {
		if e.set == set {
			mine = append(mine, e)
		}
	}
	if len(mine) == 0 {
		t.Errorf("set %d: nothing admitted", set)
		return
	}
	slices.SortStableFunc(mine, func(a, b splitEvent) int { return cmp.Compare(a.at, b.at) })
	models := make([]ratemodel.Model, len(rules))
	for i, r := range rules {
		models[i] = ratemodel.New(modelRule(r), mine[0].at/1000)
	}
	over, split := 0, 0
	var units int64
	for _, e := range mine {
		at := e.at / 1000
		for i, m := range models {
			if room := m.Room(at, e.cost); room.Sign() < 0 {
				over++
				if over <= 3 {
					t.Errorf("seed %d (EDGELIMIT_MODEL_SEED=%d): phase %d, t=%dµs: %s admitted cost %d (split %v) under %+v, the model has %s too few",
						seed, seed, e.phase, at, e.gw, e.cost, e.split, rules[i], new(big.Rat).Neg(room).FloatString(3))
				}
			}
			m.Take(at, e.cost)
		}
		units += e.cost
		if e.split {
			split++
		}
	}
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = fmt.Sprintf("%s %d/%v", r.Name, r.Limit, r.Period)
	}
	t.Logf("rules %v: %d admissions (%d through shares), %d units; %d without room in the model", names, len(mine), split, units, over)
}

// TestSplitCheckValidates: a share names its whole's key by the check's
// key, so a check whose key or rules disagree is bad input, not a check of
// some other bucket.
func TestSplitCheckValidates(t *testing.T) {
	d := splitOf("k", map[string]float64{"a": 0.5, "b": 0.5})
	key, rules, _ := d.Split("k", "a", []Rule{{Name: "m", Limit: 10, Period: time.Minute}, {Name: "h", Limit: 100, Period: time.Hour}}, time.Now())
	_, other, _ := d.Split("k", "b", rules[:1], time.Now())
	above := slices.Clone(rules)
	above[0].Whole.Limit = 2
	for _, tc := range []struct {
		name  string
		key   string
		rules []Rule
	}{
		{"another key", "k/gw:b", rules},
		{"no gateway suffix", "k", rules},
		{"only the suffix", "/gw:a", rules},
		{"two gateways' shares", key, []Rule{rules[1], other[0]}},
		{"a share above its whole", key, above},
	} {
		if _, err := NewMemory(nil, 0).Allow(context.Background(), tc.key, tc.rules, 1); !errors.Is(err, ErrInput) {
			t.Errorf("%s: Allow(%q) error %v, want ErrInput", tc.name, tc.key, err)
		}
	}
	if d, err := NewMemory(nil, 0).Allow(context.Background(), key, rules, 1); err != nil || !d.Allowed {
		t.Errorf("Allow(%q, the split's rules) = %+v, %v; want allowed", key, d, err)
	}
}

// TestClearSplitShare: Clear of a split's key deletes its share's state,
// which lives beside the key's own (the admin API's clear under a split).
func TestClearSplitShare(t *testing.T) {
	type admin interface {
		allower
		Clear(ctx context.Context, key string) error
		Inspect(ctx context.Context, key string, rules []Rule) (KeyState, error)
	}
	for name, mk := range exactStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := mk(t)
			a := s.a.(admin)
			base := uniqueKey(t)
			k, rules, _ := splitOf(base, map[string]float64{"a": 0.5, "b": 0.5}).Split(base, "a", []Rule{{Name: "m", Limit: 10, Period: time.Hour}}, s.now())
			mustAllow(t, s, k, rules, 3)
			ctx := context.Background()
			if ks, err := a.Inspect(ctx, k, rules); err != nil || !ks.Rules[0].Found || ks.Rules[0].Remaining != 2 {
				t.Fatalf("Inspect(%q) after 3 of 5 = %+v, %v; want 2 left", k, ks, err)
			}
			if err := a.Clear(ctx, k); err != nil {
				t.Fatal(err)
			}
			if ks, err := a.Inspect(ctx, k, rules); err != nil || ks.Rules[0].Found {
				t.Errorf("Inspect(%q) after Clear = %+v, %v; want no state", k, ks, err)
			}
		})
	}
}
