package consumer

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/gateway/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// stuckConn is a ClickHouse that cannot write one partition's rows in time:
// the raw INSERT of a batch holding rows of partition stuck writes them,
// then does not return until its deadline. Other batches are written at
// the server's speed.
type stuckConn struct {
	driver.Conn
	stuck   int32
	slowed  atomic.Int64
	stageRe *regexp.Regexp
}

func (c *stuckConn) Exec(ctx context.Context, query string, args ...any) error {
	if !strings.HasPrefix(query, "INSERT INTO "+batchTables[0]+" ") {
		return c.Conn.Exec(ctx, query, args...)
	}
	stage := c.stageRe.FindString(query)
	var n uint64
	// Not under ctx, whose query id is the INSERT's.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := c.Conn.QueryRow(cctx, "SELECT count() FROM "+stage+" WHERE kafka_partition = ?", c.stuck).Scan(&n)
	cancel()
	if err != nil {
		return err
	}
	if err := c.Conn.Exec(ctx, query, args...); err != nil || n == 0 {
		return err
	}
	c.slowed.Add(1)
	<-ctx.Done() // still "writing" when the deadline comes
	return ctx.Err()
}

// TestFaultStuckPartitionDeadLettered: every insert of partition 1's rows
// outlives the insert timeout, while partition 0 keeps getting traffic and
// is stored. The consumer shrank its batches to the floor and retried
// partition 1 for ever, storing none of it (507 of 1000 events missing after
// 40 s, in the report), with nothing but lag to say so. Partition 1's batch
// must go to the dead-letter topic, by batch, with reason insert_timeout
// and its source offsets, counted in batches_dead_lettered_total; its
// offsets must be committed past it, and partition 0 stored exactly once.
func TestFaultStuckPartitionDeadLettered(t *testing.T) {
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	conn := &stuckConn{Conn: ch, stuck: 1, stageRe: regexp.MustCompile(`decisions_stage_[0-9_]+`)}
	cfg := kb.config()
	// Twice the floor: the first timeout halves the batch to the floor,
	// where timeouts strike.
	cfg.BatchSize = 2 * minBatchLimit
	cfg.InsertTimeout = time.Second
	cfg.StuckAttempts = 2
	r := start(t, cfg, conn, nil)

	// Partition 0 keeps getting traffic, as a healthy partition does: its
	// batches are what shows the server takes rows in time.
	manual := kgo.RecordPartitioner(kgo.ManualPartitioner())
	prod, err := kgo.NewClient(kgo.SeedBrokers(kb.brokers...), kgo.DefaultProduceTopic(kb.topic), manual)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var healthy atomic.Int64
	stopLoad := testenv.Load(t, 1, 100*time.Millisecond, func(ctx context.Context) {
		var recs []*kgo.Record
		for _, d := range decisions(10) {
			b, err := event.Encode(d)
			if err != nil {
				t.Error(err)
				return
			}
			recs = append(recs, &kgo.Record{Partition: 0, Value: b, Headers: []kgo.RecordHeader{{Key: event.Header, Value: event.HeaderValue()}}})
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			if ctx.Err() == nil {
				t.Errorf("produce to partition 0: %v", err)
			}
			return
		}
		healthy.Add(int64(len(recs)))
	})
	testenv.WaitFor(t, 30*time.Second, "partition 0 stored", func() bool {
		return committed(t, kb.brokers, cfg.Group, kb.topic)[0] > 0
	})

	const stuckRows = 50
	var recs []*kgo.Record
	for _, d := range decisions(stuckRows) {
		r := record(t, d)
		r.Partition = 1
		recs = append(recs, r)
	}
	produceRaw(t, kb.brokers, kb.topic, recs, manual)
	testenv.WaitFor(t, 40*time.Second, "partition 1 committed past its stuck batch", func() bool {
		return committed(t, kb.brokers, cfg.Group, kb.topic)[1] == stuckRows
	})
	stopLoad()
	testenv.WaitFor(t, 30*time.Second, "partition 0 committed", func() bool {
		return committed(t, kb.brokers, cfg.Group, kb.topic)[0] == healthy.Load()
	})
	r.stop()

	wantExact(t, ch, uint64(healthy.Load()))
	if n := count(t, ch, "SELECT count() FROM decisions WHERE kafka_partition = 1"); n != 0 {
		t.Errorf("%d rows of partition 1 stored, want 0 (they were dead-lettered)", n)
	}
	if conn.slowed.Load() < int64(cfg.StuckAttempts) {
		t.Errorf("partition 1's inserts timed out %d times, want at least %d: the test shows nothing", conn.slowed.Load(), cfg.StuckAttempts)
	}
	offsets := map[int64]bool{}
	for _, dl := range testenv.Consume(t, kb.brokers, kb.dlq, stuckRows) {
		h := headers(dl)
		if h[HeaderReason] != ReasonInsertTimeout || h[HeaderSourcePartition] != "1" || h[event.Header] != string(event.HeaderValue()) {
			t.Errorf("dead letter headers %v, want reason %s from partition 1 with the schema header", h, ReasonInsertTimeout)
		}
		off, _ := strconv.ParseInt(h[HeaderSourceOffset], 10, 64)
		offsets[off] = true
		var d event.Decision
		if err := event.DecodeInto(&d, dl.Value); err != nil || d.ID == ([16]byte{}) {
			t.Errorf("dead letter value does not decode as an event: %v", err)
		}
	}
	if len(offsets) != stuckRows {
		t.Errorf("dead letters name %d distinct offsets, want %d", len(offsets), stuckRows)
	}
	// The 50 records may have been fetched, and so batched, in parts.
	if got := metric(t, r.reg, "edgelimit_consumer_batches_dead_lettered_total"); got < 1 {
		t.Errorf("batches_dead_lettered_total = %v, want at least 1", got)
	}
	if got := metric(t, r.reg, "edgelimit_consumer_dead_letters_total", "reason", ReasonInsertTimeout); got != stuckRows {
		t.Errorf("dead_letters_total{reason=%q} = %v, want %d", ReasonInsertTimeout, got, stuckRows)
	}
}
