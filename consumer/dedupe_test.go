package consumer

import (
	"slices"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// produceTo writes each event to partition part(i), as a producer's retry
// leaves a repeat: in the partition of its first copy.
func produceTo(t *testing.T, kb kafkaBackend, ds []event.Decision, part func(i int) int32) {
	t.Helper()
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = record(t, d)
		recs[i].Partition = part(i)
	}
	produceRaw(t, kb.brokers, kb.topic, recs, kgo.RecordPartitioner(kgo.ManualPartitioner()))
}

// TestFaultSameEventAfterRestart: events repeated at later offsets of their
// partition (an idempotent producer's retry after an epoch bump keeps the
// record's partition) just after the consumer restarted. The new consumer's
// window was empty and stored every repeat again; it now rebuilds the
// window from the partition's stored tail when the partition is assigned.
func TestFaultSameEventAfterRestart(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	ds := decisions(300)
	byIndex := func(off int) func(int) int32 { return func(i int) int32 { return int32((off + i) % 2) } }
	produceTo(t, kb, ds[:200], byIndex(0))
	r := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, 200, 60*time.Second)
	r.stop()

	// 100-199 again, each in its first copy's partition, and 200-299 new.
	produceTo(t, kb, ds[100:200], byIndex(100))
	produceTo(t, kb, ds[200:], byIndex(200))
	r = start(t, kb.config(), ch, nil)
	wantRepeatsDropped(t, ch, 300, 100, r)
}

// wantRepeatsDropped waits for n events in the raw table and want repeats
// counted by the consumers rs, stops them, and checks that every table
// holds each event once and that exactly want repeats were counted.
func wantRepeatsDropped(t *testing.T, ch driver.Conn, n uint64, want float64, rs ...*running) {
	t.Helper()
	dups := func() float64 {
		sum := 0.0
		for _, r := range rs {
			sum += metric(t, r.reg, "edgelimit_consumer_duplicates_total")
		}
		return sum
	}
	waitRaw(t, ch, n, 60*time.Second)
	testenv.WaitFor(t, 30*time.Second, "every repeat counted", func() bool { return dups() >= want })
	for _, r := range slices.Backward(rs) {
		r.stop()
	}
	wantExact(t, ch, n)
	if got := dups(); got != want {
		t.Errorf("duplicates_total = %v over %d consumers, want %v", got, len(rs), want)
	}
}

// TestFaultSameEventAfterRebalance: a second consumer joins the group and
// takes a partition over; then events stored from that partition are
// repeated in it. Its new owner, which never stored them, drops them.
func TestFaultSameEventAfterRebalance(t *testing.T) {
	t.Parallel()
	ch, db := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	ds := decisions(300)
	part := func(i int) int32 { return int32(i % 2) }
	produceTo(t, kb, ds[:200], part)
	a := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, 200, 60*time.Second)

	b := start(t, kb.config(), ch, nil)
	testenv.WaitFor(t, 60*time.Second, "each consumer owns a partition", func() bool {
		return owned(a.c) == 1 && owned(b.c) == 1
	})
	produceTo(t, kb, ds[:200], part)
	produceTo(t, kb, ds[200:], part)
	waitRaw(t, ch, 300, 60*time.Second)
	// Both swept the staging tables of members gone when assigned: a live
	// one's, in use, is not among them.
	stages, err := stageTables(t, ch, db)
	if want := []string{stageOf(a.c), stageOf(b.c)}; err != nil || !slices.Equal(stages, slices.Sorted(slices.Values(want))) {
		t.Errorf("staging tables of two live consumers = %v, %v; want theirs, %v", stages, err, want)
	}
	wantRepeatsDropped(t, ch, 300, 200, a, b)
}

// owned is how many partitions c holds.
func owned(c *Consumer) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.parts)
}

func stageOf(c *Consumer) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stage
}
