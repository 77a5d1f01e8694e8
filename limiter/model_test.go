package limiter

import (
	"cmp"
	"context"
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

// The reference model (internal/ratemodel): one exact model of each
// algorithm, in plain Go with exact rationals and the time passed in,
// written from the documented semantics and sharing no code with the
// stores; gateway.TestGatewayModel uses it too. TestModel drives the real
// stores with concurrent callers, random costs (the call's, and rules' own
// Rule.Cost) and rule changes, then
// replays every decision through the model, in the order of the times the
// decisions report:
//
//   - every admitted request must be admissible by the model, given what
//     the store admitted before it (so admitted ≤ the model's bound over
//     every window, with no tolerance);
//   - every rule's own verdict must match: a rule that admitted (even in a
//     request another rule denied) must have room in the model, and one
//     that denied must not, but for a stated tolerance. The stores round
//     in their own favour: a token bucket by under a micro-token per write
//     (tolerance 3e-6 tokens per write so far), a sliding window by 1/2^20
//     of the previous window's count (tolerance 2×prev/2^20, plus one unit
//     in a window that carried use over from another period, which the
//     store rounds up);
//   - a token bucket's RetryAfter is the model's wait for the missing
//     tokens, never earlier by a microsecond, later by at most the
//     tolerance's tokens' worth plus 3µs;
//   - the documented corollaries hold over every window of one Period:
//     at most Capacity + Limit units for a token bucket, at most 2×Limit−1
//     for a sliding window.
//
// Time. Redis reads its own clock (TIME), which the test cannot control or
// read at the same instant, so the model is driven by the time each
// decision reports (Decision.Time: the microsecond the script used), not by
// the caller's wall time. Decisions on one key are serialized by Redis, and
// TIME only moves forward, so sorting by reported time recovers the order
// the store decided in. Ties (two scripts in the same microsecond) are
// replayed admissions first, which is the order least favourable to the
// tolerance check and irrelevant to the bound check. The memory store gets
// a fake clock that advances on every read; it reads it under its lock, so
// times are unique and in decision order, to the nanosecond (two
// decisions may share a microsecond, and are replayed in clock order).
//
// Rule changes take effect in a store at the first call that sees the new
// rule (it cannot know when the configuration changed), so the test
// changes rules between phases, with every caller stopped, and the model
// converts its state at the first decision of a new phase: a token bucket
// refills at the old rate up to then, and a changed capacity carries what
// was used (a lowered one may overdraw it; a share's growth adds nothing,
// its shrinking clamps); a sliding window whose period changed carries
// what it had used.
//
// EDGELIMIT_MODEL_SEED reproduces a run's rules and costs (the interleaving
// of real goroutines and Redis' clock are not reproducible);
// EDGELIMIT_MODEL_DURATION sets the budget per store (default 1.6s; make
// soak runs it longer).

// modelRule is r as the reference model (internal/ratemodel) sees it.
func modelRule(r Rule) ratemodel.Rule {
	return ratemodel.Rule{Limit: r.Limit, Period: r.Period, Capacity: r.Capacity(), Sliding: r.algorithm() == SlidingWindow, Share: r.Share}
}

func ratInt(n int64) *big.Rat { return ratemodel.Int(n) }

// tolerance is how far below the model a store's rounding may leave it.
func tolerance(m ratemodel.Model, now int64, writes int) *big.Rat {
	switch m := m.(type) {
	case *ratemodel.Bucket:
		return new(big.Rat).SetFrac64(3*int64(writes+1), micro)
	case *ratemodel.Window:
		_, prev, carried := m.Used(now)
		t := new(big.Rat).SetFrac64(2*prev, swDenom)
		if carried {
			t.Add(t, ratInt(1))
		}
		return t
	}
	panic("unknown model")
}

type modelEvent struct {
	set   int // which key and rule set
	phase int
	at    int64 // µs, as the decision reports it
	// ns orders events within a microsecond: the memory store's fake
	// clock is unique to the nanosecond, Redis' TIME only to the µs
	// (its ties are broken as the comment on Time says).
	ns      int64
	cost    int64 // the call's
	allowed bool
	rules   []RuleResult // each rule's own verdict, under the rule as sent
}

// charge is what the event charged rule i: its own Cost, else the call's.
func (e modelEvent) charge(i int) int64 { return e.rules[i].Rule.charge(e.cost) }

// replay checks a run's decisions against the model; phases[i] are the
// rules in effect in phase i.
func replay(t *testing.T, phases [][]Rule, events []modelEvent, seed uint64) (admitted, denied int) {
	t.Helper()
	slices.SortStableFunc(events, func(a, b modelEvent) int {
		switch {
		case a.ns != b.ns:
			return cmp.Compare(a.ns, b.ns)
		case a.allowed != b.allowed:
			if a.allowed {
				return -1
			}
			return 1
		}
		return 0
	})
	var models []ratemodel.Model
	phase, writes := -1, 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("seed %d (EDGELIMIT_MODEL_SEED=%d to reproduce): "+format, append([]any{seed, seed}, args...)...)
	}
	failures := 0
	for _, e := range events {
		if failures > 5 {
			break
		}
		if e.phase != phase {
			if e.phase < phase {
				fail("phase %d decision at %d after phase %d: the store's clock ran backwards", e.phase, e.at, phase)
			}
			phase = e.phase
			for i, r := range phases[phase] {
				if models == nil || len(models) <= i {
					models = append(models, ratemodel.New(modelRule(r), e.at))
				} else {
					models[i].Change(modelRule(r), e.at)
				}
			}
		}
		rooms := make([]*big.Rat, len(models))
		for i, m := range models {
			rooms[i] = m.Room(e.at, e.charge(i))
		}
		if e.allowed {
			admitted++
			for i, m := range models {
				if r := e.rules[i]; r.Rule.Shadow && !r.Allowed {
					// A shadow rule that denied consumes nothing, and its
					// denial must be the model's.
					if rooms[i].Cmp(tolerance(m, e.at, writes)) >= 0 {
						failures++
						fail("phase %d, t=%dµs: shadow %+v denied cost %d, the model admits it with room %s", phase, e.at, r.Rule, e.charge(i), rooms[i].FloatString(6))
					}
					continue
				}
				if rooms[i].Sign() < 0 {
					failures++
					fail("phase %d, t=%dµs: %+v admitted cost %d, the model has %s too few", phase, e.at, phases[phase][i], e.charge(i), new(big.Rat).Neg(rooms[i]).FloatString(6))
				}
				m.Take(e.at, e.charge(i))
			}
			writes++
			continue
		}
		denied++
		// Each rule's own verdict: one that admitted must have room in
		// the model; one that denied must not, but for the tolerance, and
		// a token bucket's RetryAfter must be the model's wait, never
		// earlier and later only by the tolerance.
		for i, m := range models {
			rr := e.rules[i]
			tol := tolerance(m, e.at, writes)
			switch {
			case rr.Allowed && rooms[i].Sign() < 0:
				failures++
				fail("phase %d, t=%dµs: %+v alone admitted cost %d, the model has %s too few", phase, e.at, rr.Rule, e.charge(i), new(big.Rat).Neg(rooms[i]).FloatString(6))
			case !rr.Allowed && rooms[i].Cmp(tol) >= 0:
				failures++
				fail("phase %d, t=%dµs: %+v denied cost %d, the model admits it with room %s", phase, e.at, rr.Rule, e.charge(i), rooms[i].FloatString(6))
			case !rr.Allowed:
				if b, ok := m.(*ratemodel.Bucket); ok {
					checkRetry(fail, &failures, phase, e, rr, b, rooms[i], tol)
				}
			}
		}
	}
	checkWindows(t, phases, events, seed)
	return admitted, denied
}

// checkRetry compares a token bucket's RetryAfter with the model's wait
// for the missing tokens, (cost − tokens) × Period / Limit.
func checkRetry(fail func(string, ...any), failures *int, phase int, e modelEvent, rr RuleResult, b *ratemodel.Bucket, room, tol *big.Rat) {
	perToken := new(big.Rat).SetFrac64(b.Rule.Period.Microseconds(), b.Rule.Limit)
	want := new(big.Rat).Mul(new(big.Rat).Neg(room), perToken) // µs
	if want.Sign() < 0 {
		want.SetInt64(0)
	}
	if want.Cmp(ratInt(maxWait)) > 0 {
		want.SetInt64(maxWait) // the stores' cap, about 285 years
	}
	slack := new(big.Rat).Mul(tol, perToken)
	slack.Add(slack, ratInt(3))
	got := ratInt(rr.RetryAfter.Microseconds())
	if got.Cmp(want) < 0 || got.Cmp(new(big.Rat).Add(want, slack)) > 0 {
		*failures++
		fail("phase %d, t=%dµs: %+v cost %d: RetryAfter %v, the model's wait is %sµs (+%sµs tolerance)", phase, e.at, rr.Rule, rr.Rule.charge(e.cost), rr.RetryAfter, want.FloatString(1), slack.FloatString(1))
	}
}

func ratStrings(rs []*big.Rat) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.FloatString(6)
	}
	return out
}

// checkWindows asserts the documented bounds over every window of one
// Period inside a phase: Capacity + Limit units for a token bucket,
// 2×Limit−1 for a sliding window.
func checkWindows(t *testing.T, phases [][]Rule, events []modelEvent, seed uint64) {
	t.Helper()
	for p, rules := range phases {
		for k, r := range rules {
			// Units in [adm[i].at, adm[i].at + Period), for every i.
			var adm []modelEvent
			for _, e := range events {
				if e.phase == p && e.allowed && e.rules[k].Allowed {
					adm = append(adm, e)
				}
			}
			bound := r.Capacity() + r.Limit
			if r.algorithm() == SlidingWindow {
				bound = 2*r.Limit - 1
			}
			var sum int64
			j := 0
			for i := range adm {
				for j < len(adm) && adm[j].at-adm[i].at < r.Period.Microseconds() {
					sum += adm[j].charge(k)
					j++
				}
				if sum > bound {
					t.Errorf("seed %d: phase %d: %+v admitted %d units within %v from t=%dµs, documented bound %d", seed, p, r, sum, r.Period, adm[i].at, bound)
					break
				}
				sum -= adm[i].charge(k)
			}
		}
	}
}

// setRule is one of a phase's rules in a rule set, maybe made shadow.
type setRule struct {
	idx    int
	shadow bool
	share  bool // as a split makes it (Rule.Share)
}

// ruleSets are what each key of a run is checked against: each algorithm
// alone, so its model decides alone; all three at once, all-or-nothing;
// a token bucket beside a shadow sliding window; and all three as a
// split's shares, whose raised capacities add nothing.
var ruleSets = [][]setRule{{{0, false, false}}, {{1, false, false}}, {{2, false, false}}, {{0, false, false}, {1, false, false}, {2, false, false}}, {{0, false, false}, {2, true, false}},
	{{0, false, true}, {1, false, true}, {2, false, true}}}

// randomRules draws one phase's rules: a token bucket, a GCRA (burst 4)
// and a sliding window, with the given period range.
func randomRules(r *rand.Rand, minPeriod, MaxPeriod time.Duration) []Rule {
	period := func() time.Duration {
		return minPeriod + time.Duration(r.Int64N(int64(MaxPeriod-minPeriod)))
	}
	tbLimit := 5 + r.Int64N(60)
	var burst int64
	if r.IntN(2) == 0 {
		burst = 3 + r.Int64N(2*tbLimit)
	}
	return []Rule{
		{Name: "tb", Limit: tbLimit, Period: period(), Burst: burst},
		{Name: "gcra", Limit: 20 + r.Int64N(100), Period: period(), Burst: 4},
		{Name: "sw", Limit: 5 + r.Int64N(60), Period: period(), Algorithm: SlidingWindow},
	}
}

// bigRules draws rules near the largest allowed (2^32 units, 400 days),
// whose products pass int64 and 2^53.
func bigRules(r *rand.Rand) []Rule {
	limit := func() int64 { return 1 + r.Int64N(maxCapacity) }
	period := func() time.Duration { return time.Hour + time.Duration(r.Int64N(int64(MaxPeriod-time.Hour))) }
	return []Rule{
		{Name: "tb", Limit: limit(), Period: period(), Burst: limit()},
		{Name: "gcra", Limit: limit(), Period: period(), Burst: 1 + r.Int64N(1000)},
		{Name: "sw", Limit: limit(), Period: period(), Algorithm: SlidingWindow},
	}
}

// maxCost is the largest cost drawn for a phase: a few units, or for big
// rules a good share of the smallest capacity.
func maxCost(rules []Rule) int64 {
	c := int64(maxCapacity)
	for _, r := range rules {
		c = min(c, r.Capacity())
	}
	if c > 1000 {
		return c / 3
	}
	return min(c, 3)
}

// phaseRules draws a phase's rules: usually ordinary ones in the period
// range, one phase in four big ones.
func phaseRules(r *rand.Rand, minPeriod, MaxPeriod time.Duration) []Rule {
	if r.IntN(4) == 0 {
		return bigRules(r)
	}
	return randomRules(r, minPeriod, MaxPeriod)
}

// phaseLen is one phase of a Redis run; several periods of its rules.
const phaseLen = 400 * time.Millisecond

func TestModel(t *testing.T) {
	budget := testenv.Duration(t, "EDGELIMIT_MODEL_DURATION", 1600*time.Millisecond)
	phases := max(2, int(budget/phaseLen))
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		seed := testenv.Seed(t, "EDGELIMIT_MODEL_SEED")
		t.Logf("seed %d, %d phases", seed, phases)
		r := rand.New(rand.NewPCG(seed, 1))
		var rules [][]Rule
		for range phases {
			rules = append(rules, phaseRules(r, 10*time.Millisecond, 10*time.Second))
		}
		// A fake clock that advances on every read, by steps that make
		// demand a few times the rules' rates.
		var mu sync.Mutex
		now := time.Unix(1_800_000_000, 0)
		var step atomic.Int64
		clockRand := rand.New(rand.NewPCG(seed, 2))
		clock := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			now = now.Add(time.Duration(1 + clockRand.Int64N(2*step.Load())))
			return now
		}
		m := NewMemory(clock, 0)
		events := runModel(t, rules, seed, func(p int) {
			// Each call's mean cost takes Window × cost / Capacity to
			// refill; a third of that per call keeps demand above supply.
			st := float64(time.Hour)
			mean := float64(1+maxCost(rules[p])) / 2
			for _, rule := range rules[p] {
				st = min(st, float64(rule.Window())*mean/float64(3*rule.Capacity()))
			}
			step.Store(max(1, int64(st)))
		}, func(p int, calls int) bool { return calls < 500 }, m, nil)
		replaySets(t, rules, events, seed)
	})
	for name, mk := range map[string]func(t *testing.T) []allower{
		"redis": func(t *testing.T) []allower {
			rdb := mustRedis(t)
			return []allower{mustLimiter(t, rdb, Config{DenyCache: -1}), mustLimiter(t, rdb, Config{DenyCache: -1, Senders: 1})}
		},
		"redis-cluster": func(t *testing.T) []allower {
			rdb := mustCluster(t)
			return []allower{mustLimiter(t, rdb, Config{DenyCache: -1}), mustLimiter(t, rdb, Config{DenyCache: -1, Senders: 1})}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := testenv.Seed(t, "EDGELIMIT_MODEL_SEED")
			t.Logf("seed %d, %d phases of %v", seed, phases, phaseLen)
			r := rand.New(rand.NewPCG(seed, 1))
			var rules [][]Rule
			for range phases {
				rules = append(rules, phaseRules(r, 50*time.Millisecond, 300*time.Millisecond))
			}
			lims := mk(t)
			var end time.Time
			events := runModel(t, rules, seed, func(int) { end = time.Now().Add(phaseLen) },
				func(int, int) bool { return time.Now().Before(end) }, lims[0], lims[1:])
			replaySets(t, rules, events, seed)
		})
	}
}

// runModel runs the phases against the stores (callers split between them,
// as between gateways): 8 callers with random costs and pauses; start(p)
// runs before phase p, more(p, calls) says whether a caller goes on.
func runModel(t *testing.T, rules [][]Rule, seed uint64, start func(p int), more func(p, calls int) bool, first allower, others []allower) []modelEvent {
	t.Helper()
	const callers = 8
	stores := append([]allower{first}, others...)
	key := uniqueKey(t)
	sets := setRules(rules)
	var mu sync.Mutex
	var events []modelEvent
	_, isMemory := first.(*Memory)
	for p := range rules {
		start(p)
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, uint64(1000*p+c+10)))
				s := stores[c%len(stores)]
				var mine []modelEvent
				for n := 0; more(p, n); n++ {
					set := r.IntN(len(sets))
					rules := sets[set][p]
					cost := 1 + r.Int64N(maxCost(rules))
					if r.IntN(2) == 0 {
						// Half the calls charge some rules a cost of their
						// own (Rule.Cost, the Envoy door's per-descriptor
						// hits_addend), each drawn like the call's.
						rules = slices.Clone(rules)
						for i := range rules {
							if r.IntN(2) == 0 {
								rules[i].Cost = 1 + r.Int64N(maxCost(rules))
							}
						}
					}
					d, err := s.Allow(context.Background(), key+strconv.Itoa(set), rules, cost)
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					if d.Reason != "" || d.Cached {
						t.Errorf("Allow(cost %d) = %+v: want a store decision", cost, d)
						return
					}
					mine = append(mine, modelEvent{set: set, phase: p, at: d.Time.UnixMicro(), ns: d.Time.UnixNano(), cost: cost, allowed: d.Allowed, rules: d.Rules})
					if !isMemory {
						time.Sleep(time.Duration(r.Int64N(int64(2 * time.Millisecond))))
					}
				}
				mu.Lock()
				events = append(events, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	if len(events) == 0 {
		t.Fatal("no decisions")
	}
	return events
}

// setRules maps each of ruleSets to its rules, phase by phase.
func setRules(rules [][]Rule) [][][]Rule {
	sets := make([][][]Rule, len(ruleSets)) // set → phase → rules
	for i, idx := range ruleSets {
		for _, rs := range rules {
			var sub []Rule
			for _, sr := range idx {
				r := rs[sr.idx]
				r.Shadow, r.Share = sr.shadow, sr.share
				sub = append(sub, r)
			}
			sets[i] = append(sets[i], sub)
		}
	}
	return sets
}

// replaySets replays each key's decisions against its own models.
func replaySets(t *testing.T, rules [][]Rule, events []modelEvent, seed uint64) {
	t.Helper()
	for i, phases := range setRules(rules) {
		var mine []modelEvent
		for _, e := range events {
			if e.set == i {
				mine = append(mine, e)
			}
		}
		if len(mine) == 0 {
			continue
		}
		a, d := replay(t, phases, mine, seed)
		names := make([]string, len(phases[0]))
		for j, r := range phases[0] {
			names[j] = r.Name
			if r.Shadow {
				names[j] += "(shadow)"
			}
			if r.Share {
				names[j] += "(share)"
			}
		}
		t.Logf("rules %v: %d admitted, %d denied", names, a, d)
	}
}
