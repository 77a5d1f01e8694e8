package consumer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// slowConn is a ClickHouse too slow for big batches: the raw INSERT of a
// batch that staged more than limit rows writes its rows, then does not
// return until its deadline, the way an insert of many parts on a loaded
// server outlasts the insert timeout. Smaller batches are written at the
// server's speed.
type slowConn struct {
	driver.Conn
	limit  int
	staged atomic.Int64 // rows of the last staged batch
	slowed atomic.Int64
}

func (c *slowConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	b, err := c.Conn.PrepareBatch(ctx, query, opts...)
	if err != nil || !strings.Contains(query, columnNames()) {
		return b, err
	}
	return &stagingBatch{Batch: b, conn: c}, nil
}

// stagingBatch records how many rows a batch staged.
type stagingBatch struct {
	driver.Batch
	conn *slowConn
}

func (b *stagingBatch) Send() error {
	b.conn.staged.Store(int64(b.Batch.Rows()))
	return b.Batch.Send()
}

func (c *slowConn) Exec(ctx context.Context, query string, args ...any) error {
	if !strings.HasPrefix(query, "INSERT INTO "+batchTables[0]+" ") || c.staged.Load() <= int64(c.limit) {
		return c.Conn.Exec(ctx, query, args...)
	}
	c.slowed.Add(1)
	if err := c.Conn.Exec(ctx, query, args...); err != nil {
		return err
	}
	<-ctx.Done() // still "writing" when the deadline comes
	return ctx.Err()
}

// TestFaultSlowInsertShrinksBatch: ClickHouse cannot write a batch of more
// than 150 rows within the insert timeout. The consumer retried the same
// whole batch for ever, storing nothing: it must shrink its batches until
// they fit, store every event once (the timed-out attempts, whose raw rows
// were written, aborted), and count the shrinking.
func TestFaultSlowInsertShrinksBatch(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	kb := realBackend(t, 2)
	ds := decisions(1000)
	produce(t, kb.brokers, kb.topic, ds)
	slow := &slowConn{Conn: ch, limit: 150}
	cfg := kb.config()
	cfg.BatchSize = 400
	cfg.InsertTimeout = 2 * time.Second
	r := start(t, cfg, slow, nil)
	// Counted once a batch's commit row is written.
	testenv.WaitFor(t, 60*time.Second, "every event stored", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_rows_inserted_total") == float64(len(ds))
	})
	r.stop()
	wantExact(t, ch, uint64(len(ds)))
	if slow.slowed.Load() == 0 {
		t.Errorf("no batch over %d rows was tried: the test shows nothing", slow.limit)
	}
	if got := metric(t, r.reg, "edgelimit_consumer_batches_shrunk_total"); got < 1 {
		t.Errorf("batches_shrunk_total = %v, want at least 1", got)
	}
	if got := metric(t, r.reg, "edgelimit_consumer_batches_aborted_total"); got < 1 {
		t.Errorf("batches_aborted_total = %v, want the timed-out attempts aborted", got)
	}
}
