package limiter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// tagsApart returns n tags whose containers for key land in n different
// Cluster slots.
func tagsApart(t *testing.T, l *Redis, key string, n int) []string {
	t.Helper()
	var tags []string
	seen := map[uint16]bool{}
	for i := 0; len(tags) < n; i++ {
		tag := fmt.Sprintf("t%d", i)
		slot := keySlot(containerKey(l.cfg.Prefix, key, Rule{Name: "x", Bucket: "b", Tag: tag}))
		if !seen[slot] {
			seen[slot] = true
			tags = append(tags, tag)
		}
	}
	return tags
}

// TestAcrossSlots: a check whose buckets lie in several Cluster slots is
// all-or-nothing as seen from outside: admitted, every bucket is charged;
// denied by one, the others are given back exactly before the answer.
func TestAcrossSlots(t *testing.T) {
	rdb := mustCluster(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	key := uniqueKey(t)
	tags := tagsApart(t, l, key, 3)
	rules := []Rule{
		{Name: "a", Bucket: "a", Tag: tags[0], Limit: 10, Period: 24 * time.Hour},
		{Name: "b", Bucket: "b", Tag: tags[1], Limit: 5, Period: 24 * time.Hour, Algorithm: SlidingWindow},
		{Name: "c", Bucket: "c", Tag: tags[2], Limit: 3, Period: 24 * time.Hour},
	}
	if g := l.slotGroups(key, rules); len(g) != 3 {
		t.Fatalf("slotGroups = %v, want 3 slots", g)
	}
	for i := range 3 {
		d, err := l.Allow(ctx, key, rules, 1)
		if err != nil || !d.Allowed || d.Rules[2].Remaining != int64(2-i) {
			t.Fatalf("Allow %d = %+v, %v; want allowed, c with %d left", i, d, err, 2-i)
		}
	}
	d, err := l.Allow(ctx, key, rules, 1)
	if err != nil || d.Allowed || d.Rules[2].Allowed || !d.Rules[0].Allowed {
		t.Fatalf("Allow after c's 3 = %+v, %v; want denied by c alone", d, err)
	}
	if d.Rules[0].Remaining != 7 || d.Rules[1].Remaining != 2 {
		t.Errorf("denied check reports a %d, b %d left; want 7 and 2 (given back)", d.Rules[0].Remaining, d.Rules[1].Remaining)
	}
	ks, err := l.Inspect(ctx, key, rules)
	if err != nil {
		t.Fatal(err)
	}
	if got := remaining(ks); got[0] != 7 || got[1] != 2 || got[2] != 0 {
		t.Errorf("after the denial, Inspect remaining = %v, want [7 2 0]: a and b given back", got)
	}
	if st := l.Stats(); st.Across != 4 || st.GivenBack != 1 || st.GiveBackFailed != 0 {
		t.Errorf("Stats() = %+v, want 4 checks across slots, 1 given back, none failed", st)
	}
	if err := l.Reset(ctx, key, rules); err != nil {
		t.Fatal(err)
	}
	if ks, err := l.Inspect(ctx, key, rules); err != nil || remaining(ks)[2] != 3 {
		t.Errorf("after Reset, Inspect = %+v, %v; want c full", ks, err)
	}
}

// TestAcrossSlotsNeverOverAdmits: 64 callers, each request charging a
// bucket shared by all and one of its own, in two slots. No bucket ever
// admits more than its limit (a day's: nothing refills in the test), a
// denial leaves nothing charged (what is left is exactly the limit minus
// the admissions), and the under-admission the give-backs cause under
// contention is reported.
func TestAcrossSlotsNeverOverAdmits(t *testing.T) {
	rdb := mustCluster(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	key := uniqueKey(t)
	const callers, tries, shared, own = 64, 12, 300, 8
	tags := tagsApart(t, l, key, callers+1)
	sharedRule := Rule{Name: "shared", Bucket: "shared", Tag: tags[0], Limit: shared, Period: 24 * time.Hour}
	var admitted atomic.Int64
	perCaller := make([]int64, callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			mine := Rule{Name: "own", Bucket: fmt.Sprintf("own%d", c), Tag: tags[c+1], Limit: own, Period: 24 * time.Hour}
			for range tries {
				d, err := l.Allow(ctx, key, []Rule{sharedRule, mine}, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
					perCaller[c]++
				}
			}
		})
	}
	wg.Wait()
	for c, n := range perCaller {
		if n > own {
			t.Errorf("caller %d admitted %d, over its bucket's %d", c, n, own)
		}
	}
	n := admitted.Load()
	if n > shared {
		t.Errorf("admitted %d, over the shared bucket's %d", n, shared)
	}
	ks, err := l.Inspect(ctx, key, []Rule{sharedRule})
	if err != nil {
		t.Fatal(err)
	}
	if left := ks.Rules[0].Remaining; left != shared-n {
		t.Errorf("shared bucket has %d left after %d admissions, want %d: a give-back was lost or doubled", left, n, shared-n)
	}
	// The exact model: every request of a caller with room is admitted
	// until the shared bucket is empty: min(shared, callers × own).
	exact := int64(min(shared, callers*own))
	st := l.Stats()
	t.Logf("admitted %d of the exact model's %d (under-admission %.1f%%); %d checks across slots, %d given back, %d give-backs failed",
		n, exact, 100*float64(exact-n)/float64(exact), st.Across, st.GivenBack, st.GiveBackFailed)
	if st.GiveBackFailed != 0 {
		t.Errorf("Stats() = %+v: give-backs failed", st)
	}
}

// TestGiveBackIntoItsWindow: a sliding window's give-back comes off the
// window it was charged in, the previous one once the window has turned,
// never off the current (which would admit the previous window's weight
// of it again).
func TestGiveBackIntoItsWindow(t *testing.T) {
	for name, rdb := range map[string]rediser{"standalone": mustRedis(t), "cluster": mustCluster(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := mustLimiter(t, rdb, Config{DenyCache: -1})
			key := uniqueKey(t)
			rule := Rule{Name: "w", Limit: 10, Period: 300 * time.Millisecond, Algorithm: SlidingWindow}
			d := mustRedisAllow(t, l, key, []Rule{rule}, 4)
			w := d.Time.UnixMicro() / rule.Period.Microseconds()
			// Wait for the window to turn, by Redis's clock.
			testenv.WaitFor(t, 5*time.Second, "the window to turn", func() bool {
				ks, err := l.Inspect(ctx, key, []Rule{rule})
				return err == nil && ks.Time.UnixMicro()/rule.Period.Microseconds() > w
			})
			give := rule
			give.Cost = -3
			c := l.slotCall(ctx, key, []Rule{give}, giveBackArgs([]Rule{give}, d.Time))
			l.await(ctx, []*call{c})
			if c.err != nil {
				t.Fatal(c.err)
			}
			if _, err := parseReply(c.res, []Rule{give}, false); err != nil {
				t.Fatalf("give-back reply: %v", err)
			}
			// The record as written: window I6, count I5, previous I5.
			raw, err := rdb.(interface {
				Get(context.Context, string) *redis.StringCmd
			}).Get(ctx, l.Keys(key, []Rule{rule})[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			rec := raw[3:]
			win, count, prev := uintLE(rec[0:6]), uintLE(rec[6:11]), uintLE(rec[11:16])
			switch {
			case win == w+1 && (count != 0 || prev != 1):
				t.Errorf("after giving back 3 of 4 charged in the previous window: count %d, previous %d; want 0 and 1", count, prev)
			case win > w+1 && count != 0:
				t.Errorf("a give-back into a window long past: count %d, want 0", count)
			case win < w+1:
				t.Errorf("record of window %d after the give-back in %d or later", win, w+1)
			}
		})
	}
}

// TestAcrossSlotsGiveBackOnlyWhenAdmitted: a check across slots that both
// charges and gives back leaves the give-back's bucket as it was when the
// charges are denied, and gives back when they are admitted. (The
// give-back waits for the charges rather than being taken back after: a
// bucket used in between could refuse the taking back.)
func TestAcrossSlotsGiveBackOnlyWhenAdmitted(t *testing.T) {
	rdb := mustCluster(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	key := uniqueKey(t)
	tags := tagsApart(t, l, key, 2)
	spent := Rule{Name: "a", Bucket: "a", Tag: tags[0], Limit: 1, Period: 24 * time.Hour}
	b := Rule{Name: "b", Bucket: "b", Tag: tags[1], Limit: 5, Period: 24 * time.Hour}
	mustRedisAllow(t, l, key, []Rule{spent}, 1)
	mustRedisAllow(t, l, key, []Rule{b}, 3)
	give := b
	give.Cost = -2
	d, err := l.Allow(ctx, key, []Rule{spent, give}, 1)
	if err != nil || d.Allowed {
		t.Fatalf("charge of a spent bucket beside a give-back = %+v, %v; want denied", d, err)
	}
	if ks, err := l.Inspect(ctx, key, []Rule{b}); err != nil || ks.Rules[0].Remaining != 2 {
		t.Errorf("after the denied check, b = %+v, %v; want 2 left: nothing given back", ks, err)
	}
	fresh := Rule{Name: "c", Bucket: "c", Tag: tags[0], Limit: 1, Period: 24 * time.Hour}
	if d, err := l.Allow(ctx, key, []Rule{fresh, give}, 1); err != nil || !d.Allowed || d.Rules[1].Remaining != 4 {
		t.Fatalf("admitted check with a give-back = %+v, %v; want allowed, b with 4 left", d, err)
	}
}
