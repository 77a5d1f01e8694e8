package consumer

import (
	"bytes"
	"context"
	"errors"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
)

// Dead-letter reasons: the dead_letter_reason header and the dead_letters
// counter's reason label.
const (
	ReasonUnknownVersion = "unknown_version"
	ReasonMalformed      = "malformed"
	// ReasonExpired is an event older than the retention when it arrives
	// (a producer's clock, a consumer days behind): retention would
	// delete it from the raw table or the rollups at once, or one sooner
	// than the other, so it is stored in none and passed on instead.
	ReasonExpired = "expired"
)

// Dead-letter record headers. The record's key, value and timestamp are the
// original's (but for an expired event's timestamp, see
// HeaderOriginalTimestamp).
const (
	HeaderReason          = "dead_letter_reason"
	HeaderError           = "dead_letter_error"
	HeaderSourceTopic     = "source_topic"
	HeaderSourcePartition = "source_partition"
	HeaderSourceOffset    = "source_offset"
	// HeaderOriginalSize is set, to the original value's length, when the
	// dead letter's value was truncated to DeadLetterMaxBytes.
	HeaderOriginalSize = "dead_letter_original_size"
	// HeaderHeadersDropped is set, to how many were left out, when the
	// original's headers did not fit in DeadLetterMaxBytes: the first that
	// fit are kept, in order.
	HeaderHeadersDropped = "dead_letter_headers_dropped"
	// HeaderOriginalTimestamp is set, to the original's timestamp in Unix
	// milliseconds, on an expired event's dead letter, which is stamped
	// with the consumer's time instead.
	HeaderOriginalTimestamp = "dead_letter_original_timestamp"
)

// deadLetter is a record bound for the dead-letter topic.
type deadLetter struct {
	rec    *kgo.Record
	reason string
}

func (c *Consumer) deadLetter(r *kgo.Record, err error) deadLetter {
	reason := ReasonMalformed
	switch {
	case errors.Is(err, event.ErrUnknownVersion):
		reason = ReasonUnknownVersion
	case errors.Is(err, errExpired):
		reason = ReasonExpired
	}
	// The headers point at the original, which stays in the topic until
	// retention; the value is cut so that a record too big to pass on is
	// still passed on (a dead letter that cannot be produced blocks its
	// partition).
	// Copies, cut to size: a slice of the fetched record would keep its
	// whole fetch buffer alive while the dead letter waits.
	value, key := r.Value, r.Key
	headers, kept := boundHeaders(r.Headers, c.cfg.DeadLetterMaxBytes)
	if kept < len(r.Headers) {
		headers = append(headers, kgo.RecordHeader{Key: HeaderHeadersDropped, Value: []byte(strconv.Itoa(len(r.Headers) - kept))})
	}
	if limit := c.cfg.DeadLetterMaxBytes; len(value) > limit || len(key) > limit {
		headers = append(headers, kgo.RecordHeader{Key: HeaderOriginalSize, Value: []byte(strconv.Itoa(len(value)))})
		value = value[:min(len(value), limit)]
		key = key[:min(len(key), limit)]
	}
	value, key = bytes.Clone(value), bytes.Clone(key)
	ts := r.Timestamp
	if reason == ReasonExpired {
		// Kafka's retention goes by record time too: at the original's, the
		// dead letter of an old event would be deleted as soon as its
		// segment rolled, unread.
		headers = append(headers, kgo.RecordHeader{Key: HeaderOriginalTimestamp, Value: []byte(strconv.FormatInt(r.Timestamp.UnixMilli(), 10))})
		ts = c.now()
	}
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	return deadLetter{reason: reason, rec: &kgo.Record{
		Topic:     c.cfg.DeadLetterTopic,
		Key:       key,
		Value:     value,
		Timestamp: ts,
		Headers: append(headers,
			kgo.RecordHeader{Key: HeaderReason, Value: []byte(reason)},
			kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)},
			kgo.RecordHeader{Key: HeaderSourceTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: HeaderSourcePartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: HeaderSourceOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		),
	}}
}

// headerFraming is what a record header costs beyond its key and value
// (their lengths, as varints), so that many empty headers are bounded too.
const headerFraming = 8

// boundHeaders returns a copy of the first of hs whose keys, values and
// framing fit in limit bytes, and how many that is: a record can carry most
// of its size in headers, and a dead letter as big as its original may not
// fit the dead-letter topic.
func boundHeaders(hs []kgo.RecordHeader, limit int) ([]kgo.RecordHeader, int) {
	var kept []kgo.RecordHeader
	size := 0
	for _, h := range hs {
		if size += len(h.Key) + len(h.Value) + headerFraming; size > limit {
			break
		}
		kept = append(kept, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return kept, len(kept)
}

// size is roughly what d holds in memory and on the wire.
func (d deadLetter) size() int {
	n := len(d.rec.Key) + len(d.rec.Value)
	for _, h := range d.rec.Headers {
		n += len(h.Key) + len(h.Value) + headerFraming
	}
	return n
}

// produceDeadLetters sends each partition's dead letters. A partition whose
// dead letters fail is blocked (fetches paused, rows kept) and tried again
// after a backoff; the others go on. Callers hold mu.
func (c *Consumer) produceDeadLetters(ctx context.Context) {
	for _, p := range c.parts {
		if len(p.dead) == 0 || p.blocked && c.now().Before(p.retryAt) {
			continue
		}
		recs := make([]*kgo.Record, len(p.dead))
		for i, d := range p.dead {
			// A fresh record each attempt: franz-go keeps the context of
			// the first in Record.Context, canceled once that attempt
			// returned, and would fail every retry with it, leaving the
			// partition blocked after the topic came back.
			r := d.rec
			recs[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp, Headers: r.Headers}
		}
		if err := c.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			c.m.deadLetterFailures.Inc()
			c.m.retries.WithLabelValues(stageDeadLetter).Inc()
			p.retryAt = c.now().Add(backoff(c.cfg.RetryMin, c.cfg.RetryMax, p.failures))
			p.failures++
			if !p.blocked {
				p.blocked = true
				c.m.blockedPartitions.Inc()
				c.cl.PauseFetchPartitions(map[string][]int32{c.cfg.Topic: {p.id}})
			}
			c.log.Error("dead-letter topic refuses this partition's poison records; partition blocked, others go on",
				"partition", p.id, "records", len(recs), "attempt", p.failures, "error", err)
			continue
		}
		for _, d := range p.dead {
			c.m.deadLetters.WithLabelValues(d.reason).Inc()
		}
		c.pending -= len(p.dead)
		p.dead, p.deadBytes = nil, 0
		p.failures = 0
		if p.blocked {
			p.blocked = false
			c.m.blockedPartitions.Dec()
			c.cl.ResumeFetchPartitions(map[string][]int32{c.cfg.Topic: {p.id}})
			c.log.Info("dead letters produced; partition unblocked", "partition", p.id)
		}
	}
}

// deadLetterRetryDue reports a blocked partition due for another try.
func (c *Consumer) deadLetterRetryDue() bool {
	for _, p := range c.parts {
		if p.blocked && !c.now().Before(p.retryAt) {
			return true
		}
	}
	return false
}
