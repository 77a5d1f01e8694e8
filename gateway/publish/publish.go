// Package publish sends the gateway's decision events to Kafka without ever
// making a request wait: Publish hands the event to franz-go's TryProduce,
// which fails at once instead of blocking when the bounded buffer is full.
// Every event ends up either published or dropped, and every drop is counted
// by reason, so published + dropped = attempted once the buffer has drained.
package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
)

// Drop reasons, the values of the dropped counter's reason label.
const (
	// ReasonBufferFull: MaxBuffered events were already waiting for Kafka.
	ReasonBufferFull = "buffer_full"
	// ReasonBrokerError: Kafka rejected the event or it timed out
	// (DeliveryTimeout) while buffered.
	ReasonBrokerError = "broker_error"
	// ReasonEncodeError: the event could not be encoded (a field over
	// event.MaxFieldLen, a time out of range).
	ReasonEncodeError = "encode_error"
	// ReasonClosed: the event was still buffered when Close's deadline
	// passed, or it was published after Close.
	ReasonClosed = "closed"
)

var reasons = []string{ReasonBufferFull, ReasonBrokerError, ReasonEncodeError, ReasonClosed}

// The index of each reason in reasons and in Publisher.drops.
const (
	iBufferFull = iota
	iBrokerError
	iEncodeError
	iClosed
)

// ErrInvalidConfig wraps every problem Validate reports, named in the
// message: no caller acts on one problem rather than another, an operator
// reads the message.
var ErrInvalidConfig = errors.New("publish: invalid config")

// schemaHeaders name the schema version of every record (see
// event.Header). One slice is shared by all records: franz-go only reads
// headers, so the request path allocates none.
var schemaHeaders = []kgo.RecordHeader{{Key: event.Header, Value: event.HeaderValue()}}

// logEvery spaces out log lines about drops, which come in floods.
const logEvery = 10 * time.Second

// Config configures a Publisher. The zero value of each field means its
// default; Brokers is required.
type Config struct {
	// Brokers are Kafka seed brokers, host:port. Required.
	Brokers []string
	// Topic receives the events. Default "decisions".
	Topic string
	// ClientID names this producer in broker logs and quotas. Default
	// "edgelimit-gateway".
	ClientID string
	// MaxBuffered is how many events may wait in memory for Kafka before
	// Publish drops new ones (reason buffer_full). It bounds memory when
	// Kafka is slow or down: an event costs roughly 400 bytes buffered.
	// Default 50000 (about 20 MB, seconds of traffic at edge rates).
	MaxBuffered int
	// Linger is how long a partition's batch waits for more events before it
	// is sent. Default 50ms.
	Linger time.Duration
	// Compression is one of lz4, zstd, snappy, gzip, none. Default lz4.
	Compression string
	// DeliveryTimeout drops a buffered event (reason broker_error) if Kafka
	// has not acknowledged it this long after Publish. Zero, the default,
	// keeps it until Kafka returns or Close gives up: the buffer is bounded,
	// and a late event still counts.
	DeliveryTimeout time.Duration
	// GatewayID names the gateway on its accounting records.
	GatewayID string
	// AccountEvery is how often the publisher sends an accounting record
	// (event.ModeAccounting): its running totals of decision events
	// given, published and dropped by reason, so the drops reach the
	// stream and the usage statement sees them. One more is sent as it
	// closes. Default 5s.
	AccountEvery time.Duration
	// Opts are extra franz-go options applied last: the link's logger,
	// metrics, TLS and SASL (internal/boot builds them), or overrides in
	// tests.
	Opts []kgo.Opt
}

// WithDefaults returns c with every zero field at its documented default.
func (c Config) WithDefaults() Config {
	c.Topic = cmp.Or(c.Topic, "decisions")
	c.ClientID = cmp.Or(c.ClientID, "edgelimit-gateway")
	c.MaxBuffered = cmp.Or(c.MaxBuffered, 50_000)
	c.Linger = cmp.Or(c.Linger, 50*time.Millisecond)
	c.Compression = cmp.Or(c.Compression, "lz4")
	c.AccountEvery = cmp.Or(c.AccountEvery, 5*time.Second)
	return c
}

// Validate reports every problem with c after defaults are applied.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, fmt.Errorf("%w: no brokers", ErrInvalidConfig))
	}
	for i, b := range c.Brokers {
		// Not repeated in the error: a URL or user:password@host would
		// carry a password into logs, and franz-go would log it on every
		// failed dial.
		if b == "" || strings.ContainsAny(b, "@/?# ") {
			errs = append(errs, fmt.Errorf("%w: broker %d of %d is not a host:port (credentials belong in kafka.sasl, never in an address)", ErrInvalidConfig, i+1, len(c.Brokers)))
		}
	}
	if err := event.CheckTopic(c.Topic); err != nil {
		// Kafka would refuse every event, each dropped as a broker error.
		errs = append(errs, fmt.Errorf("%w: topic: %w", ErrInvalidConfig, err))
	}
	if c.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("%w: max buffered must be positive: %d", ErrInvalidConfig, c.MaxBuffered))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("%w: negative duration: linger %v", ErrInvalidConfig, c.Linger))
	}
	if c.AccountEvery < 0 {
		errs = append(errs, fmt.Errorf("%w: negative duration: account every %v", ErrInvalidConfig, c.AccountEvery))
	}
	if err := checkGatewayID(c.GatewayID); err != nil {
		errs = append(errs, fmt.Errorf("%w: gateway id: %w", ErrInvalidConfig, err))
	}
	if c.DeliveryTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: negative duration: delivery timeout %v", ErrInvalidConfig, c.DeliveryTimeout))
	}
	if _, err := codec(c.Compression); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkGatewayID refuses an id the accounting record could not carry.
func checkGatewayID(id string) error {
	_, err := event.Encode(event.Decision{GatewayID: id})
	return err
}

func codec(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "none":
		return kgo.NoCompression(), nil
	}
	return kgo.NoCompression(), fmt.Errorf("%w: unknown compression %q", ErrInvalidConfig, name)
}

// Publisher publishes decision events. Its methods are safe for concurrent
// use.
type Publisher struct {
	cl    *kgo.Client
	topic string
	log   *slog.Logger
	now   func() time.Time

	promiseFn func(*kgo.Record, error) // p.promise, bound once
	records   sync.Pool                // *kgo.Record with a Value buffer, reused after their promise

	published prometheus.Counter
	dropped   map[string]prometheus.Counter
	attempted atomic.Int64
	// The accounting record's totals: published, and drops by reason in
	// the order of reasons (the Prometheus counters cannot be read back).
	acked atomic.Int64
	drops [4]atomic.Int64

	gatewayID    string
	runStart     time.Time
	accountEvery time.Duration
	stop         chan struct{} // closed by Close: the accounting loop sends its last record
	stopping     sync.Once
	accounted    chan struct{} // closed by the accounting loop when it has
	pending      atomic.Int64  // events given to franz-go whose promise has not run
	closed       atomic.Bool
	// lostAtClose counts events dropped once Close began: the process is
	// about to exit, so its metrics will not be scraped again, and Close
	// says how many in its log line and error.
	lostAtClose atomic.Int64
	lastLog     atomic.Int64 // unix nanos of the last broker-error log line
}

// New returns a Publisher connected (lazily) to cfg.Brokers, with its
// metrics registered on reg (nil: not registered) and franz-go's warnings
// logged to log (nil: discarded).
func New(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	compression, _ := codec(cfg.Compression)

	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.DefaultProduceTopic(cfg.Topic),
		// Idempotent writes are franz-go's default and we keep them (no
		// DisableIdempotentWrite): retries after a broker hiccup must not
		// duplicate events, or the usage counts would drift upward. They
		// need acks from all in-sync replicas, also the default; stated
		// here so nobody "optimizes" it to leader-only acks.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Bounded buffer: with TryProduce, a full buffer fails the event at
		// once (counted as buffer_full) instead of blocking the request.
		kgo.MaxBufferedRecords(cfg.MaxBuffered),
		// Events are small and repetitive (same gateway, routes, plans):
		// lz4 shrinks batches several-fold for little CPU on the gateway.
		kgo.ProducerBatchCompression(compression, kgo.NoCompression()),
		// Analytics tolerates tens of milliseconds of delay; lingering
		// longer than the 10ms default gives bigger batches, fewer produce
		// requests and better compression at the same event rate.
		kgo.ProducerLinger(cfg.Linger),
		// Records carry no key and we never hash one: the consumer does
		// not need per-key order (ClickHouse aggregates), so a hot key must
		// not make a hot partition. Sticky batches of 64 KiB per partition,
		// switched adaptively away from slow brokers, spread load evenly.
		kgo.RecordPartitioner(kgo.UniformBytesPartitioner(64<<10, true, false, nil)),
	}
	if cfg.DeliveryTimeout > 0 {
		// Only when asked: by default buffered events wait for Kafka.
		opts = append(opts, kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout))
	}
	opts = append(opts, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("new kafka client: %w", err)
	}

	p := &Publisher{
		cl:           cl,
		topic:        cfg.Topic,
		log:          log,
		now:          time.Now,
		gatewayID:    cfg.GatewayID,
		runStart:     time.Now(),
		accountEvery: cfg.AccountEvery,
		stop:         make(chan struct{}),
		accounted:    make(chan struct{}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgelimit_events_published_total",
			Help: "Decision events Kafka acknowledged.",
		}),
		dropped: make(map[string]prometheus.Counter, len(reasons)),
	}
	p.promiseFn = p.promise
	p.records.New = func() any { return &kgo.Record{Value: make([]byte, 0, 192)} }
	droppedVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgelimit_events_dropped_total",
		Help: "Decision events not published, by reason: buffer_full, broker_error, encode_error, closed.",
	}, []string{"reason"})
	for _, r := range reasons {
		p.dropped[r] = droppedVec.WithLabelValues(r) // pre-created: zeros are visible
	}
	buffered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "edgelimit_events_buffered",
		Help: "Decision events waiting in memory for Kafka.",
	}, func() float64 { return float64(cl.BufferedProduceRecords()) })
	if reg != nil {
		for _, c := range []prometheus.Collector{p.published, droppedVec, buffered} {
			if err := reg.Register(c); err != nil {
				cl.Close()
				return nil, fmt.Errorf("register publish metrics: %w", err)
			}
		}
	}
	go p.account()
	return p, nil
}

// drop counts one dropped decision event.
func (p *Publisher) drop(i int) {
	p.drops[i].Add(1)
	p.dropped[reasons[i]].Inc()
}

// account sends an accounting record every accountEvery until Close
// stops it (Close sends the final one).
func (p *Publisher) account() {
	defer close(p.accounted)
	t := time.NewTicker(p.accountEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.sendAccounting(false)
		case <-p.stop:
			return
		}
	}
}

// Accounting returns the publisher's running totals now, as its next
// accounting record would carry them.
func (p *Publisher) Accounting() event.Accounting {
	return event.Accounting{
		RunStart:           p.runStart,
		Decisions:          p.attempted.Load(),
		Published:          p.acked.Load(),
		DroppedBufferFull:  p.drops[iBufferFull].Load(),
		DroppedBrokerError: p.drops[iBrokerError].Load(),
		DroppedEncodeError: p.drops[iEncodeError].Load(),
		DroppedClosed:      p.drops[iClosed].Load(),
	}
}

// sendAccounting publishes the running totals. A record lost on the way
// loses nothing: the next one carries the same totals and more.
func (p *Publisher) sendAccounting(final bool) {
	now := p.now()
	a := p.Accounting()
	a.Final = final
	b, err := event.Encode(event.Decision{ID: event.NewID(now), Time: now, GatewayID: p.gatewayID,
		Mode: event.ModeAccounting, Accounting: a})
	if err != nil { // Validate checked the gateway id; nothing else can fail
		p.log.Error("encode accounting record", "error", err)
		return
	}
	p.pending.Add(1)
	p.cl.TryProduce(context.Background(), &kgo.Record{Topic: p.topic, Value: b, Headers: schemaHeaders},
		func(*kgo.Record, error) { p.pending.Add(-1) })
}

// Publish queues d for Kafka and returns at once. It never blocks: when the
// buffer is full, Kafka is unreachable or d cannot be encoded, the event is
// dropped and counted.
func (p *Publisher) Publish(d event.Decision) {
	p.attempted.Add(1)
	if p.closed.Load() {
		p.drop(iClosed)
		p.lostAtClose.Add(1)
		return
	}
	r := p.records.Get().(*kgo.Record)
	b, err := event.AppendEncode(r.Value[:0], d)
	if err != nil {
		p.records.Put(r)
		p.drop(iEncodeError)
		p.maybeLog("drop undecodable decision event", err)
		return
	}
	*r = kgo.Record{Topic: p.topic, Value: b, Headers: schemaHeaders}
	p.pending.Add(1)
	p.cl.TryProduce(context.Background(), r, p.promiseFn)
}

// promise runs once per event, serially, when Kafka answered or the event
// failed. It must not block.
func (p *Publisher) promise(r *kgo.Record, err error) {
	defer p.pending.Add(-1)
	defer p.recycle(r)
	if err != nil && p.closed.Load() {
		p.lostAtClose.Add(1)
	}
	switch {
	case err == nil:
		p.acked.Add(1)
		p.published.Inc()
	case errors.Is(err, kgo.ErrMaxBuffered):
		p.drop(iBufferFull)
	case errors.Is(err, kgo.ErrClientClosed):
		p.drop(iClosed)
	default:
		p.drop(iBrokerError)
		p.maybeLog("drop decision event", err)
	}
}

// recycle returns r to the pool: franz-go no longer touches a record once
// its promise has returned.
func (p *Publisher) recycle(r *kgo.Record) {
	if cap(r.Value) > 4096 {
		return // keep the pool's buffers small
	}
	*r = kgo.Record{Value: r.Value[:0]}
	p.records.Put(r)
}

// maybeLog logs at most one line per logEvery.
func (p *Publisher) maybeLog(msg string, err error) {
	now := p.now().UnixNano()
	last := p.lastLog.Load()
	if now-last < int64(logEvery) || !p.lastLog.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn(msg, "error", err, "topic", p.topic)
}

// awaitPromises waits, at most 5s, until every record given to franz-go
// has had its promise run.
func (p *Publisher) awaitPromises() {
	for deadline := time.Now().Add(5 * time.Second); p.pending.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// Attempted returns how many events Publish was given.
func (p *Publisher) Attempted() int64 { return p.attempted.Load() }

// Close flushes buffered events until ctx is done, then closes the client;
// events still buffered then are dropped (reason closed), as are events
// published once Close has begun. It returns ctx's error if the flush did not
// finish, naming how many events were dropped since Close began (also in a
// log line: the metrics go with the process). Stop whatever calls Publish
// first.
func (p *Publisher) Close(ctx context.Context) error {
	p.closed.Store(true)
	p.stopping.Do(func() { close(p.stop) })
	<-p.accounted
	err := p.cl.Flush(ctx)
	// The final accounting record, once every event flushed is counted:
	// it carries the run's totals, unless the flush gave up (then the
	// events dropped below are in no record).
	if err == nil {
		p.awaitPromises()
	}
	p.sendAccounting(true)
	if err == nil {
		err = p.cl.Flush(ctx)
	}
	p.cl.Close()
	// Closing fails every record still buffered, but their promises run
	// on franz-go's goroutines: wait for them, so every event is counted
	// as published or dropped when Close returns.
	p.awaitPromises()
	// Events whose promise never ran are lost too, uncounted by reason.
	if lost := p.lostAtClose.Load() + p.pending.Load(); lost > 0 {
		p.log.Error("decision events dropped at shutdown", "events", lost, "topic", p.topic)
		if err == nil {
			err = errors.New("not flushed")
		}
		return fmt.Errorf("flush decision events: %d dropped, not published: %w", lost, err)
	}
	if err != nil {
		return fmt.Errorf("flush decision events: %w", err)
	}
	return nil
}
