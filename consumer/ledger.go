package consumer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Ledger row states (decisions_ledger.state).
const (
	stateIntent    uint8 = 0
	stateCommitted uint8 = 1
)

// Reasons a stored offset is not trusted, the offsets_distrusted counter's
// reason label.
const (
	distrustTopicID       = "topic_id"
	distrustHighWatermark = "above_high_watermark"
)

// newBatchID returns a random, non-zero batch id (0 marks rows written
// before batch ids existed).
func newBatchID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// batchQueryPrefix starts the query id of every statement that writes the
// batch's rows, so an abort can KILL those still running.
func batchQueryPrefix(batch uint64) string {
	return fmt.Sprintf("edgelimit-batch-%d-", batch)
}

// writeLedger adds one ledger row of state for each partition of batch.
func (c *Consumer) writeLedger(ctx context.Context, batch []*partition, state uint8) error {
	// Into a Distributed table, return only once the shard holds the row:
	// readers hide a batch's rows by its intent (decisions_uncommitted),
	// which must not land after them. No effect on other tables.
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
	b, err := c.ch.PrepareBatch(ctx, qInsertLedger)
	if err != nil {
		return fmt.Errorf("prepare ledger insert: %w", err)
	}
	defer b.Abort()
	_, gen := c.cl.GroupMetadata()
	for _, p := range batch {
		lo, hi := c.now(), c.now()
		if len(p.rows) > 0 {
			lo, hi = timeRange(p.rows)
		}
		if err := b.Append(c.batch, c.cfg.Topic, c.topicID, p.id, p.first, p.end.Offset-1,
			gen, p.fence, state, uint32(len(p.rows)), lo, hi); err != nil {
			return fmt.Errorf("ledger row: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("write ledger (state %d): %w", state, err)
	}
	return nil
}

// abort makes sure batch never counts and leaves no rows: an abort row
// first (from then on no statement of the batch writes anything), then a
// KILL of its statements still running, then a DELETE of its rows from every
// table, waited for. Safe to repeat.
func (c *Consumer) abort(ctx context.Context, batch uint64, _ []int32) error {
	b, err := c.ch.PrepareBatch(ctx, qInsertAbort)
	if err != nil {
		return fmt.Errorf("abort batch %d: %w", batch, err)
	}
	defer b.Abort()
	if err := b.Append(batch, c.cfg.Topic); err != nil {
		return fmt.Errorf("abort batch %d: %w", batch, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("abort batch %d: %w", batch, err)
	}
	shards := c.cfg.Shards
	if len(shards) == 0 {
		shards = []driver.Conn{c.ch}
	} else if err := c.ch.Exec(ctx, qKillBatch, batchQueryPrefix(batch)+"%"); err != nil {
		// The statements run on the server this consumer talks to.
		return fmt.Errorf("abort batch %d: kill its statements: %w", batch, err)
	}
	for _, sh := range shards {
		if err := deleteBatch(ctx, sh, batch); err != nil {
			return fmt.Errorf("abort batch %d: %w", batch, err)
		}
	}
	c.m.batchesAborted.Inc()
	c.log.Warn("aborted a batch that may have been partly written; its rows are deleted and written again", "batch_id", batch)
	return nil
}

// deleteBatch ends the batch's statements still running on conn's server and
// deletes its rows from conn's tables, waiting for the deletes.
func deleteBatch(ctx context.Context, conn driver.Conn, batch uint64) error {
	if err := conn.Exec(ctx, qKillBatch, batchQueryPrefix(batch)+"%"); err != nil {
		return fmt.Errorf("kill its statements: %w", err)
	}
	for _, t := range batchTables {
		if err := conn.Exec(ctx, strings.ReplaceAll(qDeleteBatch, "{table}", t), batch); err != nil {
			return fmt.Errorf("delete from %s: %w", t, err)
		}
	}
	for _, t := range batchTables {
		for {
			var n uint64
			if err := conn.QueryRow(ctx, qMutationsRunning, t).Scan(&n); err != nil {
				return fmt.Errorf("wait for the delete from %s: %w", t, err)
			}
			if n == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("wait for the delete from %s: %w", t, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// maxFences reads the highest claim fence of each partition of the topic.
func (c *Consumer) maxFences(ctx context.Context) (map[int32]uint32, error) {
	fences := map[int32]uint32{}
	err := eachRow(ctx, c.ch, "read fences", qMaxFences, []any{c.cfg.Topic}, func(rows driver.Rows) error {
		var p int32
		var f uint32
		err := rows.Scan(&p, &f)
		fences[p] = f
		return err
	})
	return fences, err
}

// checkFences drops the partitions that another owner has claimed since this
// one did: this consumer lost them (a lost session, or a flush that outlived
// a rebalance) and must not write them. Callers hold mu.
func (c *Consumer) checkFences(ctx context.Context) (lostAny bool, err error) {
	fences, err := c.maxFences(ctx)
	if err != nil {
		return false, err
	}
	var lost []int32
	for id, p := range c.parts {
		if fences[id] > p.fence {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		c.m.fenced.Add(float64(len(lost)))
		c.log.Warn("partitions claimed by a newer owner; not writing them", "partitions", lost)
		c.forget(lost)
	}
	return len(lost) > 0, nil
}

// errFenced fails a batch that holds partitions a newer owner claimed: it is
// aborted and the rest written again without them.
var errFenced = errors.New("partitions claimed by a newer owner")

// ledgerBatch is one batch of a partition as the ledger holds it.
type ledgerBatch struct {
	id          uint64
	state       uint8
	topicID     string
	first, last int64
	lo, hi      time.Time
}

func (c *Consumer) ledgerBatches(ctx context.Context, part int32, from int64) ([]ledgerBatch, error) {
	var bs []ledgerBatch
	err := eachRow(ctx, c.ch, fmt.Sprintf("read ledger of partition %d", part), qLedgerRows, []any{c.cfg.Topic, part, from}, func(rows driver.Rows) error {
		var b ledgerBatch
		err := rows.Scan(&b.id, &b.state, &b.topicID, &b.first, &b.last, &b.lo, &b.hi)
		bs = append(bs, b)
		return err
	})
	return bs, err
}

func (c *Consumer) abortedBatches(ctx context.Context) (map[uint64]bool, error) {
	aborted := map[uint64]bool{}
	err := eachRow(ctx, c.ch, "read aborted batches", qAbortedBatches, []any{c.cfg.Topic}, func(rows driver.Rows) error {
		var id uint64
		err := rows.Scan(&id)
		aborted[id] = true
		return err
	})
	return aborted, err
}

// resumeOffsets runs when partitions are assigned. For each it claims the
// partition, aborts the batches a previous owner left half-written, and
// resumes after the ledger's committed tail, or at the committed offset if
// that is further; the fetch starts a share of the dedupe window earlier,
// to rebuild it (see seedFrom). A tail from another incarnation of the topic (topic id),
// or at or past the partition's end, is not trusted: counted, logged, and
// the committed offset (or the start) used instead. Until ClickHouse and
// Kafka answer it retries, since nothing can be stored meanwhile anyway.
func (c *Consumer) resumeOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	parts := offsets[c.cfg.Topic]
	if len(parts) == 0 {
		return offsets, nil
	}
	for attempt := 0; ; attempt++ {
		next, topicID, err := c.resume(ctx, parts)
		if err == nil {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.topicID = topicID
			for id, n := range next {
				c.parts[id] = n
				committed := parts[id].EpochOffset().Offset
				if n.next != committed {
					c.log.Info("resume from the ledger", "partition", id, "committed", committed, "resume", n.next)
				}
				if n.seedFrom != committed {
					parts[id] = kgo.NewOffset().At(n.seedFrom)
				}
			}
			return offsets, nil
		}
		c.m.retries.WithLabelValues(stageResume).Inc()
		wait := backoff(c.cfg.RetryMin, c.cfg.RetryMax, attempt)
		c.log.Warn("resume partitions; retrying", "attempt", attempt+1, "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// resume works out where each assigned partition starts; see resumeOffsets.
func (c *Consumer) resume(ctx context.Context, parts map[int32]kgo.Offset) (next map[int32]*partition, topicID string, err error) {
	select {
	case <-c.clReady:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	defer cancel()
	adm := kadm.NewClient(c.cl)
	topics, err := adm.ListTopics(ctx, c.cfg.Topic)
	if err != nil {
		return nil, "", fmt.Errorf("read topic metadata: %w", err)
	}
	td, ok := topics[c.cfg.Topic]
	if !ok || td.Err != nil {
		return nil, "", fmt.Errorf("read topic metadata: %v", errors.Join(td.Err, errors.New("topic missing")))
	}
	topicID = hex.EncodeToString(td.ID[:])
	// Each partition's share of the window: what a consumer that had been
	// running, owning every partition, would remember of it.
	seed := int64(dedupeWindow / max(1, len(td.Partitions)))
	ends, err := adm.ListEndOffsets(ctx, c.cfg.Topic)
	if err != nil {
		return nil, "", fmt.Errorf("read end offsets: %w", err)
	}
	fences, err := c.maxFences(ctx)
	if err != nil {
		return nil, "", err
	}
	aborted, err := c.abortedBatches(ctx)
	if err != nil {
		return nil, "", err
	}

	// Claim first, then look for orphans: an old owner that writes an intent
	// after this claim sees the claim before writing rows (checkFences), and
	// one that wrote it before is found below and aborted.
	b, err := c.ch.PrepareBatch(ctx, qInsertClaim)
	if err != nil {
		return nil, "", fmt.Errorf("claim partitions: %w", err)
	}
	defer b.Abort()
	member, gen := c.cl.GroupMetadata()
	next = map[int32]*partition{}
	for id := range parts {
		next[id] = &partition{id: id, fence: fences[id] + 1}
		if err := b.Append(c.cfg.Topic, id, fences[id]+1, gen, member); err != nil {
			return nil, "", fmt.Errorf("claim partitions: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return nil, "", fmt.Errorf("claim partitions: %w", err)
	}
	// An assignment follows every change of the group's members, a killed
	// one's departure too. Not worth retrying the resume for: the next
	// assignment sweeps again.
	if n, err := c.sweepStages(ctx, adm); err != nil {
		c.log.Warn("drop staging tables of consumers gone", "error", err)
	} else if n > 0 {
		c.log.Info("dropped staging tables of consumers gone", "tables", n)
	}

	for id, o := range parts {
		committed := o.EpochOffset().Offset // negative: no commit
		end := int64(-1)
		if lo, ok := ends.Lookup(c.cfg.Topic, id); ok && lo.Err == nil {
			end = lo.Offset
		}
		// The committed offset bounds the tail from below, so only the
		// ledger's rows from there on are read.
		bs, err := c.ledgerBatches(ctx, id, max(committed-1, -1))
		if err != nil {
			return nil, "", err
		}
		tail, foreign := int64(-1), false
		for _, lb := range bs {
			switch {
			case aborted[lb.id] || lb.state == stateIntent:
				// Half written, or aborted by someone who may have died
				// before deleting its rows: abort (again; it is idempotent).
				if err := c.abort(ctx, lb.id, nil); err != nil {
					return nil, "", err
				}
				aborted[lb.id] = true
			case lb.topicID != topicID:
				foreign = true
			default:
				tail = max(tail, lb.last)
			}
		}
		start := max(committed, 0)
		switch {
		case foreign && tail < 0:
			c.distrust(id, distrustTopicID, committed, tail, end)
		case end >= 0 && tail+1 > end:
			c.distrust(id, distrustHighWatermark, committed, tail, end)
		case tail+1 > start:
			start = tail + 1
		}
		if end >= 0 && start > end {
			// A committed offset past the end is no better: the topic was
			// recreated and its group offsets kept.
			c.distrust(id, distrustHighWatermark, committed, tail, end)
			start = 0
		}
		next[id].next = start
		next[id].seedFrom = max(0, start-seed)
		next[id].expect = committed >= 0 || tail >= 0
	}
	return next, topicID, nil
}

// distrust counts and logs a stored offset that cannot be right.
func (c *Consumer) distrust(part int32, reason string, committed, tail, end int64) {
	c.m.offsetsDistrusted.WithLabelValues(reason).Inc()
	c.log.Error("stored offsets do not fit the topic; not resuming from them",
		"partition", part, "reason", reason, "committed", committed, "ledger_tail", tail, "high_watermark", end)
}

// Backfill writes ds into the raw table as a batch of its own and rolls
// it up, for decisions that did not come through Kafka (tests, a load from
// an archive): the same columns as the consumer's, no Kafka position. It is
// not exactly-once (writing ds twice stores it twice). Decisions over more
// days than the server lets one INSERT write (max_partitions_per_insert_block)
// are written in INSERTs of whole days, as the consumer's batches are.
func Backfill(ctx context.Context, conn driver.Conn, ds []event.Decision) error {
	if len(ds) == 0 {
		return nil
	}
	limit, err := maxPartitions(ctx, conn)
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	return backfill(ctx, conn, ds, limit)
}

// backfill is Backfill with at most limit day partitions an INSERT.
func backfill(ctx context.Context, conn driver.Conn, ds []event.Decision, limit int) error {
	batch := newBatchID()
	rows := make([]row, len(ds))
	for i, d := range ds {
		rows[i].d = d
	}
	// In the server's time zone, which the tables partition by, unknown
	// here: grouped by UTC day, a slice of limit-1 days spans at most limit
	// of the server's.
	slices.SortStableFunc(rows, func(a, b row) int { return a.d.Time.Compare(b.d.Time) })
	per := max(1, limit-1)
	for len(rows) > 0 {
		n, days := 0, 0
		for last := ""; n < len(rows); n++ {
			if day := rows[n].d.Time.UTC().Format(time.DateOnly); day != last {
				if days == per {
					break
				}
				days, last = days+1, day
			}
		}
		if err := backfillRows(ctx, conn, rows[:n], batch); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return rollUp(ctx, conn, batch, limit)
}

func backfillRows(ctx context.Context, conn driver.Conn, rows []row, batch uint64) error {
	b, err := conn.PrepareBatch(ctx, qInsertRows("decisions"))
	if err != nil {
		return fmt.Errorf("prepare backfill: %w", err)
	}
	defer b.Abort()
	if err := appendBatch(b, [][]row{rows}, len(rows), batch); err != nil {
		return fmt.Errorf("backfill %d rows: %w", len(rows), err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("backfill %d rows: %w", len(rows), err)
	}
	return nil
}

// RollUp fills every rollup from the raw rows of one batch, for rows written
// into the raw table by something other than the consumer (tests, a
// backfill; batch 0 is every row written before migration 003) or to
// rebuild a rollup after its rows were lost. It reads the raw table by
// batch_id, a scan: not for the ingest path. Rolling up a batch twice counts
// it twice. A batch over more days than one INSERT may write is rolled up
// in slices of whole days.
func RollUp(ctx context.Context, conn driver.Conn, batch uint64) error {
	limit, err := maxPartitions(ctx, conn)
	if err != nil {
		return fmt.Errorf("roll up batch %d: %w", batch, err)
	}
	return rollUp(ctx, conn, batch, limit)
}

// rollUp is RollUp with at most limit day partitions an INSERT.
func rollUp(ctx context.Context, conn driver.Conn, batch uint64, limit int) error {
	days, err := readDays(ctx, conn, qBatchDays, batch)
	if err != nil {
		return fmt.Errorf("roll up batch %d: %w", batch, err)
	}
	srcs := daySlices("decisions", "batch_id = "+strconv.FormatUint(batch, 10), days, limit)
	for i, q := range qRollups {
		for _, src := range srcs {
			if err := conn.Exec(ctx, strings.ReplaceAll(q, "{stage}", src), batch); err != nil {
				return fmt.Errorf("roll up batch %d into %s: %w", batch, batchTables[i+1], err)
			}
		}
	}
	return nil
}
