package consumer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
)

// ErrInvalidConfig wraps every problem Validate reports, named in the
// message: no caller acts on one problem rather than another, an operator
// reads the message.
var ErrInvalidConfig = errors.New("consumer: invalid config")

// Config configures a Consumer. The zero value of each field means its
// default; Brokers is required.
type Config struct {
	// Brokers are Kafka seed brokers, host:port. Required.
	Brokers []string
	// Topic holds the decision events. Default "decisions".
	Topic string
	// Group is the consumer group. Default "edgelimit-consumer".
	Group string
	// DeadLetterTopic receives records that do not decode. Default
	// "decisions-dead-letter".
	DeadLetterTopic string
	// ClientID names this consumer to the brokers. Default
	// "edgelimit-consumer".
	ClientID string
	// BatchSize is the most records in one INSERT. Default 50000: big
	// inserts are what ClickHouse is fast at.
	BatchSize int
	// BatchWait is the longest a record waits for its batch to fill before
	// the batch is inserted anyway. Default 1s.
	BatchWait time.Duration
	// InsertTimeout bounds one INSERT attempt. It must stay under the group's
	// rebalance timeout (60s), because a rebalance waits for an insert in
	// flight. Default 30s.
	InsertTimeout time.Duration
	// RetryMin and RetryMax bound the exponential backoff between attempts
	// while ClickHouse or Kafka fails. Defaults 100ms and 10s.
	RetryMin, RetryMax time.Duration
	// ShutdownTimeout bounds the final insert and commit when Run's context
	// ends. Default 15s.
	ShutdownTimeout time.Duration
	// LagInterval is how often the group's lag is measured. Default 10s.
	LagInterval time.Duration
	// Retention is how long data is kept. On servers without TTL the
	// consumer drops expired day partitions every RetentionInterval (default
	// 1h); with TTL, Migrate sets TTLs instead. Zero keeps data forever. An
	// event already past the shorter of the two when it arrives goes to the
	// dead-letter topic (ReasonExpired), not into any table.
	Retention         Retention
	RetentionInterval time.Duration
	// MaxClockSkew is how far an event's time may be from its Kafka record's
	// timestamp; a time further off is replaced by the record's timestamp
	// (and counted), so one wild clock cannot spread a batch over hundreds
	// of day partitions, which current ClickHouse refuses. Default 24h.
	MaxClockSkew time.Duration
	// StuckAttempts is how many times in a row one partition's batch may
	// time out at the smallest batch size, while other batches are stored,
	// before its records go to the dead-letter topic (ReasonInsertTimeout)
	// and the partition goes on after them. Default 3.
	StuckAttempts int
	// DeadLetterMaxBytes bounds the value, the key and the original headers
	// of a dead letter, each: a longer value or key is truncated, headers
	// past the bound are left out (the added headers point at the
	// original). Default 64 KiB, so a dead letter stays well under Kafka's
	// default 1 MB message limit.
	DeadLetterMaxBytes int
	// Shards, on a cluster, are connections to every shard's local tables
	// (the database the Distributed tables read), for what a Distributed
	// table cannot do: an abort's DELETE and KILL run on each. Empty: the
	// connection's own tables are the only ones.
	Shards []driver.Conn
	// Opts are extra franz-go options applied last: TLS or SASL in cmd,
	// or overrides in tests.
	Opts []kgo.Opt
}

// rebalanceTimeout is franz-go's default, which this package does not change.
const rebalanceTimeout = 60 * time.Second

func (c Config) withDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Topic, "decisions")
	def(&c.Group, "edgelimit-consumer")
	def(&c.DeadLetterTopic, "decisions-dead-letter")
	def(&c.ClientID, "edgelimit-consumer")
	if c.BatchSize == 0 {
		c.BatchSize = 50_000
	}
	defDur(&c.BatchWait, time.Second)
	defDur(&c.InsertTimeout, 30*time.Second)
	defDur(&c.RetryMin, 100*time.Millisecond)
	defDur(&c.RetryMax, 10*time.Second)
	defDur(&c.ShutdownTimeout, 15*time.Second)
	defDur(&c.LagInterval, 10*time.Second)
	defDur(&c.RetentionInterval, time.Hour)
	defDur(&c.MaxClockSkew, 24*time.Hour)
	if c.DeadLetterMaxBytes == 0 {
		c.DeadLetterMaxBytes = 64 << 10
	}
	if c.StuckAttempts == 0 {
		c.StuckAttempts = 3
	}
	return c
}

// Validate reports the first problem with c after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case len(c.Brokers) == 0:
		return fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	case c.DeadLetterTopic == c.Topic:
		return fmt.Errorf("%w: dead-letter topic must differ from the topic: %q", ErrInvalidConfig, c.Topic)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: batch size must be positive: %d", ErrInvalidConfig, c.BatchSize)
	case c.StuckAttempts < 0:
		return fmt.Errorf("%w: stuck attempts must be positive: %d", ErrInvalidConfig, c.StuckAttempts)
	case c.Retention.RawDays < 0 || c.Retention.RollupDays < 0:
		return fmt.Errorf("%w: negative retention: %+v", ErrInvalidConfig, c.Retention)
	case c.RetryMin > c.RetryMax:
		return fmt.Errorf("%w: retry min must not exceed retry max: %v > %v", ErrInvalidConfig, c.RetryMin, c.RetryMax)
	case c.InsertTimeout >= rebalanceTimeout:
		return fmt.Errorf("%w: insert timeout must be shorter than the rebalance timeout: %v", ErrInvalidConfig, c.InsertTimeout)
	}
	for i, b := range c.Brokers {
		// Not repeated in the error: a URL or user:password@host would
		// carry a password into the printed configuration and every log
		// line that names the server, and franz-go reads no credentials
		// from an address.
		if b == "" || strings.ContainsAny(b, "@/?# ") {
			return fmt.Errorf("%w: broker %d of %d is not a host:port (credentials belong in their own settings, never in an address)",
				ErrInvalidConfig, i+1, len(c.Brokers))
		}
	}
	for _, t := range []struct{ what, name string }{{"topic", c.Topic}, {"dead-letter topic", c.DeadLetterTopic}} {
		// Kafka refuses the name on every request: without this the
		// consumer would retry at start forever, or block on its first
		// poison record.
		if err := event.CheckTopic(t.name); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidConfig, t.what, err)
		}
	}
	for _, d := range []time.Duration{c.BatchWait, c.InsertTimeout, c.RetryMin, c.RetryMax,
		c.ShutdownTimeout, c.LagInterval, c.RetentionInterval, c.MaxClockSkew} {
		if d < 0 {
			return fmt.Errorf("%w: negative duration: %v", ErrInvalidConfig, d)
		}
	}
	if c.DeadLetterMaxBytes < 0 {
		// It cuts every dead letter: a negative one would panic on the
		// first poison record, and again after every restart.
		return fmt.Errorf("%w: dead-letter max bytes must be positive: %d", ErrInvalidConfig, c.DeadLetterMaxBytes)
	}
	return nil
}
