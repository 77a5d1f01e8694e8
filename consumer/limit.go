package consumer

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// minBatchLimit is the fewest rows an insert timeout shrinks a batch to (or
// BatchSize, if smaller): below it a batch costs more in statements than
// its rows, and a server that cannot write a hundred rows in InsertTimeout
// is down, not slow.
const minBatchLimit = 100

// floor is the smallest batch: minBatchLimit, or BatchSize if smaller.
func (c *Consumer) floor() int { return min(minBatchLimit, c.cfg.BatchSize) }

// growAfter is how many batches in a row that fill the shrunk limit must
// succeed before it doubles again: soon enough to regain the throughput
// once the server is back, not so soon that a still slow server times out
// every other batch.
const growAfter = 4

// held is what cut set aside of one partition's rows: they stay buffered
// for the next batch.
type held struct {
	p    *partition
	keep int             // rows in the batch
	all  int             // rows buffered
	end  kgo.EpochOffset // the partition's end past the set-aside rows
}

// cut trims batch, rows rows in all, to limit rows: whole partitions
// while they fit, then the oldest rows of the one that does not; the others
// wait. A trimmed partition's end is moved to just after its last row in
// the batch, so the ledger, the commit and the next batch's first offset
// all agree on where the batch stops. It returns the batch, its rows and
// what was set aside, which restore or keepRest must then be given.
// Callers hold mu.
func cut(batch []*partition, rows, limit int) ([]*partition, int, []held) {
	if rows <= limit {
		return batch, rows, nil
	}
	var (
		kept  []*partition
		holds []held
	)
	room := limit
	rows = 0
	for _, p := range batch {
		n := len(p.rows)
		switch {
		case n <= room:
			// Whole, a partition with no rows left (its dead letters
			// produced) included: it costs nothing.
			kept = append(kept, p)
		case room > 0:
			holds = append(holds, held{p: p, keep: room, all: n, end: p.end})
			p.rows = p.rows[:room]
			// The epoch of the buffer's last record: the log at that epoch
			// holds this earlier offset too.
			p.end = kgo.EpochOffset{Epoch: p.end.Epoch, Offset: p.rows[room-1].offset + 1}
			kept = append(kept, p)
			n = room
		default:
			continue // not in this batch at all
		}
		room -= n
		rows += n
	}
	return kept, rows, holds
}

// restore gives the set-aside rows back to their partitions after a failed
// attempt: the next attempt cuts again, at the limit of then.
func restore(holds []held) {
	for _, h := range holds {
		h.p.rows = h.p.rows[:h.all]
		h.p.end = h.end
	}
}

// keepRest leaves each trimmed partition holding only its set-aside rows
// once the batch committed, the next batch starting after the last stored
// one. Callers hold mu.
func (c *Consumer) keepRest(holds []held) {
	for _, h := range holds {
		p := h.p
		all := p.rows[:h.all]
		n := copy(all, all[h.keep:])
		clear(all[n:]) // the stored rows' strings
		p.rows = all[:n]
		c.pending -= h.keep
		p.stored, p.hasStored = p.end, true
		p.first = p.end.Offset
		p.end = h.end
	}
}

// shrink halves the batch limit after a batch of rows rows timed out, down
// to the floor. Callers hold mu.
func (c *Consumer) shrink(rows int) {
	next := max(c.floor(), min(rows, c.limit)/2)
	c.fits = 0
	if next >= c.limit {
		return
	}
	c.log.Warn("insert timed out; smaller batches until inserts fit the insert timeout",
		"rows", rows, "batch_limit", next, "insert_timeout", c.cfg.InsertTimeout)
	c.limit = next
	c.m.batchesShrunk.Inc()
	c.m.batchLimit.Set(float64(next))
}

// fitted counts a committed batch of rows rows toward growing the limit
// back. Callers hold mu.
func (c *Consumer) fitted(rows int) {
	if c.limit >= c.cfg.BatchSize || rows < c.limit {
		return // a batch under the limit says nothing about a bigger one
	}
	if c.fits++; c.fits < growAfter {
		return
	}
	c.fits = 0
	c.limit = min(c.cfg.BatchSize, 2*c.limit)
	c.m.batchLimit.Set(float64(c.limit))
	c.log.Info("inserts fit again; bigger batches", "batch_limit", c.limit)
}

// trimmed reports whether cut set rows of p aside.
func trimmed(holds []held, p *partition) bool {
	for _, h := range holds {
		if h.p == p {
			return true
		}
	}
	return false
}
