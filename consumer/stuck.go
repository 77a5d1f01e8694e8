package consumer

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
)

// ReasonInsertTimeout is a record of a batch that timed out StuckAttempts
// times in a row at the smallest batch size while other batches committed:
// a partition whose rows ClickHouse will not take in InsertTimeout, which
// would otherwise hold the partition for ever, every owner in turn.
const ReasonInsertTimeout = "insert_timeout"

// isolate narrows the partitions of the next batch while some are suspect
// (their rows were in a batch that timed out at the smallest size): every
// other batch is the least struck suspect alone, so that its timeout names
// its partition, and the batches between are the other partitions, so that
// they go on. It reports whether it held rows back. Callers hold mu.
func (c *Consumer) isolate(batch []*partition) ([]*partition, bool) {
	var suspects, others []*partition
	othersRows := 0
	for _, p := range batch {
		if p.suspect && len(p.rows) > 0 {
			suspects = append(suspects, p)
			continue
		}
		others = append(others, p)
		othersRows += len(p.rows)
	}
	if len(suspects) == 0 {
		return batch, false
	}
	c.suspectTurn = !c.suspectTurn
	if c.suspectTurn || othersRows == 0 {
		// The innocent (no strike yet) are cleared first.
		p := slices.MinFunc(suspects, func(a, b *partition) int {
			if a.strikes != b.strikes {
				return a.strikes - b.strikes
			}
			return int(a.id - b.id)
		})
		return []*partition{p}, len(batch) > 1
	}
	return others, true
}

// timedOut judges a batch of the partitions batch, rows rows in all, that
// timed out. It makes their partitions suspect (see isolate), whatever the
// batch's size, so that each is tried alone at the smallest size next; at
// that size (atFloor) a batch of one partition's rows strikes it. After
// StuckAttempts strikes in a row, if a batch committed since the partition
// became suspect (so ClickHouse takes other rows in time and the fault is
// the partition's), the rows of the batch go to the dead-letter topic and
// the partition goes on after them; it stays suspect, and each of its next
// batches that times out goes there at once, until one of them commits.
// With no such batch a slow server and a stuck partition look alike, and
// the batch is retried. Callers hold mu, after restore.
func (c *Consumer) timedOut(batch []*partition, rows int, atFloor bool) {
	var withRows []*partition
	for _, p := range batch {
		if len(p.rows) > 0 {
			withRows = append(withRows, p)
		}
	}
	for _, p := range withRows {
		if !p.suspect {
			p.suspect, p.since = true, c.commits
		}
	}
	if !atFloor || len(withRows) != 1 {
		return
	}
	p := withRows[0]
	if p.strikes++; p.strikes < c.cfg.StuckAttempts || c.commits == p.since {
		return
	}
	n := min(rows, len(p.rows))
	first, last := p.rows[0].offset, p.rows[n-1].offset
	err := fmt.Errorf("insert of %d rows timed out %d times in a row at the smallest batch (insert timeout %v), while other batches were stored",
		n, p.strikes, c.cfg.InsertTimeout)
	for _, r := range p.rows[:n] {
		dl := c.timeoutLetter(r, err)
		p.dead = append(p.dead, dl)
		p.deadBytes += dl.size()
	}
	// The rows stay counted in pending, as dead letters now.
	k := copy(p.rows, p.rows[n:])
	clear(p.rows[k:])
	p.rows = p.rows[:k]
	// Proven stuck: its next batch that times out follows at once, until
	// one of its batches commits (cleared).
	p.strikes = c.cfg.StuckAttempts - 1
	c.m.batchesDeadLettered.Inc()
	c.log.Error("a partition's batch keeps outliving the insert timeout while others are stored; its records go to the dead-letter topic",
		"partition", p.id, "first_offset", first, "last_offset", last, "records", n,
		"attempts", c.cfg.StuckAttempts, "insert_timeout", c.cfg.InsertTimeout, "error", err)
}

// timeoutLetter is r's dead letter for ReasonInsertTimeout. The value is the
// event as the consumer decoded it (its time as corrected, if it was off),
// encoded again with its schema header, so that the dead letter can be
// produced to the topic again as it is. It is stamped with the consumer's
// time; the event carries its own.
func (c *Consumer) timeoutLetter(r row, err error) deadLetter {
	value, eerr := event.Encode(r.d)
	if eerr != nil {
		// A decoded event encodes again; say so if not, rather than drop it.
		value = nil
		err = fmt.Errorf("%w (and encoding it again failed: %w)", err, eerr)
	}
	msg := err.Error()
	return deadLetter{reason: ReasonInsertTimeout, rec: &kgo.Record{
		Topic:     c.cfg.DeadLetterTopic,
		Value:     value,
		Timestamp: c.now(),
		Headers: []kgo.RecordHeader{
			{Key: event.Header, Value: event.HeaderValue()},
			{Key: HeaderReason, Value: []byte(ReasonInsertTimeout)},
			{Key: HeaderError, Value: []byte(msg)},
			{Key: HeaderSourceTopic, Value: []byte(r.topic)},
			{Key: HeaderSourcePartition, Value: []byte(strconv.Itoa(int(r.partition)))},
			{Key: HeaderSourceOffset, Value: []byte(strconv.FormatInt(r.offset, 10))},
		},
	}}
}

// cleared forgets the strikes of the partitions of a committed batch that
// had rows in it, and counts the batch as evidence for timedOut. Callers
// hold mu.
func (c *Consumer) cleared(batch []*partition, rows int) {
	if rows == 0 {
		return
	}
	c.commits++
	for _, p := range batch {
		if len(p.rows) > 0 {
			p.strikes, p.suspect = 0, false
		}
	}
}
