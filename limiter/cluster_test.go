package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// keyInSlot returns a limiter key other than key whose identity's
// container lands in slot.
func keyInSlot(t *testing.T, l *Redis, key string, rules []Rule, slot int64) string {
	t.Helper()
	for i := range 1 << 24 {
		k := fmt.Sprintf("%s-%d", key, i)
		if int64(keySlot(l.Keys(k, rules)[0])) == slot {
			return k
		}
	}
	t.Fatalf("no key found in slot %d", slot)
	return ""
}

// TestKeySlot: keySlot, which groups checks by slot, agrees with the
// Cluster's own CLUSTER KEYSLOT, hash tags and escaped braces included.
func TestKeySlot(t *testing.T) {
	rdb := mustCluster(t)
	l := mustLimiter(t, rdb, Config{})
	for _, key := range []string{"a", "{x}y", "10.1.2.3", "}{", "{}", "a{b{c}}", "\u00e9t\u00e9"} {
		for _, k := range append(l.Keys(key, []Rule{{Name: "r", Limit: 1, Period: time.Second}}), key, containerKey("rl", key, Rule{Name: "r", Bucket: "b", Tag: "t" + key})) {
			want, err := rdb.ClusterKeySlot(context.Background(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := keySlot(k); int64(got) != want {
				t.Errorf("keySlot(%q) = %d, want %d", k, got, want)
			}
		}
	}
}

// TestClusterMigratingSlot: while a reshard moves a slot, its keys are
// checked and counted exactly, on either side of the move, not answered
// with TRYAGAIN (the failure policy's answer). A check names its
// identity's container and the previous layout's keys, which are gone, and
// Redis refuses a command of several keys in a migrating slot unless the
// node holds them all.
func TestClusterMigratingSlot(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("PreviousLayout=%t", old), func(t *testing.T) { testClusterMigratingSlot(t, old) })
	}
}

// testClusterMigratingSlot: with the previous layout's keys (old), the
// first check of the migrating slot meets TRYAGAIN and is sent again
// without them; without, a check names one key and never meets it.
func testClusterMigratingSlot(t *testing.T, old bool) {
	rdb := mustCluster(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1, PreviousLayout: old})
	rules := []Rule{{Name: "r", Limit: 10, Period: time.Hour}}
	key := uniqueKey(t)
	check := func(what, key string, remaining int64) {
		t.Helper()
		d, err := l.Allow(ctx, key, rules, 1)
		if err != nil || !d.Allowed || d.Rules[0].Remaining != remaining {
			t.Errorf("Allow(%s) = %+v, %v; want allowed, %d remaining", what, d, err, remaining)
		}
	}
	check("before the reshard", key, 9)
	m := testenv.MigrateSlot(t, rdb, slotOf(t, rdb, l.Keys(key, rules)[0]))
	fresh := keyInSlot(t, l, key, rules, m.Slot)
	check("on the source", key, 8)
	check("a new identity, asked to the target", fresh, 9)
	m.Move(t, l.Keys(key, rules)[0])
	check("moved to the target", key, 7)
	check("a new identity, again", fresh, 8)
	if st := l.Stats(); old && st.Unstable == 0 {
		t.Errorf("Stats() = %+v: no TRYAGAIN was met, so the migration went untested", st)
	}
}

// TestClusterPipelineRunsOnce: a check in a pipeline runs once, whatever
// the other checks of its pipeline were answered. go-redis resends a
// Cluster node's whole batch when the first reply is an error it deems
// transient (here TRYAGAIN, from a migrating slot), which charged every
// other check of the batch again, up to four times in all.
func TestClusterPipelineRunsOnce(t *testing.T) {
	rdb := mustCluster(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	rules := []Rule{{Name: "r", Limit: 10, Period: time.Hour}}
	first := uniqueKey(t)
	if _, err := l.Allow(ctx, first, rules, 1); err != nil {
		t.Fatal(err)
	}
	m := testenv.MigrateSlot(t, rdb, slotOf(t, rdb, l.Keys(first, rules)[0]))
	// Checks of other slots on the same node, behind the first in one
	// pipeline.
	batch := []*call{l.newCall(ctx, l.Keys(first, rules), 1, scriptArgs(rules, 1, time.Now()))}
	for i := 0; len(batch) < 6; i++ {
		k := fmt.Sprintf("%s-%d", first, i)
		if sameNode(t, rdb, l.Keys(k, rules)[0], m) {
			batch = append(batch, l.newCall(ctx, l.Keys(k, rules), 1, scriptArgs(rules, 1, time.Now())))
		}
	}
	l.run(<-l.slots, batch)
	for i, c := range batch {
		d, err := parseReply(c.res, rules, false)
		if c.err != nil || err != nil {
			t.Errorf("check %d: %v, %v", i, c.err, err)
			continue
		}
		want := int64(9)
		if i == 0 {
			want = 8
		}
		if d.Rules[0].Remaining != want {
			t.Errorf("check %d: %d remaining, want %d: charged %d times", i, d.Rules[0].Remaining, want, 10-d.Rules[0].Remaining-(9-want))
		}
	}
}

// sameNode reports whether key's slot is served by m's source, and is not
// m's slot.
func sameNode(t *testing.T, rdb *redis.ClusterClient, key string, m *testenv.SlotMigration) bool {
	t.Helper()
	slot := slotOf(t, rdb, key)
	return slot != m.Slot && testenv.SlotMaster(t, rdb, slot) == m.Source.Options().Addr
}

func slotOf(t *testing.T, rdb *redis.ClusterClient, key string) int64 {
	t.Helper()
	slot, err := rdb.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

// TestClusterMigratingSlotSeveralContainers: a check of several
// containers (the Envoy door's descriptors, a bucket each) in a slot being
// migrated is decided once the slot has moved, not answered by its
// failure policy. Redis answers TRYAGAIN to a command of several keys
// there unless the node holds them all, which no resend can change: one
// container is on the source and the other not yet written anywhere, so
// every try fails until the migration ends. TRYAGAIN means the script did
// not run, so the check waits and tries again within its context.
func TestClusterMigratingSlotSeveralContainers(t *testing.T) {
	rdb := mustCluster(t)
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	rules := []Rule{
		{Name: "a", Bucket: "ba", Limit: 10, Period: time.Hour},
		{Name: "b", Bucket: "bb", Limit: 10, Period: time.Hour},
	}
	key := uniqueKey(t)
	// Only a's container exists when the migration starts.
	if _, err := l.Allow(context.Background(), key, rules[:1], 1); err != nil {
		t.Fatal(err)
	}
	m := testenv.MigrateSlot(t, rdb, slotOf(t, rdb, l.Keys(key, rules)[0]))
	// A check whose deadline ends first says the slot was moving, which
	// callers must not take for a store outage (the gateway's breaker).
	short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := l.Allow(short, key, rules, 1)
	cancel()
	if !errors.Is(err, ErrMigrating) {
		t.Fatalf("Allow(both rules) with a 30ms deadline while the slot moves = %v; want ErrMigrating", err)
	}
	type result struct {
		d   Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d, err := l.Allow(ctx, key, rules, 1)
		done <- result{d, err}
	}()
	// The check has met TRYAGAIN (and been sent once more without the
	// previous layout's keys) before the slot moves.
	testenv.WaitFor(t, time.Minute, "the check to meet TRYAGAIN", func() bool { return l.Stats().Unstable > 0 })
	m.Finish(t)
	r := <-done
	if r.err != nil || !r.d.Allowed || r.d.Rules[0].Remaining != 8 || r.d.Rules[1].Remaining != 9 {
		t.Fatalf("Allow(both rules) across the migration = %+v, %v; want allowed, 8 and 9 remaining", r.d, r.err)
	}
	if st := l.Stats(); st.Migrating == 0 {
		t.Errorf("Stats() = %+v: the check never waited for the migration", st)
	}
}
