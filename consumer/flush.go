package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// flush stores everything buffered, in batches of at most the batch limit,
// retrying with backoff until it succeeds or ctx ends.
func (c *Consumer) flush(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		stage, err := c.flushOnce(ctx)
		if err == nil && c.more && ctx.Err() == nil {
			attempt = -1 // the next batch starts afresh
			continue
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrSchemaNewer) {
			return fmt.Errorf("%s: %w", stage, err)
		}
		c.m.retries.WithLabelValues(stage).Inc()
		if c.starved() {
			return fmt.Errorf("%s: %w", stage, errStarved)
		}
		wait := backoff(c.cfg.RetryMin, c.cfg.RetryMax, attempt)
		c.log.Warn("flush failed; retrying", "stage", stage, "attempt", attempt+1, "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", stage, err)
		case <-time.After(wait):
		}
	}
}

// errStarved ends a flush whose suspect partition, tried alone, timed out
// with no other partition's rows buffered: poll fetches some (see starved)
// before the next try, for only another partition's batch stored in time
// can show that the suspect is stuck.
var errStarved = errors.New("a suspect partition timed out alone; fetching others before trying again")

// starved reports whether the last batch was a suspect partition alone
// that timed out while no other partition had rows to store.
func (c *Consumer) starved() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lone == nil {
		return false
	}
	for _, p := range c.parts {
		if p != c.lone && !p.blocked && len(p.rows) > 0 {
			return false
		}
	}
	return true
}

// backoff is the wait before retry attempt+1: exponential from lo, capped
// at hi, with up to 20% jitter so consumers do not retry in lockstep.
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := lo << min(attempt, 30)
	if d > hi || d <= 0 {
		d = hi
	}
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// Flush stages, the retries counter's stage label.
const (
	stageDeadLetter = "dead_letter"
	stageAbort      = "abort"
	stageStage      = "stage"
	stageInsert     = "insert"
	stageLedger     = "ledger"
	stageCommit     = "commit"
	stageResume     = "resume"
	stageSchema     = "schema"
	stageLag        = "lag"
)

// flushable counts the buffered records of partitions that are not blocked.
// Callers hold mu.
func (c *Consumer) flushable() int {
	n := c.pending
	for _, p := range c.parts {
		if p.blocked {
			n -= len(p.rows) + len(p.dead)
		}
	}
	return n
}

// flushableDeadBytes sums the dead letters of partitions that are not
// blocked: a blocked partition's are paused, not growing, and must not hold
// the others back. Callers hold mu.
func (c *Consumer) flushableDeadBytes() int {
	n := 0
	for _, p := range c.parts {
		if !p.blocked {
			n += p.deadBytes
		}
	}
	return n
}

// flushOnce makes one attempt at storing one batch: every buffered record of
// the partitions whose dead letters could be produced. It holds mu
// throughout, so no partition changes owner in the middle.
//
// Why a batch counts exactly once (schema.md, "Exactly once"):
//   - Its rows are sent once, into this consumer's Memory staging table; the
//     raw rows and each rollup are then INSERT…SELECTs from it, every row
//     tagged with the batch id, each statement writing nothing if the batch
//     is in decisions_aborts (the check runs inside the statement).
//   - An intent row in the ledger precedes the writes and a commit row
//     follows them. A batch counts when it has a commit row and no abort.
//   - Any attempt that may have written and did not commit is aborted before
//     anything else happens: abort row, KILL of its statements still
//     running, DELETE of its tagged rows. The next attempt is a new batch.
//   - A new owner of a partition claims it with a higher fence, then aborts
//     every batch of that partition that has an intent and no commit (a
//     crashed or fenced owner's), then resumes after the committed tail. An
//     owner that sees a higher fence than its own stops writing.
//
// A batch holds at most c.limit rows; one whose rows cannot be staged and
// inserted within InsertTimeout halves it (shrink), so a slow server gets
// ever smaller batches instead of the same one for ever.
func (c *Consumer) flushOnce(parent context.Context) (stage string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.more, c.lone = false, nil
	// Every step is bounded: while mu is held, a rebalance waits.
	ctx, cancel := context.WithTimeout(parent, c.cfg.InsertTimeout)
	defer cancel()

	if c.failed {
		if err := c.abort(ctx, c.batch, nil); err != nil {
			return stageAbort, err
		}
		c.failed = false
		c.batch = newBatchID()
	}

	c.produceDeadLetters(ctx)

	var batch []*partition
	for _, p := range c.parts {
		if !p.blocked && p.hasEnd && len(p.dead) == 0 {
			batch = append(batch, p)
		}
	}
	if len(batch) == 0 {
		return "", nil
	}
	batch, heldBack := c.isolate(batch)
	// Before anything is written: the rows dropped are gone from the
	// buffer, so a retry of this batch neither stores nor counts them again.
	buffered := c.dropDuplicates(batch)
	// A suspect partition alone is tried at the smallest batch, whatever
	// the limit of the others' batches does meanwhile: each of its
	// timeouts is then a strike, and a stuck partition reaches the
	// dead-letter topic within a bounded number of attempts (timedOut).
	limit, lone := c.limit, len(batch) == 1 && batch[0].suspect
	if lone {
		limit = min(limit, c.floor())
	}
	batch, rows, holds := cut(batch, buffered, limit)
	defer func() {
		if err == nil {
			return
		}
		restore(holds)
		// The attempt's own deadline, not Run stopping: the batch was too
		// big for the server as it is now, or its partition is stuck.
		if (stage == stageStage || stage == stageInsert) && errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil {
			// A suspect alone at the smallest batch is its own fault
			// until others time out too: the others' limit stays.
			c.timedOut(batch, rows, lone || c.limit <= c.floor())
			if lone {
				c.lone = batch[0]
			} else {
				c.shrink(rows)
			}
		}
	}()
	if c.beforeInsert != nil {
		c.beforeInsert()
	}
	if rows > 0 {
		c.useStage(ctx)
		if err := c.fillStage(ctx, batch, rows); err != nil {
			return stageStage, err
		}
	}
	// Before the batch writes anything but its own staging table: a newer
	// consumer may have migrated the schema since this one started (a
	// rolling upgrade).
	if err := c.checkSchema(ctx); err != nil {
		return stageSchema, err
	}
	// From the intent row on, a failure may leave rows behind: the next
	// attempt aborts this batch first.
	c.failed = true
	if err := c.writeLedger(ctx, batch, stateIntent); err != nil {
		return stageLedger, err
	}
	// After the intent, before any row: a new owner either claimed before
	// this check (seen here) or finds the intent and aborts the batch.
	if lost, err := c.checkFences(ctx); err != nil || lost {
		return stageLedger, errors.Join(err, errFenced)
	}
	if rows > 0 {
		start := time.Now()
		if err := c.insertFromStage(ctx); err != nil {
			return stageInsert, err
		}
		c.m.batchSeconds.Observe(time.Since(start).Seconds())
		c.m.batchRows.Observe(float64(rows))
	}
	if err := c.writeLedger(ctx, batch, stateCommitted); err != nil {
		return stageLedger, err
	}
	c.failed = false
	c.batch = newBatchID()
	c.cleared(batch, rows)
	c.m.rowsInserted.Add(float64(rows))
	c.remember(batch)
	c.fitted(rows)
	// The staged copy is not needed once the ledger holds the batch. A
	// Memory table lives in ClickHouse's RAM until the server restarts, and
	// a consumer killed before Run drops it would otherwise leave a whole
	// batch there. A failure here is harmless: the next batch truncates it.
	if rows > 0 {
		if err := c.ch.Exec(ctx, c.stageSQL(qTruncateStage)); err != nil {
			c.log.Warn("empty staging table", "table", c.stage, "error", err)
		}
	}
	c.keepRest(holds)
	c.more = rows < buffered || heldBack
	for _, p := range batch {
		if trimmed(holds, p) {
			// Its set-aside rows wait for the next batch, and the newest
			// timestamp it buffered is not stored yet.
			continue
		}
		// Keep the buffer for the next batch (growing it row by row was a
		// tenth of the consumer's CPU), not the rows' strings.
		c.pending -= len(p.rows)
		clear(p.rows)
		p.rows = p.rows[:0]
		p.stored, p.hasStored = p.end, true
		p.hasEnd = false
		if p.newest.After(c.storedAt) {
			c.storedAt = p.newest
		}
	}
	if c.afterInsert != nil {
		c.afterInsert()
	}

	// A commit is quick and worth finishing even when Run is stopping.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.InsertTimeout)
	defer ccancel()
	if err := c.commit(cctx, nil); err != nil {
		// Not fatal: the ledger holds the batch, so a restart resumes past
		// it anyway; the next flush or the revocation commits again.
		c.m.retries.WithLabelValues(stageCommit).Inc()
		c.log.Warn("commit offsets", "error", err)
	}
	return "", nil
}
