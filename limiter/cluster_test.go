package limiter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// migration is one Cluster slot half-way from one master to another, as a
// reshard leaves it while it moves the slot's keys (CLUSTER SETSLOT
// IMPORTING on the target, MIGRATING on the source).
type migration struct {
	slot     int64
	src, dst *redis.Client
	dstID    string
	addr     string // the source's address
}

// migrate starts moving the slot of key (a Redis key) to another master.
// The migration ends, the slot given to the target, when the test does.
func migrate(t *testing.T, rdb *redis.ClusterClient, key string) *migration {
	t.Helper()
	ctx := context.Background()
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	ranges, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var src, dst string
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			src = r.Nodes[0].Addr
		}
	}
	for _, r := range ranges {
		if a := r.Nodes[0].Addr; a != src {
			dst = a
		}
	}
	m := &migration{slot: slot, addr: src, src: redis.NewClient(&redis.Options{Addr: src}), dst: redis.NewClient(&redis.Options{Addr: dst})}
	srcID, err := m.src.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if m.dstID, err = m.dst.ClusterMyID(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// As a reshard ends: the keys left moved, then the slot given to
		// the target, the target first.
		keys, err := m.src.ClusterGetKeysInSlot(ctx, int(slot), 1000).Result()
		if err != nil {
			t.Errorf("CLUSTER GETKEYSINSLOT %d: %v", slot, err)
		}
		for _, k := range keys {
			m.move(t, k)
		}
		for _, c := range []*redis.Client{m.dst, m.src} {
			if err := c.Do(ctx, "cluster", "setslot", slot, "node", m.dstID).Err(); err != nil {
				t.Errorf("CLUSTER SETSLOT %d NODE: %v", slot, err)
			}
			c.Close()
		}
	})
	if err := m.dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.src.Do(ctx, "cluster", "setslot", slot, "migrating", m.dstID).Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// move migrates key from the source to the target, as the reshard does.
func (m *migration) move(t *testing.T, key string) {
	t.Helper()
	host, port, _ := strings.Cut(m.dst.Options().Addr, ":")
	if err := m.src.Migrate(context.Background(), host, port, key, 0, 5*time.Second).Err(); err != nil {
		t.Errorf("MIGRATE %s: %v", key, err)
	}
}

// keyInSlot returns a limiter key other than key whose identity's
// container lands in slot.
func keyInSlot(t *testing.T, l *Redis, key string, rules []Rule, slot int64) string {
	t.Helper()
	for i := range 1 << 24 {
		k := fmt.Sprintf("%s-%d", key, i)
		c := l.Keys(k, rules)[0]
		tag := c[strings.IndexByte(c, '{')+1 : strings.IndexByte(c, '}')]
		if int64(crc16(tag)%16384) == slot {
			return k
		}
	}
	t.Fatalf("no key found in slot %d", slot)
	return ""
}

// crc16 is Redis Cluster's key hash (CRC-16/XMODEM).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// TestClusterMigratingSlot: while a reshard moves a slot, its keys are
// checked and counted exactly, on either side of the move, not answered
// with TRYAGAIN (the failure policy's answer). A check names its
// identity's container and the previous layout's keys, which are gone, and
// Redis refuses a command of several keys in a migrating slot unless the
// node holds them all.
func TestClusterMigratingSlot(t *testing.T) {
	rdb := mustCluster(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
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
	m := migrate(t, rdb, l.Keys(key, rules)[0])
	fresh := keyInSlot(t, l, key, rules, m.slot)
	check("on the source", key, 8)
	check("a new identity, asked to the target", fresh, 9)
	m.move(t, l.Keys(key, rules)[0])
	check("moved to the target", key, 7)
	check("a new identity, again", fresh, 8)
	if st := l.Stats(); st.Unstable == 0 {
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
	m := migrate(t, rdb, l.Keys(first, rules)[0])
	// Checks of other slots on the same node, behind the first in one
	// pipeline.
	batch := []*call{l.newCall(ctx, l.Keys(first, rules), 1, scriptArgs(rules, 1))}
	for i := 0; len(batch) < 6; i++ {
		k := fmt.Sprintf("%s-%d", first, i)
		if sameNode(t, rdb, l.Keys(k, rules)[0], m) {
			batch = append(batch, l.newCall(ctx, l.Keys(k, rules), 1, scriptArgs(rules, 1)))
		}
	}
	l.run(<-l.slots, batch)
	for i, c := range batch {
		d, err := parseReply(c.res, rules)
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
func sameNode(t *testing.T, rdb *redis.ClusterClient, key string, m *migration) bool {
	t.Helper()
	ctx := context.Background()
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if slot == m.slot {
		return false
	}
	ranges, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return r.Nodes[0].Addr == m.addr
		}
	}
	return false
}
