package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// openHelperClickHouse is testenv.OpenClickHouse for a helper process, which has
// no testing.TB.
func openHelperClickHouse(addr, db string) (driver.Conn, error) {
	return clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		Protocol:    clickhouse.Native,
		Auth:        clickhouse.Auth{Database: db, Username: "default"},
		DialTimeout: 2 * time.Second,
	})
}

// newDatabase creates a database of the test's own on the ClickHouse at
// addr, migrated, and returns a connection to it. It is dropped at the end.
func newDatabase(tb testing.TB, addr string) (driver.Conn, string) {
	tb.Helper()
	conn, db := testenv.NewDatabase(tb, addr, "edgelimit_test")
	if err := Migrate(context.Background(), conn, Retention{}); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	return conn, db
}

// newKafka starts an in-process kfake cluster with the decisions and
// dead-letter topics.
func newKafka(tb testing.TB, partitions int32) []string {
	tb.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, "decisions", "decisions-dead-letter"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c.ListenAddrs()
}

// realKafka returns the shared real broker with fresh, uniquely named
// topics, so tests do not see each other's records.
func realKafka(tb testing.TB, brokers []string, partitions int32) (topic, deadLetter string) {
	tb.Helper()
	suffix := fmt.Sprintf("%d-%d", time.Now().UnixNano(), rand.IntN(1000))
	topic, deadLetter = "decisions-"+suffix, "dead-letter-"+suffix
	testenv.CreateTopics(tb, brokers, partitions, topic, deadLetter)
	return topic, deadLetter
}

var testStart = time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)

// decisions returns n varied events spread over a few minutes, a few
// gateways, keys and IPs.
func decisions(n int) []event.Decision {
	ds := make([]event.Decision, n)
	for i := range ds {
		t := testStart.Add(time.Duration(i) * 5 * time.Minute / time.Duration(n))
		ds[i] = event.Decision{
			ID:            event.NewID(t),
			Time:          t.Add(time.Duration(i%1000) * time.Microsecond),
			GatewayID:     fmt.Sprintf("gw-%d", i%3),
			KeyID:         fmt.Sprintf("key-%d", i%17),
			KeyKind:       event.KeyKind(1 + i%3),
			ClientIP:      fmt.Sprintf("10.0.0.%d", i%7),
			UserAgentHash: uint64(i % 11),
			Route:         []string{"/a", "/b"}[i%2],
			Method:        "GET",
			Plan:          []string{"free", "pro"}[i%2],
			BindingRule:   []string{"per_minute", "per_hour"}[i%2],
			Allowed:       i%4 != 0,
			Limit:         100,
			Remaining:     int64(i % 100),
			Cost:          int64(1 + i%3),
			StoreStatus:   event.StoreStatus(1 + i%4),
			Mode:          event.Mode(1 + i%5),
			CheckLatency:  time.Duration(100+i%900) * time.Microsecond,
		}
	}
	return ds
}

// produce writes the events to topic as the gateway publishes them.
func produce(tb testing.TB, brokers []string, topic string, ds []event.Decision) {
	tb.Helper()
	var recs []*kgo.Record
	for _, d := range ds {
		recs = append(recs, record(tb, d))
	}
	produceRaw(tb, brokers, topic, recs)
}

// record is d as the gateway publishes it.
func record(tb testing.TB, d event.Decision) *kgo.Record {
	tb.Helper()
	b, err := event.Encode(d)
	if err != nil {
		tb.Fatal(err)
	}
	return &kgo.Record{Value: b, Headers: []kgo.RecordHeader{{Key: event.Header, Value: event.HeaderValue()}}}
}

// produceRaw writes recs to topic, with the producer options opts (a
// manual partitioner, say) beside the defaults.
func produceRaw(tb testing.TB, brokers []string, topic string, recs []*kgo.Record, opts ...kgo.Opt) {
	tb.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.MaxBufferedRecords(1_000_000)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		tb.Fatalf("produce: %v", err)
	}
}

// fastConfig is a Config that reacts quickly, for tests.
func fastConfig(brokers []string) Config {
	return Config{
		Brokers:     brokers,
		BatchSize:   2000,
		BatchWait:   100 * time.Millisecond,
		RetryMin:    50 * time.Millisecond,
		RetryMax:    500 * time.Millisecond,
		LagInterval: 200 * time.Millisecond,
		Opts: []kgo.Opt{
			// A restarted or killed member leaves the group quickly.
			kgo.SessionTimeout(6 * time.Second),
			kgo.RebalanceTimeout(6 * time.Second),
			kgo.HeartbeatInterval(500 * time.Millisecond),
			kgo.FetchMaxWait(200 * time.Millisecond),
		},
	}
}

// running is a Consumer started by start.
type running struct {
	c    *Consumer
	reg  *prometheus.Registry
	stop func()
}

// start runs a consumer until the returned stop is called (or the test
// ends).
func start(tb testing.TB, cfg Config, ch driver.Conn, hook func(*Consumer)) *running {
	tb.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewJSONHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := New(cfg, ch, reg, log)
	if err != nil {
		tb.Fatal(err)
	}
	if hook != nil {
		hook(c)
	}
	run := testenv.Run(tb, c.Run)
	stop := sync.OnceFunc(func() {
		if err := run(); err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	tb.Cleanup(stop)
	return &running{c: c, reg: reg, stop: stop}
}

// testWriter sends log lines to the test log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Logf("%s", p)
	return len(p), nil
}

// count runs a query returning one UInt64.
func count(tb testing.TB, ch driver.Conn, query string, args ...any) uint64 {
	tb.Helper()
	n, err := tryCount(ch, query, args...)
	if err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}

// insert writes one row of values with the native protocol's batch (an
// INSERT with VALUES in its text waits for a data block that never comes).
func insert(tb testing.TB, conn driver.Conn, query string, values ...any) {
	tb.Helper()
	b, err := conn.PrepareBatch(context.Background(), query)
	if err != nil {
		tb.Fatalf("prepare %s: %v", query, err)
	}
	if err := b.Append(values...); err != nil {
		tb.Fatalf("append to %s: %v", query, err)
	}
	if err := b.Send(); err != nil {
		tb.Fatalf("send %s: %v", query, err)
	}
}

func tryCount(ch driver.Conn, query string, args ...any) (uint64, error) {
	var n uint64
	err := ch.QueryRow(context.Background(), query, args...).Scan(&n)
	return n, err
}

// metric reads a counter or gauge from reg, summed over its labels.
func metric(tb testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() != labels[i+1] {
						continue metrics
					}
				}
			}
			switch {
			case m.GetCounter() != nil:
				v += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v += m.GetGauge().GetValue()
			}
		}
	}
	return v
}

// kafkaBackends lists the Kafka brokers a test runs against: kfake always,
// and the real broker when testenv provides one.
type kafkaBackend struct {
	name    string
	brokers []string
	topic   string
	dlq     string
}

func backends(t *testing.T, partitions int32) []kafkaBackend {
	t.Helper()
	bs := []kafkaBackend{{name: "kfake", brokers: newKafka(t, partitions), topic: "decisions", dlq: "decisions-dead-letter"}}
	if os.Getenv("EDGELIMIT_KAFKA_BROKERS") != "" || os.Getenv("EDGELIMIT_REQUIRE_SERVERS") != "" {
		brokers := testenv.KafkaBrokers(t)
		topic, dlq := realKafka(t, brokers, partitions)
		bs = append(bs, kafkaBackend{name: "kafka", brokers: brokers, topic: topic, dlq: dlq})
	}
	return bs
}

// eachBackend runs test as a subtest once per Kafka backend, each with a
// migrated database of its own (named db) on the shared ClickHouse.
func eachBackend(t *testing.T, partitions int32, test func(t *testing.T, kb kafkaBackend, ch driver.Conn, db string)) {
	t.Helper()
	addr := testenv.ClickHouseAddr(t)
	for _, kb := range backends(t, partitions) {
		t.Run(kb.name, func(t *testing.T) {
			ch, db := newDatabase(t, addr)
			test(t, kb, ch, db)
		})
	}
}

func (b kafkaBackend) config() Config {
	cfg := fastConfig(b.brokers)
	cfg.Topic, cfg.DeadLetterTopic = b.topic, b.dlq
	cfg.Group = "test-" + b.topic
	return cfg
}
