package publish

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestRealKafkaOutage stops a private Kafka broker while gateways publish
// at a steady rate: Publish keeps returning, the buffer fills to its bound,
// the overflow is counted, and once the broker is back every event is
// either in the topic or counted as dropped.
func TestRealKafkaOutage(t *testing.T) {
	srv := testenv.Private(t, "kafka")
	brokers := srv.Brokers(t)
	testenv.CreateTopics(t, brokers, 3, "decisions")

	const bound = 2000
	p, reg := mustNew(t, Config{Brokers: brokers, MaxBuffered: bound, GatewayID: "gw-outage", AccountEvery: 100 * time.Millisecond})

	// Load: 4 publishers, 2000 events/s in all, for the whole test.
	var (
		slowest atomic.Int64 // longest single Publish call, ns
		i       atomic.Int64
	)
	stopLoad := testenv.Load(t, 4, 2*time.Millisecond, func(context.Context) {
		d := decision(int(i.Add(1)))
		start := time.Now()
		p.Publish(d)
		if el := time.Since(start).Nanoseconds(); el > slowest.Load() {
			slowest.Store(el)
		}
	})

	testenv.WaitFor(t, 30*time.Second, "events to flow before the outage", func() bool {
		return readMetrics(t, reg).published >= 500
	})
	srv.Halt(t)
	haltedAt := p.Attempted()
	testenv.WaitFor(t, 60*time.Second, "the buffer to fill and drops to start", func() bool {
		m := readMetrics(t, reg)
		return m.buffered >= bound-10 && m.dropped[ReasonBufferFull] > 0
	})
	if m := readMetrics(t, reg); m.buffered > bound {
		t.Errorf("buffered = %v, over the bound %d", m.buffered, bound)
	}
	t.Logf("outage: %d events attempted while down so far; slowest Publish %v",
		p.Attempted()-haltedAt, time.Duration(slowest.Load()))

	srv.Resume(t)
	testenv.WaitFor(t, 60*time.Second, "the backlog to drain after the broker returned", func() bool {
		m := readMetrics(t, reg)
		return m.buffered < bound/4 && m.published > float64(haltedAt)
	})
	stopLoad()
	closeWithin(t, p, 30*time.Second)

	m := accounted(t, p, reg)
	if m.dropped[ReasonBufferFull] == 0 {
		t.Errorf("no buffer_full drops during the outage: %v", m.dropped)
	}
	// Exactly the published events are in the topic, beside the
	// accounting records: idempotent retries across the outage wrote none
	// twice.
	size := topicSize(t, brokers, "decisions")
	var decisions int64
	var acct []event.Accounting
	for _, r := range testenv.Consume(t, brokers, "decisions", int(size)) {
		d, err := event.Decode(r.Value)
		switch {
		case err != nil:
			t.Fatalf("decode: %v", err)
		case d.Mode == event.ModeAccounting:
			acct = append(acct, d.Accounting)
		default:
			decisions++
		}
	}
	if decisions != int64(m.published) {
		t.Errorf("topic holds %d decisions, published = %v", decisions, m.published)
	}
	// The accounting records reached the stream during the outage's drops
	// and after; the last one (the final) carries the counters' totals.
	slices.SortFunc(acct, func(a, b event.Accounting) int { return cmp.Compare(a.Decisions, b.Decisions) })
	if len(acct) < 2 {
		t.Fatalf("%d accounting records, want several", len(acct))
	}
	last := acct[len(acct)-1]
	if !last.Final || last.Decisions != p.Attempted() || float64(last.Published) != m.published ||
		float64(last.DroppedBufferFull) != m.dropped[ReasonBufferFull] || float64(last.Dropped()) != m.totalDropped() {
		t.Errorf("final accounting record %+v, want the counters: attempted %d, %+v", last, p.Attempted(), m)
	}
	for _, a := range acct[:len(acct)-1] {
		if a.Final || a.Dropped() > last.Dropped() || a.Published > last.Published {
			t.Errorf("accounting record %+v is final or past the final one", a)
		}
	}
	t.Logf("attempted %v, published %v, dropped %v, slowest Publish %v", p.Attempted(), m.published, m.dropped, time.Duration(slowest.Load()))
}

// topicSize is the number of records in topic (end minus start offsets).
func topicSize(t *testing.T, brokers []string, topic string) int64 {
	t.Helper()
	ctx, adm, done := testenv.KafkaAdmin(t, brokers, 30*time.Second)
	defer done()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(o.Topic, o.Partition)
		n += o.Offset - s.Offset
	})
	return n
}

// TestCloseSaysWhatItDropped: Kafka unreachable at shutdown, the buffered
// events are lost; Close says how many, in its error and a log line,
// because the dropped counter goes with the process before any scrape.
func TestCloseSaysWhatItDropped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close() // a broker that is down: every dial is refused
	var logs testenv.LogBuffer
	p, err := New(Config{Brokers: []string{down}}, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	publishAll(t, p, 0, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = p.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "40 dropped") {
		t.Errorf("Close with Kafka down = %v, want DeadlineExceeded naming the 40 events dropped", err)
	}
	if out := logs.String(); !strings.Contains(out, `"msg":"decision events dropped at shutdown","events":40`) {
		t.Errorf("log = %s, want a line saying 40 events were dropped at shutdown", out)
	}
}
