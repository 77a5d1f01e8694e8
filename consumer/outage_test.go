package consumer

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestClickHouseOutage stops a private ClickHouse under a running consumer:
// it stops committing and retries, and once the server is back it stores
// everything, once. Then it stops ClickHouse before a consumer starts.
func TestClickHouseOutage(t *testing.T) {
	t.Parallel()
	srv := testenv.Private(t, "clickhouse")
	ch, _ := newDatabase(t, srv.Get(t, "EDGELIMIT_CLICKHOUSE_ADDR"))
	kb := backends(t, 2)
	b := kb[len(kb)-1] // the real broker when there is one
	cfg := b.config()
	ds := decisions(6000)

	produce(t, b.brokers, b.topic, ds[:2000])
	r := start(t, cfg, ch, nil)
	testenv.WaitFor(t, 60*time.Second, "the first 2000 rows", func() bool {
		return count(t, ch, "SELECT count() FROM decisions") == 2000
	})
	testenv.WaitFor(t, 30*time.Second, "the first 2000 committed", func() bool {
		var sum int64
		for _, o := range committed(t, b.brokers, cfg.Group, cfg.Topic) {
			sum += o
		}
		return sum == 2000
	})

	srv.Halt(t)
	produce(t, b.brokers, b.topic, ds[2000:])
	testenv.WaitFor(t, 30*time.Second, "insert retries while ClickHouse is down", func() bool {
		// Every attempt fails staging the batch, before anything that
		// would need an abort.
		return metric(t, r.reg, "edgelimit_consumer_retries_total", "stage", stageStage) >= 2
	})
	var sum int64
	for _, o := range committed(t, b.brokers, cfg.Group, cfg.Topic) {
		sum += o
	}
	if sum != 2000 {
		t.Errorf("committed %d records while ClickHouse was down, want still 2000", sum)
	}
	testenv.WaitFor(t, 30*time.Second, "lag to show the backlog", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_lag") >= 2000
	})

	// resume brings ClickHouse back, and stops r once it stored all n rows,
	// which must be n rows exactly.
	resume := func(r *running, n uint64) {
		t.Helper()
		srv.Resume(t)
		testenv.WaitFor(t, 90*time.Second, "every row after ClickHouse returned", func() bool {
			got, err := tryCount(ch, "SELECT count() FROM decisions")
			return err == nil && got >= n
		})
		r.stop()
		if got := count(t, ch, "SELECT count() FROM decisions"); got != n {
			t.Errorf("count() = %d, want %d", got, n)
		}
	}
	resume(r, 6000)

	// A consumer that starts while ClickHouse is down cannot know where
	// to resume: it waits, retrying, and then starts at the right place.
	srv.Halt(t)
	more := decisions(1000)
	produce(t, b.brokers, b.topic, more)
	r2 := start(t, cfg, ch, nil)
	testenv.WaitFor(t, 30*time.Second, "resume retries while ClickHouse is down", func() bool {
		return metric(t, r2.reg, "edgelimit_consumer_retries_total", "stage", stageResume) >= 1
	})
	resume(r2, 7000)
	if got := count(t, ch, "SELECT uniqExact(event_id) FROM decisions"); got != 7000 {
		t.Errorf("uniqExact(event_id) = %d, want 7000", got)
	}
	if got := count(t, ch, "SELECT toUInt64(sum(requests)) FROM decisions_by_key_1m"); got != 7000 {
		t.Errorf("rollup requests = %d, want 7000", got)
	}
}

// TestKafkaOutageCounted halts a private Kafka broker under a consumer that
// has stored and committed everything: nothing is fetched, committed or
// inserted, so only the lag measurement meets the outage. Its failures are
// counted as retries (the EdgelimitConsumerRetrying alert), not left as a
// frozen lag gauge that reads 0 throughout. Once the broker is back the
// consumer stores the rest, once.
func TestKafkaOutageCounted(t *testing.T) {
	t.Parallel()
	srv := testenv.Private(t, "kafka")
	brokers := srv.Brokers(t)
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	topic, dlq := realKafka(t, brokers, 2)
	b := kafkaBackend{name: "kafka", brokers: brokers, topic: topic, dlq: dlq}
	cfg := b.config()
	ds := decisions(400)
	produce(t, brokers, topic, ds[:200])
	r := start(t, cfg, ch, nil)
	testenv.WaitFor(t, 60*time.Second, "the first 200 rows", func() bool {
		return count(t, ch, "SELECT count() FROM decisions") == 200
	})
	// The group's coordinator answers once the consumer has joined.
	testenv.WaitFor(t, 30*time.Second, "the first 200 committed", func() bool {
		var sum int64
		for _, o := range committed(t, brokers, cfg.Group, topic) {
			sum += o
		}
		return sum == 200
	})
	before := metric(t, r.reg, "edgelimit_consumer_retries_total")

	srv.Halt(t)
	testenv.WaitFor(t, 60*time.Second, "retries counted while Kafka is down", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_retries_total") >= before+3
	})
	srv.Resume(t)
	produce(t, brokers, topic, ds[200:])
	waitRaw(t, ch, 400, 60*time.Second)
	r.stop()
	wantExact(t, ch, 400)
}

// TestLagSecondsAfterFutureTimestamp: a producer whose clock runs ahead
// (the broker takes timestamps up to log.message.timestamp.after.max.ms
// ahead, an hour by default) stores a record timestamped in the future.
// When ClickHouse then stops, records wait, and lag_seconds must grow (the
// EdgelimitConsumerLagSeconds alert), not read 0 until the wall clock has
// caught up with that timestamp.
func TestLagSecondsAfterFutureTimestamp(t *testing.T) {
	t.Parallel()
	srv := testenv.Private(t, "clickhouse")
	ch, _ := newDatabase(t, srv.Get(t, "EDGELIMIT_CLICKHOUSE_ADDR"))
	b := realBackend(t, 1)
	cfg := b.config()
	cfg.LagInterval = 100 * time.Millisecond
	ds := decisions(101)

	ahead := record(t, ds[0])
	ahead.Timestamp = time.Now().Add(30 * time.Minute)
	produceRaw(t, b.brokers, b.topic, []*kgo.Record{ahead})
	r := start(t, cfg, ch, nil)
	waitRaw(t, ch, 1, 60*time.Second)
	// The group's coordinator answers once the consumer has joined.
	testenv.WaitFor(t, 30*time.Second, "the record from the future committed", func() bool {
		return committed(t, b.brokers, cfg.Group, cfg.Topic)[0] == 1
	})

	srv.Halt(t)
	produce(t, b.brokers, b.topic, ds[1:])
	testenv.WaitFor(t, 60*time.Second, "lag measured while ClickHouse is down", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_lag") == 100
	})
	testenv.WaitFor(t, 30*time.Second, "lag_seconds above 0 while records wait", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_lag_seconds") > 0
	})
	srv.Resume(t)
	waitRaw(t, ch, 101, 60*time.Second)
	r.stop()
	wantExact(t, ch, 101)
}
