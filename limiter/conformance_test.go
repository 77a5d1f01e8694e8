package limiter

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// store is one implementation under the conformance suite. wait lets time
// pass: the fake clock for Memory, real time for Redis (whose clock the
// script reads), so the same assertions hold for both.
type store struct {
	a    allower
	wait func(time.Duration)
	now  func() time.Time
}

func storesUnderTest(t *testing.T) map[string]func(t *testing.T) store {
	return map[string]func(t *testing.T) store{
		"memory": func(t *testing.T) store {
			clock := newFakeClock()
			return store{a: NewMemory(clock.Now, 0), wait: clock.Add, now: clock.Now}
		},
		"redis": func(t *testing.T) store {
			rdb := mustRedis(t)
			return store{a: mustLimiter(t, rdb, Config{DenyCache: -1}), wait: time.Sleep, now: func() time.Time { return redisTime(t, rdb) }}
		},
		"redis-cluster": func(t *testing.T) store {
			rdb := mustCluster(t)
			return store{a: mustLimiter(t, rdb, Config{DenyCache: -1}), wait: time.Sleep, now: func() time.Time { return redisTime(t, rdb) }}
		},
		"redis-sentinel": func(t *testing.T) store {
			master, addrs := testenv.RedisSentinel(t)
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs})
			t.Cleanup(func() { rdb.Close() })
			return store{a: mustLimiter(t, rdb, Config{DenyCache: -1}), wait: time.Sleep, now: func() time.Time { return redisTime(t, rdb) }}
		},
		"redis-deny-cache": func(t *testing.T) store {
			rdb := mustRedis(t)
			return store{a: mustLimiter(t, rdb, Config{}), wait: time.Sleep, now: func() time.Time { return redisTime(t, rdb) }}
		},
	}
}

func TestConformance(t *testing.T) {
	suite := []struct {
		name string
		run  func(t *testing.T, s store)
	}{
		{"burst then deny", testBurstThenDeny},
		{"all or nothing", testAllOrNothing},
		{"sliding window forbids token bucket's burst", testSlidingForbidsBurst},
		{"cost above capacity", testCostAboveCapacity},
		{"cost counts", testCost},
		{"rule costs all or nothing", testRuleCosts},
		{"retry after is enough", testRetryAfterEnough},
		{"shadow rule never denies", testShadow},
		{"algorithm change carries what was used", testAlgorithmChange},
		{"capacity flip carries what was used", testCapacityFlip},
		{"overdrawn bucket refills", testOverdrawnRefills},
	}
	for name, mk := range storesUnderTest(t) {
		t.Run(name, func(t *testing.T) {
			for _, tc := range suite {
				t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
					t.Parallel()
					tc.run(t, mk(t))
				})
			}
		})
	}
}

func mustAllow(t *testing.T, s store, key string, rules []Rule, cost int64) Decision {
	t.Helper()
	d, err := s.a.Allow(context.Background(), key, rules, cost)
	if err != nil {
		t.Fatalf("Allow(%q) error: %v", key, err)
	}
	if len(d.Rules) != len(rules) || d.Binding < 0 || d.Binding >= len(rules) {
		t.Fatalf("Allow(%q) = %+v: malformed decision", key, d)
	}
	return d
}

func testBurstThenDeny(t *testing.T, s store) {
	key := uniqueKey(t)
	rules := []Rule{{Name: "hour", Limit: 10, Period: time.Hour}}
	for i := range 10 {
		d := mustAllow(t, s, key, rules, 1)
		if !d.Allowed {
			t.Fatalf("request %d: Allow = %+v, want allowed", i, d)
		}
		if got, want := d.BindingRule().Remaining, int64(9-i); got != want {
			t.Errorf("request %d: remaining = %d, want %d", i, got, want)
		}
	}
	d := mustAllow(t, s, key, rules, 1)
	if d.Allowed {
		t.Fatalf("request 11: Allow = %+v, want denied", d)
	}
	// One token refills every 6 minutes.
	if ra := d.RetryAfter(); ra < 5*time.Minute || ra > 6*time.Minute {
		t.Errorf("RetryAfter = %v, want about 6m", ra)
	}
	if ra := d.BindingRule().ResetAfter; ra < 59*time.Minute || ra > time.Hour {
		t.Errorf("ResetAfter = %v, want about 1h", ra)
	}
	if len(d.Violated()) != 1 || d.Violated()[0].Rule.Name != "hour" {
		t.Errorf("Violated() = %+v, want the hour rule", d.Violated())
	}
}

// testAllOrNothing: a request denied by the daily rule leaves the minute
// rule's tokens untouched.
func testAllOrNothing(t *testing.T, s store) {
	key := uniqueKey(t)
	rules := []Rule{
		{Name: "minute", Limit: 100, Period: time.Minute},
		{Name: "day", Limit: 3, Period: 24 * time.Hour},
	}
	for range 3 {
		if d := mustAllow(t, s, key, rules, 1); !d.Allowed {
			t.Fatalf("Allow = %+v, want allowed", d)
		}
	}
	for i := range 5 {
		d := mustAllow(t, s, key, rules, 1)
		if d.Allowed || d.BindingRule().Rule.Name != "day" {
			t.Fatalf("denied request %d: Allow = %+v, want denied by day", i, d)
		}
		// The minute rule would admit it, and still has what 3 requests left.
		if m := d.Rules[0]; !m.Allowed || m.Remaining != 97 {
			t.Fatalf("denied request %d: minute rule = %+v, want allowed with 97 remaining", i, m)
		}
	}
	// A request the minute rule alone sees proves nothing was consumed.
	d := mustAllow(t, s, key, rules[:1], 1)
	if !d.Allowed || d.Rules[0].Remaining != 96 {
		t.Errorf("minute rule alone = %+v, want allowed with 96 remaining", d.Rules[0])
	}
}

// testSlidingForbidsBurst: after a full burst, a token bucket refills and
// admits a second burst within the period; a sliding window does not.
func testSlidingForbidsBurst(t *testing.T, s store) {
	const limit = 20
	period := 2 * time.Second
	tb := []Rule{{Name: "tb", Limit: limit, Period: period}}
	sw := []Rule{{Name: "sw", Limit: limit, Period: period, Algorithm: SlidingWindow}}
	alignToWindow(t, s, period)
	kTB, kSW := uniqueKey(t)+":tb", uniqueKey(t)+":sw"
	count := func(key string, rules []Rule, n int) int {
		allowed := 0
		for range n {
			if mustAllow(t, s, key, rules, 1).Allowed {
				allowed++
			}
		}
		return allowed
	}
	if got := count(kTB, tb, limit); got != limit {
		t.Fatalf("token bucket first burst admitted %d, want %d", got, limit)
	}
	if got := count(kSW, sw, limit); got != limit {
		t.Fatalf("sliding window first burst admitted %d, want %d", got, limit)
	}
	s.wait(period / 2)
	tbSecond, swSecond := count(kTB, tb, limit), count(kSW, sw, limit)
	// Half a period refills half the bucket.
	if tbSecond < limit/2-1 || tbSecond > limit/2+2 {
		t.Errorf("token bucket second burst admitted %d, want about %d", tbSecond, limit/2)
	}
	if swSecond != 0 {
		t.Errorf("sliding window second burst admitted %d, want 0 (limit already used this period)", swSecond)
	}
}

// alignToWindow waits until just after the start of a fixed window (by
// the store's clock), so a sliding window test's first half-period stays in
// one window.
func alignToWindow(t *testing.T, s store, period time.Duration) {
	t.Helper()
	into := time.Duration(s.now().UnixMicro()%period.Microseconds()) * time.Microsecond
	if into > period/20 {
		s.wait(period - into + period/100)
	}
}

func testCostAboveCapacity(t *testing.T, s store) {
	key := uniqueKey(t)
	rules := []Rule{{Name: "sec", Limit: 10, Period: time.Second, Burst: 5}, {Name: "sw", Limit: 8, Period: time.Second, Algorithm: SlidingWindow}}
	d := mustAllow(t, s, key, rules, 6)
	if d.Allowed || d.Reason == "" || !strings.Contains(d.Reason, `"sec"`) {
		t.Fatalf("Allow(cost 6 > burst 5) = %+v, want denied with a reason naming the rule", d)
	}
	if strings.Contains(d.Reason, `"sw"`) {
		t.Errorf("reason %q names the sliding window rule, whose capacity 8 fits cost 6", d.Reason)
	}
	// The refused request consumed nothing.
	if d := mustAllow(t, s, key, rules, 5); !d.Allowed {
		t.Errorf("Allow(cost 5) after refused cost 6 = %+v, want allowed", d)
	}
}

func testCost(t *testing.T, s store) {
	key := uniqueKey(t)
	rules := []Rule{{Name: "tb", Limit: 10, Period: time.Hour}, {Name: "sw", Limit: 12, Period: time.Hour, Algorithm: SlidingWindow}}
	d := mustAllow(t, s, key, rules, 4)
	if !d.Allowed || d.Rules[0].Remaining != 6 || d.Rules[1].Remaining != 8 {
		t.Fatalf("Allow(cost 4) = %+v, want allowed with 6 and 8 remaining", d.Rules)
	}
	d = mustAllow(t, s, key, rules, 4)
	if !d.Allowed || d.BindingRule().Rule.Name != "tb" || d.BindingRule().Remaining != 2 {
		t.Fatalf("Allow(cost 4) = %+v, want allowed, tb binding with 2 remaining", d)
	}
	if d = mustAllow(t, s, key, rules, 4); d.Allowed {
		t.Fatalf("Allow(cost 4) with 2 left = %+v, want denied", d)
	}
	if d = mustAllow(t, s, key, rules, 2); !d.Allowed {
		t.Fatalf("Allow(cost 2) with 2 left = %+v, want allowed", d)
	}
}

// testRetryAfterEnough: waiting the advertised retry-after is enough, for
// both algorithms.
func testRetryAfterEnough(t *testing.T, s store) {
	for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
		key := uniqueKey(t) + string(algo)
		rules := []Rule{{Name: "r", Limit: 5, Period: 500 * time.Millisecond, Algorithm: algo}}
		var d Decision
		for d = mustAllow(t, s, key, rules, 1); d.Allowed; d = mustAllow(t, s, key, rules, 1) {
		}
		if d.RetryAfter() <= 0 || d.RetryAfter() > time.Second {
			t.Fatalf("%s: RetryAfter = %v, want within (0, 1s]", algo, d.RetryAfter())
		}
		s.wait(d.RetryAfter())
		if d2 := mustAllow(t, s, key, rules, 1); !d2.Allowed {
			t.Errorf("%s: after waiting RetryAfter %v: Allow = %+v, want allowed", algo, d.RetryAfter(), d2)
		}
	}
}

func testShadow(t *testing.T, s store) {
	key := uniqueKey(t)
	rules := []Rule{{Name: "enforced", Limit: 5, Period: time.Hour}, {Name: "shadow", Limit: 2, Period: time.Hour, Shadow: true}}
	for i := range 5 {
		d := mustAllow(t, s, key, rules, 1)
		if !d.Allowed {
			t.Fatalf("request %d: Allow = %+v, want allowed (shadow never denies)", i, d)
		}
		if wantShadow := i < 2; d.Rules[1].Allowed != wantShadow {
			t.Errorf("request %d: shadow rule allowed = %v, want %v", i, d.Rules[1].Allowed, wantShadow)
		}
		if d.BindingRule().Rule.Shadow {
			t.Errorf("request %d: binding rule is the shadow rule", i)
		}
	}
	if d := mustAllow(t, s, key, rules, 1); d.Allowed || d.BindingRule().Rule.Name != "enforced" {
		t.Errorf("request 6: Allow = %+v, want denied by the enforced rule", d)
	}
}

// testRuleCosts: rules charged their own costs (Rule.Cost) beside the
// call's are decided at once, all-or-nothing: the rule whose own cost
// does not fit denies the call and no rule consumes; the call's cost
// charges only the rules without one.
func testRuleCosts(t *testing.T, s store) {
	key := uniqueKey(t)
	rules := []Rule{
		{Name: "tokens", Limit: 10, Period: time.Hour, Cost: 4},
		{Name: "requests", Limit: 100, Period: time.Hour},
		{Name: "window", Limit: 50, Period: time.Hour, Algorithm: SlidingWindow, Cost: 2},
	}
	remaining := func(d Decision) []int64 {
		var out []int64
		for _, r := range d.Rules {
			out = append(out, r.Remaining)
		}
		return out
	}
	// One token refills every 6 minutes: a test's seconds refill none.
	for i, want := range [][]int64{{6, 99, 48}, {2, 98, 46}} {
		if d := mustAllow(t, s, key, rules, 1); !d.Allowed || !slices.Equal(remaining(d), want) {
			t.Fatalf("request %d: Allow = %+v, remaining %v, want allowed with %v", i+1, d, remaining(d), want)
		}
	}
	d := mustAllow(t, s, key, rules, 1)
	if d.Allowed || !slices.Equal(remaining(d), []int64{2, 98, 46}) {
		t.Fatalf("request 3 (4 tokens of 2): Allow = %+v, remaining %v, want denied with nothing consumed", d, remaining(d))
	}
	if v := d.Violated(); len(v) != 1 || v[0].Rule.Name != "tokens" || !d.Rules[1].Allowed || !d.Rules[2].Allowed {
		t.Errorf("request 3: Rules = %+v, want only tokens denying", d.Rules)
	}
	// The 2 missing tokens take 12 minutes.
	if ra := d.RetryAfter(); ra < 11*time.Minute || ra > 12*time.Minute {
		t.Errorf("request 3: RetryAfter = %v, want about 12m", ra)
	}
	// Every rule with a cost of its own: the call's 500, above every
	// capacity, charges none of them.
	own := slices.Clone(rules)
	own[0].Cost, own[1].Cost = 2, 1
	if d := mustAllow(t, s, key, own, 500); !d.Allowed || !slices.Equal(remaining(d), []int64{0, 97, 44}) {
		t.Fatalf("rule costs 2, 1, 2 at call cost 500: Allow = %+v, remaining %v, want allowed with [0 97 44]", d, remaining(d))
	}
	// A shadow rule's own cost above its capacity: it denies alone, and
	// no wait helps (RetryAfter 0), in every store.
	shadow := []Rule{{Name: "requests", Limit: 100, Period: time.Hour},
		{Name: "tb", Limit: 5, Period: time.Hour, Shadow: true, Cost: 10},
		{Name: "sw", Limit: 5, Period: time.Hour, Algorithm: SlidingWindow, Shadow: true, Cost: 10}}
	d = mustAllow(t, s, key+"shadow", shadow, 1)
	if !d.Allowed || d.Rules[1].Allowed || d.Rules[2].Allowed || d.Rules[1].RetryAfter != 0 || d.Rules[2].RetryAfter != 0 {
		t.Errorf("shadow rules' own cost 10 of capacity 5: Rules = %+v, want allowed, both shadows denying with RetryAfter 0", d.Rules)
	}
	// A rule's own cost above its capacity: no wait helps.
	own[1].Cost = 101
	if d := mustAllow(t, s, key, own, 1); d.Allowed || d.Reason == "" || !strings.Contains(d.Reason, "101") {
		t.Errorf("rule cost 101 of capacity 100: Allow = %+v, want denied with a reason", d)
	}
}

// testAlgorithmChange: a rule whose algorithm changes (a plan's, or the
// Envoy door's grpc.algorithm) keeps what its key used, both ways. Its
// state under the old algorithm was left aside and the new one started
// full, so a key got its limit once more at every change, and for as long
// as gateways of both configurations ran side by side, each its own
// limit: here 18 admitted of 10 an hour, over three changes.
func testAlgorithmChange(t *testing.T, s store) {
	key := uniqueKey(t)
	bucket := []Rule{{Name: "hour", Limit: 10, Period: time.Hour}}
	window := []Rule{{Name: "hour", Limit: 10, Period: time.Hour, Algorithm: SlidingWindow}}
	admitted := func(rules []Rule, n int) int {
		got := 0
		for range n {
			if mustAllow(t, s, key, rules, 1).Allowed {
				got++
			}
		}
		return got
	}
	for _, step := range []struct {
		name  string
		rules []Rule
		tries int
		want  int
	}{
		{"token bucket", bucket, 7, 7},
		{"then a sliding window", window, 5, 3},
		{"then the token bucket again", bucket, 3, 0},
		{"and the sliding window again", window, 3, 0},
	} {
		if got := admitted(step.rules, step.tries); got != step.want {
			t.Errorf("%s: %d of %d admitted, want %d (10 an hour in all)", step.name, got, step.tries, step.want)
		}
	}
}

// testCapacityFlip: a key checked alternately under a rule and the same
// rule with a lower capacity (two gateways mid rolling reload, a plan
// flip-flopped) is held to the higher capacity, as a key checked under it
// alone: what was used carries over both ways. Before, a lowered token
// bucket clamped the tokens left to its capacity, so little read as used
// under it, and the raise back added the difference again: alternating 10
// and 100 an hour admitted 300 of 300.
func testCapacityFlip(t *testing.T, s store) {
	for _, tc := range []struct {
		name      string
		low, high Rule
	}{
		{"token bucket", Rule{Name: "hour", Limit: 10, Period: time.Hour}, Rule{Name: "hour", Limit: 100, Period: time.Hour}},
		{"burst", Rule{Name: "hour", Limit: 100, Period: time.Hour, Burst: 10}, Rule{Name: "hour", Limit: 100, Period: time.Hour}},
		{"sliding window", Rule{Name: "hour", Limit: 10, Period: time.Hour, Algorithm: SlidingWindow}, Rule{Name: "hour", Limit: 100, Period: time.Hour, Algorithm: SlidingWindow}},
		// and the algorithm with it: the window's 100 used overdraw the
		// bucket of 10, rather than leave it empty (90 forgotten)
		{"algorithm", Rule{Name: "hour", Limit: 10, Period: time.Hour}, Rule{Name: "hour", Limit: 100, Period: time.Hour, Algorithm: SlidingWindow}},
	} {
		key := uniqueKey(t) + tc.name
		admitted := int64(0)
		for i := range 300 {
			rule := tc.low
			if i%2 == 1 {
				rule = tc.high
			}
			if mustAllow(t, s, key, []Rule{rule}, 1).Allowed {
				admitted++
			}
		}
		// 100 an hour refills one unit every 36 s: the test's run refills
		// at most one, and a sliding window none (alignment aside, its
		// counts only decay across the hour's window boundary).
		if c := tc.high.Capacity(); admitted < c || admitted > c+1 {
			t.Errorf("%s: alternating capacity %d and %d: admitted %d of 300, want %d (at most one more refilled)", tc.name, tc.low.Capacity(), c, admitted, c)
		}
	}
}

// testOverdrawnRefills: a token bucket lowered below what it had used is
// overdrawn: denied until it refills to the cost at its own rate, with a
// RetryAfter that says when, and waiting it admits (never frozen, never
// an error). The times are the ones the decisions report, so a slow run
// only moves the numbers, never the verdicts expected.
func testOverdrawnRefills(t *testing.T, s store) {
	key := uniqueKey(t)
	high := Rule{Name: "sec", Limit: 100, Period: time.Second} // a unit per 10 ms
	low := high
	low.Burst = 10
	first := mustAllow(t, s, key, []Rule{high}, 100)
	if !first.Allowed {
		t.Fatalf("Allow(100 of 100/s) = %+v, want allowed", first)
	}
	d := mustAllow(t, s, key, []Rule{low}, 1)
	// 100 used, 90 of them beyond the lowered capacity: the bucket holds
	// the refill since, minus 90.
	refill := d.Time.Sub(first.Time).Seconds() * 100
	if missing := 91 - refill; missing > 1 {
		if d.Allowed {
			t.Fatalf("burst lowered 100 → 10 after using 100 (refilled %.1f): Allow = %+v, want denied", refill, d)
		}
		want := time.Duration(missing * float64(10*time.Millisecond))
		if ra := d.RetryAfter(); ra < want-time.Millisecond || ra > want+time.Millisecond {
			t.Errorf("overdrawn by %.1f: RetryAfter = %v, want about %v (its own refill rate)", missing-1, ra, want)
		}
		if r := d.Rules[0]; r.Remaining != 0 || r.ResetAfter < d.RetryAfter() {
			t.Errorf("overdrawn: rule = %+v, want 0 remaining, reset no sooner than retry", r)
		}
		s.wait(d.RetryAfter())
		d = mustAllow(t, s, key, []Rule{low}, 1)
	}
	if !d.Allowed {
		t.Errorf("overdrawn bucket after waiting its RetryAfter: Allow = %+v, want allowed", d)
	}
}
