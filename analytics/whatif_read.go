package analytics

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// WhatIf replays the stored decisions of q's range through q.Proposal with
// the limiter's own model (limiter.Replay), one key at a time in time
// order, and compares. Memory holds one key's buckets, the report's
// counters and its top lists, never the range: rows stream from
// ClickHouse in key order, in chunks of whole keys that the server sorts
// one at a time (the next one while this one is replayed). The replay ends
// at WhatIfTimeout or when ctx does (a client that went away).
func (r *Reader) WhatIf(ctx context.Context, q WhatIfQuery) (WhatIfReport, error) {
	start := time.Now()
	if q.Top == 0 {
		q.Top = 20
	}
	if err := q.Validate(); err != nil {
		return WhatIfReport{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, WhatIfTimeout)
	defer cancel()
	// The server stops too, not only this side. Blocks of 8192 rows, not
	// 65536: the driver decodes a block whole, and two queries' blocks
	// (this chunk's and the next's) are what the replay's memory is; a
	// quarter of it, for a few more round trips.
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"max_execution_time": int(WhatIfTimeout / time.Second),
		"max_block_size":     8192,
	}))
	warmFrom := q.warmFrom()
	chunks, err := r.whatIfChunks(ctx, q.Range, warmFrom, cmp.Or(q.chunkRows, whatIfChunkRows))
	if err != nil {
		return WhatIfReport{}, err
	}

	run := newReplayRun(q, warmFrom)
	full := make(chan []replayRow, whatIfBatches)
	empty := make(chan []replayRow, whatIfBatches+1)
	for range whatIfBatches + 1 {
		empty <- make([]replayRow, 0, whatIfBatch)
	}
	scanErr := make(chan error, 1)
	go func() {
		defer close(full)
		scanErr <- r.streamChunks(ctx, q.Range, warmFrom, run.names, chunks, full, empty)
	}()
	var runErr error
	for batch := range full {
		if runErr == nil {
			for i := range batch {
				if runErr = run.add(&batch[i]); runErr != nil {
					cancel() // stops the scanner; drain what it sent
					break
				}
			}
		}
		empty <- batch[:0]
	}
	if err := <-scanErr; runErr == nil && err != nil {
		runErr = err
	}
	if runErr != nil {
		return WhatIfReport{}, runErr
	}
	rep := run.report()
	rep.Duration = time.Since(start)
	return rep, nil
}

// whatIfChunkRows is about how many decisions one chunk holds: what
// ClickHouse sorts at once (about 100 MB on the server), twice over while
// the next chunk is sorted. A key with more decisions is a chunk of its own.
const whatIfChunkRows = 1 << 19

// keyRange is a chunk: the keys in [lo, hi).
type keyRange struct{ lo, hi string }

// whatIfChunks cuts rg's keys into ranges of about whatIfChunkRows
// decisions, reading the keys as a stream and keeping only the cuts.
func (r *Reader) whatIfChunks(ctx context.Context, rg Range, warmFrom time.Time, chunkRows int64) ([]keyRange, error) {
	rows, err := r.ch.Query(ctx, qWhatIfChunks, append(rg.args(), clickhouse.Named("warm_from", warmFrom.UTC().Truncate(time.Second)))...)
	if err != nil {
		return nil, fmt.Errorf("query what-if chunks: %w", err)
	}
	defer rows.Close()
	var out []keyRange
	var key, last string
	var n, sum int64
	for rows.Next() {
		if err := rows.Scan(&key, &n); err != nil {
			return nil, fmt.Errorf("scan what-if chunks: %w", err)
		}
		if len(out) == 0 || sum >= chunkRows {
			if len(out) > 0 {
				out[len(out)-1].hi = key
			}
			out = append(out, keyRange{lo: key})
			sum = 0
		}
		sum += n
		last = key
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read what-if chunks: %w", err)
	}
	if len(out) > 0 {
		// The smallest string after the last key: the bound stays a
		// plain comparison the primary key can serve.
		out[len(out)-1].hi = last + "\x00"
	}
	return out, nil
}

// streamChunks queries each chunk's decisions and sends them in batches
// taken from empty to full, until the chunks end or ctx does. The next
// chunk's query is sent while this one is read, so the server sorts it in
// the meantime.
func (r *Reader) streamChunks(ctx context.Context, rg Range, warmFrom time.Time, names queryNames, chunks []keyRange, full chan<- []replayRow, empty <-chan []replayRow) error {
	type opened struct {
		rows driver.Rows
		err  error
	}
	open := func(c keyRange) <-chan opened {
		ch := make(chan opened, 1)
		go func() {
			rows, err := r.ch.Query(ctx, qWhatIf, append(rg.args(), clickhouse.Named("warm_from", warmFrom.UTC().Truncate(time.Second)), clickhouse.Named("lo", c.lo), clickhouse.Named("hi", c.hi),
				clickhouse.Named("plans", names.plans), clickhouse.Named("routes", names.routes), clickhouse.Named("key_names", names.keys))...)
			ch <- opened{rows, err}
		}()
		return ch
	}
	var next <-chan opened
	defer func() {
		// A query sent ahead and not read: wait for it (ctx ends it
		// soon) and close it, so no goroutine or connection outlives us.
		if next != nil {
			if o := <-next; o.err == nil {
				o.rows.Close()
			}
		}
	}()
	if len(chunks) > 0 {
		next = open(chunks[0])
	}
	batch := <-empty
	for i := range chunks {
		o := <-next
		next = nil
		if o.err != nil {
			return fmt.Errorf("query what-if decisions: %w", o.err)
		}
		if i+1 < len(chunks) {
			next = open(chunks[i+1])
		}
		var err error
		if batch, err = scanChunk(ctx, o.rows, batch, full, empty); err != nil {
			return err
		}
	}
	if len(batch) > 0 {
		select {
		case full <- batch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return ctx.Err()
}

// scanChunk reads one chunk's rows into batch, sending each full batch
// and taking the next from empty; it returns the batch being filled.
func scanChunk(ctx context.Context, rows driver.Rows, batch []replayRow, full chan<- []replayRow, empty <-chan []replayRow) ([]replayRow, error) {
	defer rows.Close()
	for rows.Next() {
		batch = batch[:len(batch)+1]
		d := &batch[len(batch)-1]
		if err := rows.Scan(&d.key, &d.kind, &d.plan, &d.route, &d.counted, &d.keyName, &d.rule, &d.atUS, &d.cost, &d.allowed, &d.store, &d.inRange, &d.nat, &d.split, &d.grant, &d.grantLimit); err != nil {
			return batch, fmt.Errorf("scan what-if decisions: %w", err)
		}
		if len(batch) == cap(batch) {
			select {
			case full <- batch:
			case <-ctx.Done():
				return batch, ctx.Err()
			}
			batch = <-empty
		}
	}
	if err := rows.Err(); err != nil {
		return batch, fmt.Errorf("read what-if decisions: %w", err)
	}
	return batch, nil
}
