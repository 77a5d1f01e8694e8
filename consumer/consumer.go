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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
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
