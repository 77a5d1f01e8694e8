// Package consumer moves decision events from Kafka into ClickHouse without
// losing or double-counting any, in the raw table or any rollup: a group
// consumer decodes records into batches, writes each batch (raw rows and
// rollups, tagged with the batch id) between an intent and a commit row of
// an offset ledger, aborts and deletes any batch that did not commit, and
// commits Kafka offsets after. On assignment a partition is claimed with a
// fence and resumes after the ledger's committed tail. See schema.md,
// "Exactly once". Records that do not decode go to a dead-letter topic; one
// that cannot be produced there blocks only its own partition.
//
// The schema (migrations/*.sql, see schema.md) is applied by Migrate.
package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/edgelimit/edgelimit/gateway/event"
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

// Consumer moves decision events from Kafka to ClickHouse.
type Consumer struct {
	cfg Config
	ch  driver.Conn
	log *slog.Logger
	m   *metrics
	now func() time.Time

	cl *kgo.Client // set by Run, which then closes clReady
	// clReady is closed once cl is set: the group's callbacks can run
	// before kgo.NewClient returns.
	clReady chan struct{}
	// stage is this consumer's staging table (see flushOnce), named after
	// its group member (stageName) once it has staged a batch; empty
	// before.
	stage string
	// stored holds the ids of the events stored most recently (see
	// dedupeWindow).
	stored *idWindow
	// maxParts is the server's limit of partitions per INSERT, once read
	// (see stageSlices).
	maxParts int
	// topicID is the topic's Kafka UUID, hex, as of the last assignment.
	topicID string

	// mu serializes flushes with the group's callbacks: a revocation waits
	// for an insert in flight, commits what was stored, and forgets the
	// partition's unstored rows, which its next owner reads again.
	mu    sync.Mutex
	parts map[int32]*partition // assigned partitions
	// pending counts rows and dead letters buffered in parts.
	pending int
	// firstAt is when the oldest buffered record was polled.
	firstAt time.Time
	// deadBudget is how many bytes of dead letters, in partitions that are
	// not blocked, start a flush at once: BatchSize counts records, and
	// poison records can be as big as Kafka lets them.
	deadBudget int
	// batch is the id of the batch being written; failed, when set, says an
	// attempt of it may have written something, so it is aborted before
	// the next attempt, which takes a new id.
	batch  uint64
	failed bool
	// limit is the most rows a batch inserts: BatchSize, halved after each
	// insert timeout down to a floor, doubled again after growAfter full
	// batches in a row fit (fits counts them; see shrink). more says the
	// last batch committed left rows buffered past the limit.
	limit, fits int
	more        bool
	// commits counts the batches with rows this consumer committed, and
	// suspectTurn says the last batch was a suspect partition's alone (see
	// isolate and timedOut).
	commits     uint64
	suspectTurn bool
	// lone is the suspect partition whose batch, alone, timed out last
	// (nil: the last batch did not); see starved.
	lone *partition
	// storedAt is the newest Kafka timestamp of a record stored, for the
	// time-based lag; startedAt stands in before the first.
	storedAt, startedAt time.Time

	// beforeInsert and afterInsert, if set, run before a batch's rows are
	// written and after they are stored but before the offsets are
	// committed (tests use them to inject faults and crashes).
	beforeInsert func()
	afterInsert  func()
}

// partition is one assigned partition's buffered work.
type partition struct {
	id   int32
	next int64 // offsets below next were already taken; repeats are skipped
	// seedFrom is where the fetch starts after an assignment: the records
	// from there to next were stored already, by this consumer or another,
	// and are read again only for their ids (dedupeWindow), so that a
	// repeat just after a restart or a rebalance is still dropped. It
	// costs the partition's share of the window, read from Kafka once per
	// assignment; ClickHouse has no index to read the ids back by offset.
	seedFrom int64
	// expect says next is an offset that must come next: the partition's
	// stored progress, or a record read. A record past it means Kafka no
	// longer held the ones between when they were fetched (retention, an
	// unclean leader election): counted as lost.
	expect bool
	rows   []row
	dead   []deadLetter
	// deadBytes is the size of dead's records.
	deadBytes int
	// first is the offset of the first record buffered since the last
	// flush (valid while hasEnd).
	first int64
	// end is the offset after the last record buffered; stored is the
	// offset after the last record written to ClickHouse or the dead-letter
	// topic and not yet committed.
	end, stored       kgo.EpochOffset
	hasEnd, hasStored bool
	// newest is the newest Kafka timestamp buffered since the last flush.
	newest time.Time
	// fence is this owner's claim on the partition (decisions_claims).
	fence uint32
	// blocked is set while the partition's dead letters cannot be produced:
	// its fetches are paused and its rows wait, and no other partition does.
	// The next try is at retryAt, after failures tries.
	blocked  bool
	retryAt  time.Time
	failures int
	// suspect is set once the partition's rows were in a batch that timed
	// out at the smallest batch size, until a batch of them commits; its
	// batches are then written alone (isolate). strikes counts those alone
	// that timed out in a row; since is how many batches this consumer had
	// committed when it became suspect (timedOut).
	suspect bool
	strikes int
	since   uint64
}

// deadLetter is a record bound for the dead-letter topic.
type deadLetter struct {
	rec    *kgo.Record
	reason string
}

// New returns a Consumer that writes to ch. Its metrics are registered on
// reg (nil: not registered); log receives its JSON logs (nil: discarded).
// Nothing connects until Run.
func New(cfg Config, ch driver.Conn, reg prometheus.Registerer, log *slog.Logger) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ch == nil {
		return nil, errors.New("consumer: nil ClickHouse connection")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m.batchLimit.Set(float64(cfg.BatchSize))
	return &Consumer{
		cfg:        cfg,
		limit:      cfg.BatchSize,
		ch:         ch,
		log:        log,
		m:          m,
		now:        time.Now,
		parts:      map[int32]*partition{},
		clReady:    make(chan struct{}),
		batch:      newBatchID(),
		deadBudget: 16 << 20,
		stored:     newIDWindow(dedupeWindow),
	}, nil
}

// Run consumes until ctx ends, then inserts and commits what it holds
// (within ShutdownTimeout), leaves the group and returns. ClickHouse or Kafka
// failures are retried with backoff, never returned; Run returns an error
// if it cannot start, or ErrSchemaNewer (at start or before any batch) once
// a newer consumer has migrated the schema: it then writes nothing more and
// leaves the group. Call Run once.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.checkSchema(ctx); errors.Is(err, ErrSchemaNewer) {
		return err
	} else if err != nil {
		// ClickHouse may still be coming up: every batch checks again.
		c.log.Warn("schema version not checked at start", "error", err)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ClientID(c.cfg.ClientID),
		kgo.WithLogger(kgoLogger{c.log}),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topic),
		// Offsets are committed by hand, only after ClickHouse accepted the
		// rows (and the dead-letter topic the poison records).
		kgo.DisableAutoCommit(),
		// A group with no commits starts from the oldest event Kafka still
		// holds: usage accounting wants all of them, not only new ones.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Resume each assigned partition after the highest offset ClickHouse
		// already holds, which can be ahead of the committed offset after a
		// crash between insert and commit.
		kgo.AdjustFetchOffsetsFn(c.resumeOffsets),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	}
	c.startedAt = c.now()
	cl, err := kgo.NewClient(append(opts, c.cfg.Opts...)...)
	if err != nil {
		return fmt.Errorf("new kafka client: %w", err)
	}
	c.cl = cl
	close(c.clReady)

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.measureLag(bg, kadm.NewClient(cl)) })
	if r := c.cfg.Retention; r.RawDays > 0 || r.RollupDays > 0 {
		wg.Go(func() { c.dropExpired(bg) })
	}

	fatal := c.poll(ctx)

	// Shutdown, in order: store what is buffered, leave the group (the
	// revocation commits what was stored), stop the helpers.
	if fatal == nil {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ShutdownTimeout)
		if err := c.flush(fctx); err != nil {
			c.log.Warn("shutdown flush incomplete; the group's next owner reads the rest again", "error", err)
		}
		cancel()
	} else {
		c.log.Error("stopping: a newer consumer migrated the schema; nothing more is written", "error", fatal)
	}
	cl.Close()
	stopBG()
	wg.Wait()
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.InsertTimeout)
	defer dcancel()
	if c.stage != "" {
		if err := c.ch.Exec(dctx, c.stageSQL(qDropStage)); err != nil {
			c.log.Warn("drop staging table", "table", c.stage, "error", err)
		}
	}
	return fatal
}

// checkSchema checks the schema version where the migrations are recorded:
// the connection's database, or on a cluster every shard's.
func (c *Consumer) checkSchema(ctx context.Context) error {
	if len(c.cfg.Shards) == 0 {
		return checkSchema(ctx, c.ch)
	}
	for _, sh := range c.cfg.Shards {
		if err := checkSchema(ctx, sh); err != nil {
			return err
		}
	}
	return nil
}

// poll fetches, buffers and flushes until ctx ends, or until a flush finds
// the schema newer than this consumer (ErrSchemaNewer, returned).
func (c *Consumer) poll(ctx context.Context) error {
	starved := false
	for ctx.Err() == nil {
		c.mu.Lock()
		room := c.cfg.BatchSize - c.flushable()
		more := starved && c.flushable() < 2*c.cfg.BatchSize
		if more {
			// The suspect's rows fill the buffer: wait for a small batch
			// more, once a try, for the other partitions' rows (a poll
			// past its deadline would return none). Bounded: a suspect
			// that keeps receiving and is never judged (no other
			// partition stores a batch) grows the buffer to twice the
			// batch size at most.
			room = max(room, c.floor())
		}
		if c.flushableDeadBytes() >= c.deadBudget {
			room = 0 // flush first
		}
		deadline := c.now().Add(c.cfg.BatchWait)
		if c.flushable() > 0 && !more {
			deadline = c.firstAt.Add(c.cfg.BatchWait)
		}
		c.mu.Unlock()

		if room > 0 {
			pctx, cancel := context.WithDeadline(ctx, deadline)
			fetches := c.cl.PollRecords(pctx, room)
			cancel()
			if fetches.IsClientClosed() {
				return nil
			}
			fetches.EachError(func(topic string, p int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					c.log.Warn("fetch failed", "topic", topic, "partition", p, "error", err)
				}
			})
			c.buffer(fetches)
		}
		if ctx.Err() != nil {
			return nil // Run's final flush, with its own deadline, stores the rest
		}

		c.mu.Lock()
		n := c.flushable()
		full := n >= c.cfg.BatchSize || c.flushableDeadBytes() >= c.deadBudget
		due := n > 0 && !c.now().Before(c.firstAt.Add(c.cfg.BatchWait)) || c.deadLetterRetryDue()
		c.mu.Unlock()
		starved = false
		if full || due {
			if err := c.flush(ctx); errors.Is(err, ErrSchemaNewer) {
				return err
			} else if errors.Is(err, errStarved) {
				starved = true
			} else if err != nil && ctx.Err() == nil {
				c.log.Error("flush", "error", err)
			}
		}
	}
	return nil
}

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

// fillStage sends the batch's rows into the staging table. Nothing outside
// the staging table changes, so a failure here needs no abort.
func (c *Consumer) fillStage(ctx context.Context, batch []*partition, rows int) error {
	if err := c.ch.Exec(ctx, c.stageSQL(qCreateStage)); err != nil {
		return fmt.Errorf("create staging table: %w", err)
	}
	if err := c.ch.Exec(ctx, c.stageSQL(qTruncateStage)); err != nil {
		return fmt.Errorf("truncate staging table: %w", err)
	}
	b, err := c.ch.PrepareBatch(ctx, qInsertRows(c.stage))
	if err != nil {
		return fmt.Errorf("prepare staging insert: %w", err)
	}
	defer b.Abort()
	parts := make([][]row, len(batch))
	for i, p := range batch {
		parts[i] = p.rows
	}
	if err := appendBatch(b, parts, rows, c.batch); err != nil {
		return fmt.Errorf("stage %d rows: %w", rows, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("stage %d rows: %w", rows, err)
	}
	return nil
}

// insertFromStage writes the raw rows and each rollup from the staging
// table. Each statement has a query id of the batch, so an abort can end it.
// A batch whose rows fall in more day partitions than one INSERT may write
// is written in slices of whole days: current ClickHouse refuses such an
// INSERT whole, again at every retry, a poison batch that would stop the
// pipeline. Every statement of every slice is tagged with the batch and
// sits between its intent and commit like the rest, so the batch still
// counts once: a failure anywhere aborts (deletes) all of it.
func (c *Consumer) insertFromStage(ctx context.Context) error {
	srcs, err := c.stageSlices(ctx)
	if err != nil {
		return err
	}
	for i, q := range append([]string{qInsertRaw}, qRollups...) {
		for j, src := range srcs {
			qctx := clickhouse.Context(ctx, clickhouse.WithQueryID(fmt.Sprintf("%s%d-%d", batchQueryPrefix(c.batch), i, j)),
				// Into a Distributed table, return only once every shard
				// holds its rows: the commit row must not run ahead of them.
				// No effect on other tables.
				clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
			if err := c.ch.Exec(qctx, strings.ReplaceAll(q, "{stage}", src), c.batch); err != nil {
				return fmt.Errorf("insert into %s: %w", batchTables[i], err)
			}
		}
	}
	return nil
}

// defaultMaxPartitions is ClickHouse's default max_partitions_per_insert_block,
// assumed where the server has no such setting (18.16, which has no limit
// either, so slicing there is merely harmless).
const defaultMaxPartitions = 100

// stageSlices returns what the batch's statements read: the staging table
// when its rows fall in few enough day partitions for one INSERT, else
// subqueries of it of at most that many consecutive days each. Every table
// a batch writes is partitioned by the day of its time (the rollups by the
// day of its minute, the same day).
func (c *Consumer) stageSlices(ctx context.Context) ([]string, error) {
	if c.maxParts == 0 {
		limit, err := maxPartitions(ctx, c.ch)
		if err != nil {
			return nil, err
		}
		c.maxParts = limit
	}
	days, err := readDays(ctx, c.ch, c.stageSQL(qStageDays))
	if err != nil {
		return nil, err
	}
	return daySlices(c.stage, "", days, c.maxParts), nil
}

// readDays runs query, which answers days as yyyymmdd in order.
func readDays(ctx context.Context, conn driver.Conn, query string, args ...any) ([]uint32, error) {
	var days []uint32
	err := eachRow(ctx, conn, "read the batch's days", query, args, func(rows driver.Rows) error {
		var d uint32
		err := rows.Scan(&d)
		days = append(days, d)
		return err
	})
	return days, err
}

// daySlices returns table itself when days (in order) are at most limit,
// else subqueries of its rows (where is a condition of digits and column
// names, or "") of at most limit consecutive days each.
func daySlices(table, where string, days []uint32, limit int) []string {
	if len(days) <= limit {
		if where == "" {
			return []string{table}
		}
		return []string{"(SELECT * FROM " + table + " WHERE " + where + ")"}
	}
	var srcs []string
	for len(days) > 0 {
		n := min(limit, len(days))
		srcs = append(srcs, daySlice(table, where, days[0], days[n-1]))
		days = days[n:]
	}
	return srcs
}

// stageSlice is the rows of stage from day lo to hi (yyyymmdd), as the
// source of a batch's statements.
func stageSlice(stage string, lo, hi uint32) string { return daySlice(stage, "", lo, hi) }

// daySlice is the rows of table (where where holds, if not "") from day lo
// to hi. Only digits, column names and the table's name (a staging table's
// is made of digits) are joined into the SQL.
func daySlice(table, where string, lo, hi uint32) string {
	if where != "" {
		where += " AND "
	}
	return fmt.Sprintf("(SELECT * FROM %s WHERE %stoYYYYMMDD(time) BETWEEN %d AND %d)", table, where, lo, hi)
}

// maxPartitions reads conn's max_partitions_per_insert_block (math.MaxInt
// for none; defaultMaxPartitions where the server has no such setting).
func maxPartitions(ctx context.Context, conn driver.Conn) (int, error) {
	limit := defaultMaxPartitions
	err := eachRow(ctx, conn, "read max_partitions_per_insert_block", qMaxPartitions, nil, func(rows driver.Rows) error {
		var v string
		if err := rows.Scan(&v); err != nil {
			return err
		}
		n, err := strconv.ParseUint(v, 10, 63)
		switch {
		case err != nil:
			return fmt.Errorf("max_partitions_per_insert_block %q: %w", v, err)
		case n == 0 || n > math.MaxInt32:
			limit = math.MaxInt
		default:
			limit = int(n)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return limit, nil
}

func (c *Consumer) stageSQL(q string) string {
	return strings.ReplaceAll(q, "{stage}", c.stage)
}

// commit commits the stored offsets of the given partitions (nil: all).
// Callers hold mu.
func (c *Consumer) commit(ctx context.Context, only []int32) error {
	offsets := map[int32]kgo.EpochOffset{}
	for id, p := range c.parts {
		if p.hasStored && (only == nil || contains(only, id)) {
			offsets[id] = p.stored
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	c.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{c.cfg.Topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				cerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						cerr = fmt.Errorf("partition %d: %w", p.Partition, err)
						return
					}
				}
			}
		})
	if cerr != nil {
		return cerr
	}
	for id, o := range offsets {
		if p := c.parts[id]; p != nil && p.stored == o {
			p.hasStored = false
		}
	}
	return nil
}

func contains(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// revoked runs when partitions move to another consumer (or on leaving the
// group): it waits for an insert in flight, commits what was stored, and
// forgets the rest, which the next owner reads again from ClickHouse's
// highest offset.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	defer cancel()
	ids := revoked[c.cfg.Topic]
	if err := c.commit(ctx, ids); err != nil {
		c.m.retries.WithLabelValues(stageCommit).Inc()
		c.log.Warn("commit on revoke", "error", err)
	}
	c.forget(ids)
}

// lost runs when the group session expired: the partitions may already be
// someone else's, so nothing is committed.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(lost[c.cfg.Topic])
}

func (c *Consumer) forget(ids []int32) {
	for _, id := range ids {
		if p := c.parts[id]; p != nil {
			c.pending -= len(p.rows) + len(p.dead)
			if p.blocked {
				c.m.blockedPartitions.Dec()
				// A pause outlives the assignment; its next owner here
				// must fetch.
				c.cl.ResumeFetchPartitions(map[string][]int32{c.cfg.Topic: {id}})
			}
			delete(c.parts, id)
		}
	}
}

// measureLag sets the lag gauge from the group's committed offsets every
// LagInterval.
func (c *Consumer) measureLag(ctx context.Context, adm *kadm.Client) {
	t := time.NewTicker(c.cfg.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, c.cfg.LagInterval)
		lags, err := adm.Lag(lctx, c.cfg.Group)
		cancel()
		lag, ok := lags[c.cfg.Group]
		if err == nil && !ok {
			err = errors.New("group not described")
		} else if err == nil {
			err = lag.Error()
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Counted, since the gauges now keep their last value: with
			// nothing fetched, committed or inserted while Kafka is out
			// of reach, this is the one failure that shows.
			c.m.retries.WithLabelValues(stageLag).Inc()
			c.log.Warn("measure lag", "group", c.cfg.Group, "error", err)
			continue
		}
		behind := lag.Lag.TotalByTopic()[c.cfg.Topic].Lag
		c.m.lag.Set(float64(behind))
		// Seconds behind: records wait past the high watermark while the
		// newest stored one is this old. Unlike a record count, it means
		// the same at 20 events/s and at 100k.
		secs := 0.0
		if behind > 0 {
			c.mu.Lock()
			since := c.storedAt
			if since.IsZero() {
				since = c.startedAt
			}
			c.mu.Unlock()
			secs = max(0, c.now().Sub(since).Seconds())
		}
		c.m.lagSeconds.Set(secs)
	}
}

// dropExpired applies retention by dropping day partitions, on servers
// without TTL.
func (c *Consumer) dropExpired(ctx context.Context) {
	ttl, err := SupportsTTL(c.ch)
	if err != nil {
		c.log.Warn("retention disabled: cannot read the server version", "error", err)
		return
	}
	if ttl {
		return // Migrate set TTLs
	}
	t := time.NewTicker(c.cfg.RetentionInterval)
	defer t.Stop()
	for {
		dropped, err := DropExpired(ctx, c.ch, c.cfg.Retention, c.now())
		if err != nil && ctx.Err() == nil {
			c.log.Warn("drop expired partitions", "error", err)
		}
		c.m.partitionsDropped.Add(float64(len(dropped)))
		if len(dropped) > 0 {
			c.log.Info("dropped expired partitions", "partitions", dropped)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// kgoLogger sends franz-go's warnings and errors to slog.
type kgoLogger struct{ log *slog.Logger }

func (kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	l.log.Log(context.Background(), lv, "kafka: "+msg, keyvals...)
}
