package consumer

import (
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestFaultSameEventTwice: the same events (the same 16-byte ids) at later
// offsets, as a producer's retry whose first attempt Kafka wrote after all
// leaves them (or a record produced again): in the same batch as their
// first copies, and in a later batch after those were stored. Each event
// is stored once, everywhere, and every repeat counted.
func TestFaultSameEventTwice(t *testing.T) {
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	ds := decisions(300)
	// 0-199, then 100-199 again: repeats within one batch.
	produce(t, kb.brokers, kb.topic, append(ds[:200:200], ds[100:200]...))
	cfg := kb.config()
	cfg.BatchWait = 2 * time.Second // one batch holds them all
	r := start(t, cfg, ch, nil)
	waitRaw(t, ch, 200, 60*time.Second)
	// A later batch: 0-49 again, stored long before, and 200-299 new.
	produce(t, kb.brokers, kb.topic, append(ds[:50:50], ds[200:]...))
	waitRaw(t, ch, 300, 60*time.Second)
	testenv.WaitFor(t, 30*time.Second, "every repeat counted", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_duplicates_total") >= 150
	})
	r.stop()
	wantExact(t, ch, 300)
	if got := metric(t, r.reg, "edgelimit_consumer_duplicates_total"); got != 150 {
		t.Errorf("duplicates_total = %v, want 150", got)
	}
}

func TestIDWindow(t *testing.T) {
	w := newIDWindow(3)
	id := func(b byte) [16]byte { return [16]byte{b} }
	for b := range byte(5) {
		w.add(id(b))
	}
	for b, want := range []bool{false, false, true, true, true} {
		if got := w.has(id(byte(b))); got != want {
			t.Errorf("after adding 0-4 to a window of 3: has(%d) = %v, want %v", b, got, want)
		}
	}
	if len(w.seen) != 3 {
		t.Errorf("window of 3 holds %d ids", len(w.seen))
	}
}

// BenchmarkDropDuplicates is the repeat check's cost for one full batch
// (50,000 rows, no repeats) against a full window.
func BenchmarkDropDuplicates(b *testing.B) {
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	c := &Consumer{m: m, stored: newIDWindow(dedupeWindow)}
	for i := range dedupeWindow {
		c.stored.add([16]byte{0xff, byte(i), byte(i >> 8), byte(i >> 16)})
	}
	ds := decisions(50_000)
	rows := make([]row, len(ds))
	for i, d := range ds {
		rows[i] = row{d: d}
	}
	p := &partition{}
	b.ReportAllocs()
	for b.Loop() {
		p.rows = append(p.rows[:0], rows...)
		if n := c.dropDuplicates([]*partition{p}); n != len(rows) {
			b.Fatalf("%d rows left of %d", n, len(rows))
		}
	}
}
