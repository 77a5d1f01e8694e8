package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// partitionLimitConn refuses, as current ClickHouse does with its default
// max_partitions_per_insert_block, an INSERT into a batch table whose rows
// fall in more than limit day partitions (ClickHouse 18.16, the real-server
// tier, has no such limit). It counts the refusals and the most partitions
// one accepted INSERT wrote.
type partitionLimitConn struct {
	driver.Conn
	limit    uint64
	refused  atomic.Int64
	mostDays atomic.Uint64
}

func (c *partitionLimitConn) Exec(ctx context.Context, query string, args ...any) error {
	for _, table := range batchTables {
		if !strings.HasPrefix(query, "INSERT INTO "+table+" ") {
			continue
		}
		// The partition key is the day of the table's time column.
		i := slices.IndexFunc(retainedTables, func(r retainedTable) bool { return r.name == table })
		key := retainedTables[i].column
		sel := query[strings.Index(query, "SELECT"):]
		var days uint64
		// Not under ctx, which carries the statement's query id: the
		// server refuses the statement when this count, under the same id,
		// is still listed as running.
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.Conn.QueryRow(cctx, "SELECT toUInt64(uniqExact(toYYYYMMDD("+key+"))) FROM ("+sel+")", args...).Scan(&days)
		cancel()
		if err != nil {
			return fmt.Errorf("count the insert's partitions: %w", err)
		}
		if days > c.limit {
			c.refused.Add(1)
			return &proto.Exception{Code: 252, Name: "DB::Exception",
				Message: fmt.Sprintf("Too many partitions for single INSERT block (more than %d)", c.limit)}
		}
		for m := c.mostDays.Load(); days > m && !c.mostDays.CompareAndSwap(m, days); m = c.mostDays.Load() {
		}
	}
	return c.Conn.Exec(ctx, query, args...)
}

// TestFaultBatchOverManyPartitions: valid events whose Kafka timestamps (and
// event times, which agree) spread one batch over 150 days, more day
// partitions than current ClickHouse lets one INSERT write. The consumer
// refused that way retried the same batch for ever, storing nothing more:
// it must write every event once, no INSERT over the limit.
func TestFaultBatchOverManyPartitions(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 1)
	const days = 150
	now := time.Now().UTC()
	ds := decisions(2 * days)
	var recs []*kgo.Record
	for i := range ds {
		ts := now.AddDate(0, 0, -(i % days)).Truncate(time.Millisecond)
		ds[i].Time = ts
		r := record(t, ds[i])
		r.Timestamp = ts
		recs = append(recs, r)
	}
	produceRaw(t, kb.brokers, kb.topic, recs)
	limited := &partitionLimitConn{Conn: ch, limit: defaultMaxPartitions}
	cfg := kb.config()
	// One batch holds them all.
	cfg.BatchWait = 2 * time.Second
	// One batch of 150 days writes a part per day into each of five
	// tables, 750 in all: on a loaded 18.16 that outlasted the default 30s,
	// and each retry was the same batch again.
	cfg.InsertTimeout = 55 * time.Second
	r := start(t, cfg, limited, nil)
	// The batch committed, not its raw rows alone: stopped before its
	// commit, it is aborted (and read again by the next owner).
	testenv.WaitFor(t, 120*time.Second, "the batch committed", func() bool {
		return committed(t, kb.brokers, cfg.Group, kb.topic)[0] == int64(len(ds))
	})
	r.stop()
	wantExact(t, ch, uint64(len(ds)))
	if got := count(t, ch, "SELECT toUInt64(uniqExact(toYYYYMMDD(time))) FROM decisions"); got != days {
		t.Errorf("raw rows in %d day partitions, want %d", got, days)
	}
	if n := limited.refused.Load(); n > 0 {
		t.Errorf("%d INSERTs refused for writing more than %d partitions", n, limited.limit)
	}
	t.Logf("most partitions written by one INSERT: %d", limited.mostDays.Load())
}

func (c *partitionLimitConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	b, err := c.Conn.PrepareBatch(ctx, query, opts...)
	if err != nil || !strings.HasPrefix(query, qInsertRows(batchTables[0])) {
		return b, err
	}
	return &limitedBatch{Batch: b, conn: c, days: map[string]bool{}}, nil
}

// limitedBatch refuses, at Send, a raw-table batch whose rows' times (as
// appendBatch appends them, a column at a time) fall in more than its
// conn's limit of days.
type limitedBatch struct {
	driver.Batch
	conn *partitionLimitConn
	days map[string]bool
}

func (b *limitedBatch) Column(i int) driver.BatchColumn {
	if i >= len(decisionColumns) || decisionColumns[i].name != "time" { // batch_id follows them
		return b.Batch.Column(i)
	}
	return timeColumn{BatchColumn: b.Batch.Column(i), days: b.days}
}

// timeColumn notes the days of the times appended to it.
type timeColumn struct {
	driver.BatchColumn
	days map[string]bool
}

func (c timeColumn) Append(v any) error {
	for _, t := range v.([]time.Time) {
		c.days[t.UTC().Format(time.DateOnly)] = true
	}
	return c.BatchColumn.Append(v)
}

func (b *limitedBatch) Send() error {
	if uint64(len(b.days)) > b.conn.limit {
		b.conn.refused.Add(1)
		return &proto.Exception{Code: 252, Name: "DB::Exception",
			Message: fmt.Sprintf("Too many partitions for single INSERT block (more than %d)", b.conn.limit)}
	}
	return b.Batch.Send()
}

// TestBackfillOverManyPartitions: decisions over more day partitions than
// the server lets one INSERT write (current ClickHouse's
// max_partitions_per_insert_block, 100 by default; 10 here, which keeps
// the parts 18.16 writes few). Backfill sent them in one INSERT, and RollUp
// rolled the batch up in one INSERT per rollup, each refused whole: both
// must write slices of whole days, and every table hold every decision.
func TestBackfillOverManyPartitions(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	const limit, days = 10, 25
	now := time.Now().UTC()
	ds := decisions(2 * days)
	for i := range ds {
		ds[i].Time = now.AddDate(0, 0, -(i % days)).Truncate(time.Second)
	}
	limited := &partitionLimitConn{Conn: ch, limit: limit}
	if err := backfill(context.Background(), limited, ds, limit); err != nil {
		t.Fatalf("backfill of %d days, %d a statement: %v", days, limit, err)
	}
	wantExact(t, ch, uint64(len(ds)))
	if n := limited.refused.Load(); n > 0 {
		t.Errorf("%d INSERTs refused for writing more than %d partitions", n, limited.limit)
	}
	if got := limited.mostDays.Load(); got == 0 || got > limit {
		t.Errorf("most partitions written by one rollup INSERT: %d, want 1 to %d", got, limit)
	}
}
