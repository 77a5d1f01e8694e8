package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// The TestFault… tests are issue 10's table of faults, each against the real
// broker and ClickHouse. Each logs the counts it saw (raw and rollups
// against events), so a run documents the fault.

// realBackend is the real broker with fresh topics.
func realBackend(t *testing.T, partitions int32) kafkaBackend {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	topic, dlq := realKafka(t, brokers, partitions)
	return kafkaBackend{name: "kafka", brokers: brokers, topic: topic, dlq: dlq}
}

// storedThenStopped stores first on a fresh one-partition topic of the real
// broker with a consumer that then stops: the committed state a test
// changes under the consumer (the topic, the log) before starting it again
// with kb.config().
func storedThenStopped(t *testing.T, first []event.Decision) (driver.Conn, kafkaBackend) {
	t.Helper()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	produce(t, kb.brokers, kb.topic, first)
	r := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, uint64(len(first)), 60*time.Second)
	r.stop()
	return ch, kb
}

// tallies are the events the raw table and each rollup hold.
type tallies struct{ raw, distinct, key, ip, gateway uint64 }

func (c tallies) String() string {
	return fmt.Sprintf("raw %d (distinct events %d), key rollup %d, ip rollup %d, gateway rollup %d",
		c.raw, c.distinct, c.key, c.ip, c.gateway)
}

func counts(t *testing.T, ch driver.Conn) tallies {
	t.Helper()
	return tallies{
		raw:      count(t, ch, "SELECT count() FROM decisions"),
		distinct: count(t, ch, "SELECT uniqExact(event_id) FROM decisions"),
		key:      count(t, ch, "SELECT toUInt64(sum(requests)) FROM decisions_by_key_1m"),
		ip:       count(t, ch, "SELECT toUInt64(countMerge(requests)) FROM decisions_by_ip_1m"),
		gateway:  count(t, ch, "SELECT toUInt64(countMerge(requests)) FROM decisions_by_gateway_1m"),
	}
}

// wantExact fails unless the raw table and every rollup hold each of n
// events once.
func wantExact(t *testing.T, ch driver.Conn, n uint64) {
	t.Helper()
	got := counts(t, ch)
	t.Logf("events %d: %v", n, got)
	if want := (tallies{n, n, n, n, n}); got != want {
		t.Errorf("stored %v, want every table at %d events", got, n)
	}
}

// waitRaw waits (bounded) for the raw table to hold n rows, then a little
// longer for anything that would come on top.
func waitRaw(t *testing.T, ch driver.Conn, n uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if got, err := tryCount(ch, "SELECT count() FROM decisions"); err == nil && got >= n {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
}

// failingView makes every insert into table fail until dropped, the way a
// materialized view that throws at insert time does: a column whose default
// throws.
func failingView(t *testing.T, ch driver.Conn, table string) (drop func()) {
	t.Helper()
	ctx := context.Background()
	if err := ch.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN boom UInt8 DEFAULT throwIf(requests >= 0)"); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := ch.Exec(ctx, "ALTER TABLE "+table+" DROP COLUMN boom"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFaultViewFailsAtInsert (row 1): the key rollup's insert fails for a
// while, after the raw rows landed.
// Each failed attempt is aborted and written again, so when the fault
// clears every table holds each event once.
func TestFaultViewFailsAtInsert(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	viewFailsAtInsert(t, kb, kb.config(), ch, ch, 3000)
}

// viewFailsAtInsert is row 1's fault: n events on kb, while the key
// rollup fails on failing (ch or one of its shards); a consumer configured
// as cfg writing to ch retries at least twice, and once the fault clears
// every table in ch holds each event once.
func viewFailsAtInsert(t *testing.T, kb kafkaBackend, cfg Config, ch, failing driver.Conn, n uint64) {
	t.Helper()
	drop := failingView(t, failing, "decisions_by_key_1m")
	produce(t, kb.brokers, kb.topic, decisions(int(n)))
	r := start(t, cfg, ch, nil)
	testenv.WaitFor(t, 30*time.Second, "two failed attempts", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_retries_total") >= 2
	})
	t.Logf("while the view fails: %v", counts(t, ch))
	drop()
	waitRaw(t, ch, n, 30*time.Second)
	r.stop()
	wantExact(t, ch, n)
}

// TestFaultViewFailsThenCrash (row 2): the same fault, then the consumer is
// SIGKILLed mid-retry and a new one takes over once the fault is gone.
func TestFaultViewFailsThenCrash(t *testing.T) {
	t.Parallel()
	addr := testenv.ClickHouseAddr(t)
	ch, db := newDatabase(t, addr)
	kb := realBackend(t, 2)
	drop := failingView(t, ch, "decisions_by_key_1m")
	const n = 3000
	produce(t, kb.brokers, kb.topic, decisions(n))
	cfg := kb.config()
	cmd := crashCmd(t, cfg, addr, db)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second) // a few failed attempts
	cmd.Process.Kill()          // SIGKILL, mid-retry
	cmd.Wait()
	t.Logf("after the crash: %v", counts(t, ch))
	drop()
	r := start(t, cfg, ch, nil)
	waitRaw(t, ch, n, 30*time.Second)
	r.stop()
	wantExact(t, ch, n)
}

// TestFaultSlowFlushRebalance (row 3): a flush outlives the rebalance that
// gives its partitions to another consumer (its session is as good as
// lost). The new owner claims them; the old one, when it wakes, is fenced
// and writes nothing twice.
func TestFaultSlowFlushRebalance(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	const n = 1000
	produce(t, kb.brokers, kb.topic, decisions(n))
	cfg := kb.config()
	release := make(chan struct{})
	slept := false
	r1 := start(t, cfg, ch, func(c *Consumer) {
		c.beforeInsert = func() {
			if !slept {
				slept = true
				<-release // holds the flush (and mu) past the rebalance
			}
		}
	})
	time.Sleep(3 * time.Second) // r1 holds every partition, stuck in its flush
	r2 := start(t, cfg, ch, nil)
	waitRaw(t, ch, n, 40*time.Second)
	close(release)
	time.Sleep(3 * time.Second) // r1 wakes and flushes
	r1.stop()
	r2.stop()
	wantExact(t, ch, n)
}

// TestFaultTopicRecreated (row 4): the topic is deleted and created again
// (or the consumer fails over to a mirror): offsets start over. The ledger's
// tail belongs to the old topic id, so it is distrusted, loudly, and every
// new event is stored.
func TestFaultTopicRecreated(t *testing.T) {
	t.Parallel()
	ds := decisions(4500)
	ch, kb := storedThenStopped(t, ds[:2000])

	ctx, adm, done := testenv.KafkaAdmin(t, kb.brokers, 60*time.Second)
	defer done()
	if _, err := adm.DeleteTopics(ctx, kb.topic); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the topic to be created again", func() bool {
		resp, err := adm.CreateTopics(ctx, 1, 1, nil, kb.topic)
		return err == nil && resp.Error() == nil
	})
	// Created is not yet served: a produce before its partition has a
	// leader is refused with UNKNOWN_TOPIC_OR_PARTITION.
	testenv.WaitFor(t, 60*time.Second, "the new topic's partition to have a leader", func() bool {
		topics, err := adm.ListTopics(ctx, kb.topic)
		if err != nil || topics.Error() != nil {
			return false
		}
		d, ok := topics[kb.topic]
		if !ok || len(d.Partitions) == 0 {
			return false
		}
		for _, p := range d.Partitions {
			if p.Err != nil || p.Leader < 0 {
				return false
			}
		}
		return true
	})
	produce(t, kb.brokers, kb.topic, ds[2000:])

	r := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, 4500, 30*time.Second)
	r.stop()
	wantExact(t, ch, 4500)
	if got := metric(t, r.reg, "edgelimit_consumer_offsets_distrusted_total"); got < 1 {
		t.Errorf("offsets_distrusted_total = %v, want at least 1", got)
	}
}

// TestRecordsLostCounted: while the consumer is down, Kafka deletes records
// it had not read yet (retention, here DeleteRecords). On restart the
// committed offset is below the log's start and Kafka resumes it there: the
// records between are gone, and they are counted and logged instead of
// vanishing without a trace.
func TestRecordsLostCounted(t *testing.T) {
	t.Parallel()
	ds := decisions(300)
	ch, kb := storedThenStopped(t, ds[:100])
	produce(t, kb.brokers, kb.topic, ds[100:])
	ctx, adm, done := testenv.KafkaAdmin(t, kb.brokers, 30*time.Second)
	resp, err := adm.DeleteRecords(ctx, kadm.Offsets{kb.topic: {0: {Topic: kb.topic, Partition: 0, At: 150}}})
	done()
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}

	r := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, 250, 60*time.Second)
	if got := metric(t, r.reg, "edgelimit_consumer_records_lost_total"); got != 50 {
		t.Errorf("records_lost_total = %v, want the 50 deleted unread", got)
	}
	r.stop()
	wantExact(t, ch, 250)
}

// TestFaultDeadLetterFails (row 5): a 1.5 MB poison record (too big for the
// dead-letter topic as it is), one whose 1.5 MB are headers, a dead-letter
// topic created only after the consumer met a poison record, and one that
// refuses everything. The first two are cut and passed on; the third
// blocks the poisoned partition until the topic exists, the fourth for
// good, and neither blocks another partition.
func TestFaultDeadLetterFails(t *testing.T) {
	t.Parallel()
	// 1.5 MB of headers, first a big one, then many small ones: the dead
	// letter would be as big as the original without a bound.
	heavy := &kgo.Record{Value: []byte("poison"), Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("abc")},
		{Key: "big", Value: make([]byte, 1000<<10)}}}
	for range 50_000 {
		heavy.Headers = append(heavy.Headers, kgo.RecordHeader{Key: "h", Value: make([]byte, 8)})
	}
	for _, tt := range []struct {
		name   string
		poison *kgo.Record
		want   map[string]string // headers of the dead letter
	}{
		{name: "too_large", poison: &kgo.Record{Value: make([]byte, 1500<<10)}, want: map[string]string{HeaderOriginalSize: "1536000"}},
		{name: "large_headers", poison: heavy, want: map[string]string{"trace": "abc", HeaderHeadersDropped: "50001"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
			kb := realBackend(t, 2)
			alterMaxMessage(t, kb.brokers, kb.topic)
			const n = 2000
			producePoisoned(t, kb, tt.poison, n)
			r := start(t, kb.config(), ch, nil)
			waitRaw(t, ch, n, 30*time.Second)
			r.stop()
			wantExact(t, ch, n)
			if got := metric(t, r.reg, "edgelimit_consumer_dead_letters_total"); got != 1 {
				t.Errorf("dead_letters_total = %v, want 1", got)
			}
			if got := metric(t, r.reg, "edgelimit_consumer_blocked_partitions"); got != 0 {
				t.Errorf("blocked_partitions = %v, want 0", got)
			}
			h := headers(testenv.Consume(t, kb.brokers, kb.dlq, 1)[0])
			for k, v := range tt.want {
				if h[k] != v {
					t.Errorf("dead letter header %s = %q, want %q (all: %v)", k, h[k], v, h)
				}
			}
		})
	}
	t.Run("missing_then_created", func(t *testing.T) {
		ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
		kb := realBackend(t, 2)
		cfg := kb.config()
		cfg.DeadLetterTopic += "-later" // not created yet
		const n = 200
		producePoisoned(t, kb, &kgo.Record{Value: []byte("poison")}, n)
		r := start(t, cfg, ch, nil)
		testenv.WaitFor(t, 30*time.Second, "the poisoned partition blocked, the other stored", func() bool {
			return metric(t, r.reg, "edgelimit_consumer_blocked_partitions") == 1 && count(t, ch, "SELECT count() FROM decisions") == n/2
		})
		testenv.CreateTopics(t, kb.brokers, 1, cfg.DeadLetterTopic)
		testenv.WaitFor(t, 60*time.Second, "the partition unblocked once the topic exists", func() bool {
			return metric(t, r.reg, "edgelimit_consumer_blocked_partitions") == 0 && count(t, ch, "SELECT count() FROM decisions") == n
		})
		r.stop()
		wantExact(t, ch, n)
		testenv.Consume(t, kb.brokers, cfg.DeadLetterTopic, 1)
	})
	t.Run("refused", func(t *testing.T) {
		ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
		kb := realBackend(t, 2)
		const n = 2000
		producePoisoned(t, kb, &kgo.Record{Value: []byte("poison")}, n)
		cfg := kb.config()
		// Every produce fails: the topic exists, but refuses every dead
		// letter as too large (a name Kafka refuses is a config error now).
		cfg.DeadLetterTopic += "-tiny"
		ctx, adm, done := testenv.KafkaAdmin(t, kb.brokers, 30*time.Second)
		tiny := "16"
		if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"max.message.bytes": &tiny}, cfg.DeadLetterTopic); err != nil {
			t.Fatal(err)
		}
		done()
		r := start(t, cfg, ch, nil)
		waitRaw(t, ch, n/2, 30*time.Second)
		r.stop()
		got := counts(t, ch)
		t.Logf("events %d, %d on the healthy partition: %v", n, n/2, got)
		if want := (tallies{n / 2, n / 2, n / 2, n / 2, n / 2}); got != want {
			t.Errorf("stored %v, want the healthy partition's %d events in every table", got, n/2)
		}
		if got := count(t, ch, "SELECT count() FROM decisions WHERE kafka_partition = 0"); got != 0 {
			t.Errorf("rows of the blocked partition = %d, want 0 (its poison record is not yet passed on)", got)
		}
		if got := metric(t, r.reg, "edgelimit_consumer_dead_letter_failures_total"); got < 1 {
			t.Errorf("dead_letter_failures_total = %v, want at least 1", got)
		}
	})
}

// producePoisoned writes poison to partition 0 of kb's topic, then n
// decisions spread over partitions 0 and 1, in records of up to 2 MB.
func producePoisoned(t *testing.T, kb kafkaBackend, poison *kgo.Record, n int) {
	t.Helper()
	poison.Partition = 0
	recs := []*kgo.Record{poison}
	for i, d := range decisions(n) {
		rec := record(t, d)
		rec.Partition = int32(i % 2)
		recs = append(recs, rec)
	}
	produceRaw(t, kb.brokers, kb.topic, recs, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(2<<20))
}

// alterMaxMessage lets topic take records of up to 2 MB, as a producer with
// a raised limit could write.
func alterMaxMessage(t *testing.T, brokers []string, topic string) {
	t.Helper()
	ctx, adm, done := testenv.KafkaAdmin(t, brokers, 30*time.Second)
	defer done()
	v := "2097152"
	resp, err := adm.AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestFaultEventTimeFarOff (row 9): events whose time is months from their
// Kafka timestamp (a gateway with a wild clock), over 150 different days.
// They are stored at their Kafka time, so a batch never spans more days
// than Kafka's own clock does.
func TestFaultEventTimeFarOff(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	const n = 300
	ds := decisions(n)
	for i := range ds {
		ds[i].Time = time.Now().AddDate(0, 0, -30-i/2)
	}
	produce(t, kb.brokers, kb.topic, ds)
	r := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, n, 30*time.Second)
	r.stop()
	wantExact(t, ch, n)
	if got := count(t, ch, "SELECT uniqExact(toDate(time)) FROM decisions"); got > 2 {
		t.Errorf("rows span %d days, want at most 2 (Kafka's timestamps)", got)
	}
}

// busyDay is the seeded day of TestFaultDedupeBusyDay: raw rows of the
// partition (what the old dedupe scanned) and committed ledger batches
// (what the resume reads now).
const busyDayRows, busyDayBatches = 1 << 20, 1 << 20

// oldStoredOffsets is the dedupe query before the offset ledger
// (consumer/query/stored_offsets.sql until migration 003): the offsets
// already stored in a partition's time range, read from the raw table. Its
// time column is not a prefix of the raw table's order, so it read the
// whole day; the test runs it only to show the seeded day is busy enough
// to tell the two apart.
const oldStoredOffsets = `SELECT kafka_offset FROM decisions
WHERE time >= ? AND time <= ? AND kafka_topic = ? AND kafka_partition = ?
  AND kafka_offset >= ? AND kafka_offset <= ?`

// TestFaultDedupeBusyDay (row 8): resuming a partition on a busy day. The
// day holds a million raw rows of the partition (its last million offsets,
// 16 a second) and a million committed
// ledger batches (a day at 100k events/s in batches of ~10k over its
// partitions); the resume must read a bounded number of rows (the
// ledger's index from the committed offset on: a granule or two, not the
// day), measured by ClickHouse's own progress reports of every query the
// resume makes. The old dedupe, run on the same day, reads all of it.
func TestFaultDedupeBusyDay(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	if err := ch.Exec(ctx, `INSERT INTO decisions (time, kafka_topic, kafka_partition, kafka_offset, batch_id)
		SELECT toDateTime(?) - intDiv(number, 16), ?, 0, toInt64(? + number), 1 + intDiv(number, 100) FROM numbers(?)`,
		now, kb.topic, int64(busyDayBatches*100-busyDayRows), busyDayRows); err != nil {
		t.Fatal(err)
	}
	if err := ch.Exec(ctx, `INSERT INTO decisions_ledger (batch_id, kafka_topic, topic_id, kafka_partition, first_offset,
		last_offset, generation, fence, state, row_count, min_time, max_time)
		SELECT 1 + number, ?, 'seed', 0, toInt64(number * 100), toInt64(number * 100 + 99), 1, 1, 1, 100,
			toDateTime(?), toDateTime(?) FROM numbers(?)`,
		kb.topic, now, now, busyDayBatches); err != nil {
		t.Fatal(err)
	}
	committed := int64(busyDayBatches*100 - 500) // 500 offsets before the tail
	var read atomic.Uint64
	progress := clickhouse.Context(ctx, clickhouse.WithProgress(func(p *clickhouse.Progress) { read.Add(p.Rows) }))

	c, err := New(kb.config(), ch, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kb.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c.cl = cl
	close(c.clReady)
	if _, _, err := c.resume(progress, map[int32]kgo.Offset{0: kgo.NewOffset().At(committed)}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	resumed := read.Swap(0)

	var old int
	err = eachRow(progress, ch, "old stored offsets", oldStoredOffsets,
		[]any{now.Add(-24 * time.Hour), now, kb.topic, int32(0), committed, committed + 500},
		func(driver.Rows) error { old++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	scanned := read.Load()
	// Two granules of the ledger's index (8,192 rows each), with room for
	// the small fence and abort tables.
	const bound = 3 * 8192
	t.Logf("busy day (%d raw rows, %d ledger batches): resume read %d rows; the old dedupe read %d rows for its %d offsets",
		busyDayRows, busyDayBatches, resumed, scanned, old)
	if resumed > bound {
		t.Errorf("resume read %d rows, want at most %d (the ledger's tail by index, not the day)", resumed, bound)
	}
	if scanned <= 10*bound {
		t.Errorf("the old dedupe read only %d rows: the seeded day is not busy enough to tell a bounded read from a scan", scanned)
	}
}

// TestFaultKafkaTimeUnstorable: records whose Kafka timestamp, set by their
// producer, is before 1970 (Kafka accepts any past one), with event times
// that agree with it or are missing. The driver wraps such a time around
// (1960 became 2096): the rows are stored at the consumer's clock instead,
// counted, and a good event time on a record without a usable Kafka
// timestamp is kept.
func TestFaultKafkaTimeUnstorable(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	before := time.Now().Add(-time.Minute)
	ds := decisions(4)
	kafkaTimes := []time.Time{time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), time.UnixMilli(-2), time.UnixMilli(-2), time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC)}
	ds[0].Time, ds[1].Time, ds[2].Time = kafkaTimes[0], time.Time{}, kafkaTimes[2]
	ds[3].Time = before // good, on a record whose Kafka time is not
	var recs []*kgo.Record
	for i, d := range ds {
		r := record(t, d)
		r.Timestamp = kafkaTimes[i]
		recs = append(recs, r)
	}
	produceRaw(t, kb.brokers, kb.topic, recs)
	r := start(t, kb.config(), ch, nil)
	waitRaw(t, ch, 4, 30*time.Second)
	r.stop()
	after := time.Now().Add(time.Minute)
	wantExact(t, ch, 4)
	if got := count(t, ch, "SELECT count() FROM decisions WHERE time >= toDateTime(?) AND time <= toDateTime(?)",
		before.Unix(), after.Unix()); got != 4 {
		t.Errorf("%d of 4 rows stored between %v and %v, want all (the consumer's clock, or the good event time)", got, before, after)
	}
	if got := count(t, ch, "SELECT count() FROM decisions WHERE time = toDateTime(?)", before.Unix()); got != 1 {
		t.Errorf("%d rows at the good event time %v, want 1", got, before)
	}
	if got := metric(t, r.reg, "edgelimit_consumer_event_time_clamped_total"); got != 3 {
		t.Errorf("event_time_clamped_total = %v, want 3", got)
	}
}

// TestFaultDeadLetterFlood: poison records arrive faster than a batch fills
// by count. Buffered dead letters are bounded by bytes too: once they reach
// the budget they are passed on at once, not after BatchWait (an hour
// here) nor after BatchSize records, which big poison records could make
// gigabytes.
func TestFaultDeadLetterFlood(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	const poison, size, budget = 400, 1 << 10, 64 << 10
	var recs []*kgo.Record
	for range poison {
		v := make([]byte, size)
		v[0] = 0xff // a truncated varint: malformed
		recs = append(recs, &kgo.Record{Value: v})
	}
	good := decisions(10)
	for _, d := range good {
		recs = append(recs, record(t, d))
	}
	produceRaw(t, kb.brokers, kb.topic, recs)
	cfg := kb.config()
	cfg.BatchSize, cfg.BatchWait = 1_000_000, time.Hour
	r := start(t, cfg, ch, func(c *Consumer) { c.deadBudget = budget })
	// All but the last budget's worth are passed on while the batch is
	// nowhere near full nor due.
	testenv.Consume(t, kb.brokers, kb.dlq, poison-budget/size)
	r.stop() // the shutdown flush stores the rest
	if got := len(testenv.Consume(t, kb.brokers, kb.dlq, poison)); got != poison {
		t.Errorf("dead-letter topic holds %d records, want %d", got, poison)
	}
	wantExact(t, ch, uint64(len(good)))
}

// TestFaultSameEventTwice: the same events (the same 16-byte ids) at later
// offsets, as a producer's retry whose first attempt Kafka wrote after all
// leaves them (or a record produced again): in the same batch as their
// first copies, and in a later batch after those were stored. Each event
// is stored once, everywhere, and every repeat counted.
func TestFaultSameEventTwice(t *testing.T) {
	t.Parallel()
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
	wantRepeatsDropped(t, ch, 300, 150, r)
}

func TestIDWindow(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
