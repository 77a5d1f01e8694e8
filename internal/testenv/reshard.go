package testenv

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotMigration is one Redis Cluster hash slot half-way from the master
// serving it to another, as a reshard (redis-cli --cluster reshard) leaves
// it while it moves the slot's keys.
type SlotMigration struct {
	Slot           int64
	Source, Target *redis.Client
	targetID       string
	done           bool
}

// MigrateSlot starts moving slot from its master to another one: CLUSTER
// SETSLOT IMPORTING on the target, then MIGRATING on the source. The
// migration is finished (Finish) when the test ends, if not before, so no
// slot is left migrating for the tests that follow.
func MigrateSlot(tb testing.TB, cc *redis.ClusterClient, slot int64) *SlotMigration {
	tb.Helper()
	src, ranges := SlotMaster(tb, cc, slot), clusterSlots(tb, cc)
	var dst string
	for _, r := range ranges {
		if a := r.Nodes[0].Addr; a != src {
			dst = a
		}
	}
	if dst == "" {
		tb.Fatalf("no master besides %s", src)
	}
	m := &SlotMigration{Slot: slot, Source: redis.NewClient(&redis.Options{Addr: src}), Target: redis.NewClient(&redis.Options{Addr: dst})}
	tb.Cleanup(func() {
		m.Finish(tb)
		m.Source.Close()
		m.Target.Close()
	})
	srcID := m.id(tb, m.Source)
	m.targetID = m.id(tb, m.Target)
	m.set(tb, m.Target, "importing", srcID)
	m.set(tb, m.Source, "migrating", m.targetID)
	return m
}

// Move migrates keys (without any, every key the source holds in the
// slot) to the target, as the reshard does.
func (m *SlotMigration) Move(tb testing.TB, keys ...string) {
	tb.Helper()
	ctx := context.Background()
	if len(keys) == 0 {
		var err error
		if keys, err = m.Source.ClusterGetKeysInSlot(ctx, int(m.Slot), 1000).Result(); err != nil {
			tb.Errorf("CLUSTER GETKEYSINSLOT %d: %v", m.Slot, err)
		}
	}
	host, port, _ := strings.Cut(m.Target.Options().Addr, ":")
	for _, k := range keys {
		if err := m.Source.Migrate(ctx, host, port, k, 0, 5*time.Second).Err(); err != nil {
			tb.Errorf("MIGRATE %s: %v", k, err)
		}
	}
}

// Finish moves the keys left and gives the slot to the target, the target
// first, as the reshard ends. It does so once.
func (m *SlotMigration) Finish(tb testing.TB) {
	tb.Helper()
	if m.done {
		return
	}
	m.done = true
	m.Move(tb)
	m.set(tb, m.Target, "node", m.targetID)
	m.set(tb, m.Source, "node", m.targetID)
}

func (m *SlotMigration) set(tb testing.TB, c *redis.Client, args ...any) {
	tb.Helper()
	if err := c.Do(context.Background(), append([]any{"cluster", "setslot", m.Slot}, args...)...).Err(); err != nil {
		tb.Errorf("CLUSTER SETSLOT %d %v on %s: %v", m.Slot, args, c.Options().Addr, err)
	}
}

func (m *SlotMigration) id(tb testing.TB, c *redis.Client) string {
	tb.Helper()
	id, err := c.ClusterMyID(context.Background()).Result()
	if err != nil {
		tb.Fatalf("CLUSTER MYID on %s: %v", c.Options().Addr, err)
	}
	return id
}

// SlotMaster returns the address of the master serving slot.
func SlotMaster(tb testing.TB, cc *redis.ClusterClient, slot int64) string {
	tb.Helper()
	for _, r := range clusterSlots(tb, cc) {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return r.Nodes[0].Addr
		}
	}
	tb.Fatalf("no master serves slot %d", slot)
	return ""
}

// clusterSlots is the cluster's slot ranges, each with its master first.
func clusterSlots(tb testing.TB, cc *redis.ClusterClient) []redis.ClusterSlot {
	tb.Helper()
	ranges, err := cc.ClusterSlots(context.Background()).Result()
	if err != nil {
		tb.Fatalf("CLUSTER SLOTS: %v", err)
	}
	return slices.DeleteFunc(ranges, func(r redis.ClusterSlot) bool { return len(r.Nodes) == 0 })
}
