package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
)

// buffer decodes fetched records into their partitions' batches.
func (c *Consumer) buffer(fetches kgo.Fetches) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var d event.Decision
	empty := c.flushable() == 0
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if fp.Topic != c.cfg.Topic {
			return
		}
		p := c.parts[fp.Partition]
		if p == nil {
			return // revoked meanwhile; its next owner reads these again
		}
		for _, r := range fp.Records {
			if r.Offset < p.next {
				// Stored before this partition was assigned here: fetched
				// again only to rebuild the window of stored ids (see
				// seedFrom).
				if decode(&d, r) == nil && !c.stored.has(d.ID) {
					c.stored.add(d.ID)
				}
				continue
			}
			if p.expect && r.Offset > p.next {
				// The producers are idempotent, not transactional, and
				// the topic is not compacted: offsets have no gaps of
				// their own.
				c.m.recordsLost.Add(float64(r.Offset - p.next))
				c.log.Error("records gone from Kafka before they were stored; their decisions are missing",
					"partition", p.id, "first_offset", p.next, "last_offset", r.Offset-1, "records", r.Offset-p.next)
			}
			p.next, p.expect = r.Offset+1, true
			if empty {
				c.firstAt = c.now()
				empty = false
			}
			c.pending++
			if !p.hasEnd {
				p.first = r.Offset
			}
			p.end, p.hasEnd = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}, true
			// Not past the consumer's clock: a producer's clock ahead (Kafka
			// takes an hour ahead by default) would otherwise hold
			// lag_seconds at 0 until the wall clock caught up with it,
			// however long records wait meanwhile.
			ts := r.Timestamp
			if now := c.now(); ts.After(now) {
				ts = now
			}
			if ts.After(p.newest) {
				p.newest = ts
			}
			if err := decode(&d, r); err != nil {
				dl := c.deadLetter(r, err)
				p.dead = append(p.dead, dl)
				p.deadBytes += dl.size()
				continue
			}
			// Kafka's timestamp is the producer's too, and Kafka takes any
			// past one (before 1970 included, or -1 for none): one that
			// cannot be stored leaves the consumer's clock to judge by.
			ref := r.Timestamp
			if !storable(ref) {
				ref = c.now().UTC()
			}
			if skew := d.Time.Sub(ref); !storable(d.Time) || skew > c.cfg.MaxClockSkew || -skew > c.cfg.MaxClockSkew {
				// No usable event time: Kafka's will do. Counted, since a
				// gateway whose clock is this wrong needs looking at.
				d.Time = ref
				c.m.timeClamped.Inc()
			}
			if c.expired(d.Time) {
				dl := c.deadLetter(r, fmt.Errorf("%w: event time %s", errExpired, d.Time.UTC().Format(time.RFC3339)))
				p.dead = append(p.dead, dl)
				p.deadBytes += dl.size()
				continue
			}
			p.rows = append(p.rows, row{d: d, topic: r.Topic, partition: r.Partition, offset: r.Offset})
		}
	})
}

// storable reports whether t fits the decisions table's DateTime (unsigned
// 32-bit Unix seconds); the driver wraps a time outside it around instead
// of refusing it, so 1960 would be stored as 2096.
func storable(t time.Time) bool {
	return t.Unix() >= 0 && t.Unix() < 1<<32
}

// errNoID marks a record that decodes but carries no event id, such as an
// empty value: it is not a decision, and the id is what makes rows unique.
var errNoID = fmt.Errorf("%w: no event id", event.ErrMalformed)

// decode reads r into d: the schema version from its header first, so a
// record of another version is never parsed as this one.
func decode(d *event.Decision, r *kgo.Record) error {
	var version []byte
	for _, h := range r.Headers {
		if h.Key == event.Header {
			version = h.Value
			if version == nil {
				version = []byte{} // present but empty: not "missing"
			}
			break
		}
	}
	if err := event.CheckVersion(version); err != nil {
		return err
	}
	if err := event.DecodeInto(d, r.Value); err != nil {
		return err
	}
	if d.ID == ([16]byte{}) {
		return errNoID
	}
	return nil
}

// errExpired marks an event older than the retention (ReasonExpired).
var errExpired = errors.New("older than the retention")

// expired reports an event time whose day partition retention drops
// already, in the raw table or the rollups, whichever keeps fewer days:
// the day rule of DropExpired, which deletes no later than a TTL does.
func (c *Consumer) expired(t time.Time) bool {
	days := 0
	for _, d := range []int{c.cfg.Retention.RawDays, c.cfg.Retention.RollupDays} {
		if d > 0 && (days == 0 || d < days) {
			days = d
		}
	}
	if days == 0 {
		return false
	}
	u := t.UTC()
	return uint32(u.Year()*10000+int(u.Month())*100+u.Day()) < expiryCutoff(c.now(), days)
}
