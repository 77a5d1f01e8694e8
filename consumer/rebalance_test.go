package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestRebalance moves partitions between two consumers while events keep
// coming: a second consumer joins, then the first leaves. Nothing is lost
// and nothing is stored twice.
func TestRebalance(t *testing.T) {
	eachBackend(t, 4, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		cfg := kb.config()
		cfg.BatchSize = 300
		ds := decisions(8000)
		chunk := func(i int) { produce(t, kb.brokers, kb.topic, ds[i*1000:(i+1)*1000]) }
		rows := func() uint64 { return count(t, ch, "SELECT count() FROM decisions") }

		r1 := start(t, cfg, ch, nil)
		chunk(0)
		chunk(1)
		testenv.WaitFor(t, 60*time.Second, "the first consumer to store rows", func() bool { return rows() >= 1000 })
		r2 := start(t, cfg, ch, nil)
		for i := 2; i < 5; i++ {
			chunk(i)
			time.Sleep(200 * time.Millisecond) // spread the load over the rebalance
		}
		testenv.WaitFor(t, 60*time.Second, "the second consumer to store rows", func() bool {
			return metric(t, r2.reg, "edgelimit_consumer_rows_inserted_total") > 0
		})
		r1.stop()
		for i := 5; i < 8; i++ {
			chunk(i)
		}
		testenv.WaitFor(t, 90*time.Second, "all 8000 rows", func() bool { return rows() >= 8000 })
		r2.stop()

		total := count(t, ch, "SELECT count() FROM decisions")
		uniq := count(t, ch, "SELECT uniqExact(event_id) FROM decisions")
		if total != 8000 || uniq != 8000 {
			t.Errorf("count() = %d, uniqExact(event_id) = %d, want both 8000", total, uniq)
		}
		in1 := metric(t, r1.reg, "edgelimit_consumer_rows_inserted_total")
		in2 := metric(t, r2.reg, "edgelimit_consumer_rows_inserted_total")
		if in1+in2 != 8000 {
			t.Errorf("consumers inserted %v + %v rows, want 8000 in all", in1, in2)
		}
	})
}

// TestPublishToClickHouse runs the whole path: the gateway's Publisher,
// Kafka, this consumer, ClickHouse. Every published event is one row.
func TestPublishToClickHouse(t *testing.T) {
	eachBackend(t, 3, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		reg := prometheus.NewRegistry()
		p, err := publish.New(publish.Config{Brokers: kb.brokers, Topic: kb.topic}, reg, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := start(t, kb.config(), ch, nil)
		const n = 5000
		for _, d := range decisions(n) {
			p.Publish(d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Fatalf("publisher Close: %v", err)
		}
		testenv.WaitFor(t, 60*time.Second, "every published event in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= n
		})
		r.stop()
		if got := count(t, ch, "SELECT uniqExact(event_id) FROM decisions"); got != n {
			t.Errorf("uniqExact(event_id) = %d, want %d", got, n)
		}
		if got := count(t, ch, "SELECT count() FROM decisions"); got != n {
			t.Errorf("count() = %d, want %d", got, n)
		}
		checkRollups(t, ch)
	})
}
