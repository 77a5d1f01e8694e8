package consumer

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// BenchmarkIngest measures one consumer's ingest rate into ClickHouse: b.N
// events are produced first, then timed from the moment the consumer owns
// its partitions until ClickHouse holds them all. Real Kafka when testenv
// provides it, else kfake (in-process, so it competes for the CPU).
// Reports events/s.
// produceN writes n varied events to topic, streaming: b.N can be millions.
func produceN(b *testing.B, brokers []string, topic string, n int) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var failed atomic.Int64
	ds := decisions(min(n, 100_000))
	for i := range n {
		d := ds[i%len(ds)]
		d.ID = event.NewID(d.Time)
		cl.Produce(ctx, record(b, d), func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil || failed.Load() > 0 {
		b.Fatalf("produce %d events: flush %v, %d failed", n, err, failed.Load())
	}
}

func BenchmarkIngest(b *testing.B) {
	addr := testenv.ClickHouseAddr(b)
	for _, parts := range []int32{1, 4} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			brokers, topic, dlq := newKafka(b, parts), "decisions", "decisions-dead-letter"
			kafka := "kfake"
			if os.Getenv("EDGELIMIT_KAFKA_BROKERS") != "" {
				brokers = testenv.KafkaBrokers(b)
				topic, dlq = realKafka(b, brokers, parts)
				kafka = "kafka"
			}
			ch, _ := newDatabase(b, addr)
			produceN(b, brokers, topic, b.N)

			cfg := fastConfig(brokers)
			cfg.Topic, cfg.DeadLetterTopic, cfg.Group = topic, dlq, "bench-"+topic
			cfg.BatchSize = 100_000
			cfg.BatchWait = 200 * time.Millisecond
			b.ResetTimer()
			r := start(b, cfg, ch, nil)
			testenv.WaitFor(b, time.Minute, "partitions assigned", func() bool {
				r.c.mu.Lock()
				defer r.c.mu.Unlock()
				return len(r.c.parts) == int(parts)
			})
			began := time.Now()
			b.ResetTimer()
			testenv.WaitFor(b, 10*time.Minute, "every event in ClickHouse", func() bool {
				n, err := tryCount(ch, "SELECT count() FROM decisions")
				return err == nil && n >= uint64(b.N)
			})
			elapsed := time.Since(began)
			b.StopTimer()
			r.stop()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			b.Logf("%s, %d partitions: %d events in %v", kafka, parts, b.N, elapsed)
		})
	}
}
