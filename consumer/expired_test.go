package consumer

import (
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestFaultEventOlderThanRetention: with raw rows kept 3 days and rollups 5,
// events arrive 0, 2, 4 and 10 days old (a producer's clock, a consumer far
// behind; Kafka's timestamp agrees). Those 4 and 10 days old were stored and
// then deleted by retention, from the raw table at once and from the
// rollups later or not: uncounted, and the tables disagreeing. They go to
// the dead-letter topic instead, reason expired, counted, stamped with the
// consumer's time (Kafka's retention would delete a dead letter at the old
// time unread) and the original's kept in a header; the others are stored
// in every table.
func TestFaultEventOlderThanRetention(t *testing.T) {
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	now := time.Now().UTC()
	ds := decisions(4)
	var recs []*kgo.Record
	for i, age := range []int{0, 2, 4, 10} {
		ts := now.AddDate(0, 0, -age).Truncate(time.Millisecond)
		ds[i].Time = ts
		r := record(t, ds[i])
		r.Timestamp = ts
		recs = append(recs, r)
	}
	produceRaw(t, kb.brokers, kb.topic, recs)
	cfg := kb.config()
	cfg.Retention = Retention{RawDays: 3, RollupDays: 5}
	r := start(t, cfg, ch, nil)
	dead := testenv.Consume(t, kb.brokers, kb.dlq, 2)
	waitRaw(t, ch, 2, 30*time.Second)
	r.stop()
	wantExact(t, ch, 2)
	for i, d := range dead {
		h := headers(d)
		want := recs[2+i]
		if h[HeaderReason] != ReasonExpired || h[HeaderSourceOffset] != strconv.Itoa(2+i) || string(d.Value) != string(want.Value) ||
			h[HeaderOriginalTimestamp] != strconv.FormatInt(want.Timestamp.UnixMilli(), 10) || d.Timestamp.Before(now.Add(-time.Minute)) {
			t.Errorf("dead letter %d: timestamp %v, headers %v; want the original of offset %d, reason %s, original timestamp %d, stamped now",
				i, d.Timestamp, h, 2+i, ReasonExpired, want.Timestamp.UnixMilli())
		}
	}
	if got := metric(t, r.reg, "edgelimit_consumer_dead_letters_total", "reason", ReasonExpired); got != 2 {
		t.Errorf("dead_letters_total{reason=expired} = %v, want 2", got)
	}
}
