package publish

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		give Config
		want string // which problem, wrapping ErrInvalidConfig; "" for none
	}{
		{name: "defaults", give: Config{Brokers: []string{"b:9092"}}},
		{name: "no brokers", give: Config{}, want: "no brokers"},
		{name: "negative buffer", give: Config{Brokers: []string{"b"}, MaxBuffered: -1}, want: "max buffered"},
		{name: "negative linger", give: Config{Brokers: []string{"b"}, Linger: -time.Second}, want: "negative duration: linger"},
		{name: "negative timeout", give: Config{Brokers: []string{"b"}, DeliveryTimeout: -1}, want: "negative duration: delivery timeout"},
		{name: "bad compression", give: Config{Brokers: []string{"b"}, Compression: "brotli"}, want: "unknown compression"},
		{name: "zstd", give: Config{Brokers: []string{"b"}, Compression: "zstd"}},
		{name: "ipv6", give: Config{Brokers: []string{"[::1]:9092", "b"}}},
		{name: "password in a broker", give: Config{Brokers: []string{"b:9092", "user:hunter2@b:9092"}}, want: "broker 2 of 2 is not a host:port"},
		{name: "broker url", give: Config{Brokers: []string{"kafka://b:9092"}}, want: "broker 1 of 1 is not a host:port"},
		{name: "bad topic", give: Config{Brokers: []string{"b"}, Topic: "decisions/v2"}, want: `topic: event: not a Kafka topic name: "decisions/v2"`},
		{name: "empty broker", give: Config{Brokers: []string{""}}, want: "broker 1 of 1 is not a host:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig naming %q", tt.give, err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Validate(%+v) = %v, which repeats the password", tt.give, err)
			}
		})
	}
	if _, err := New(Config{}, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(Config{}) error = %v, want ErrInvalidConfig", err)
	}
}

func newCluster(t testing.TB, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "decisions"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// metrics reads a Publisher's counters.
type metrics struct {
	published float64
	dropped   map[string]float64
	buffered  float64
}

// mustNew is a publisher with cfg on a registry of its own.
func mustNew(tb testing.TB, cfg Config) (*Publisher, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	p, err := New(cfg, reg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return p, reg
}

// closeWithin closes p, failing the test unless every event is settled
// within d.
func closeWithin(t testing.TB, p *Publisher, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// accounted reads p's metrics from reg and checks that every event
// attempted was either published or counted as dropped.
func accounted(t testing.TB, p *Publisher, reg *prometheus.Registry) metrics {
	t.Helper()
	m := readMetrics(t, reg)
	if attempted := float64(p.Attempted()); m.published+m.totalDropped() != attempted {
		t.Errorf("published %v + dropped %v = %v, want attempted %v", m.published, m.dropped, m.published+m.totalDropped(), attempted)
	}
	return m
}

func readMetrics(t testing.TB, reg *prometheus.Registry) metrics {
	t.Helper()
	m := metrics{dropped: map[string]float64{}}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, met := range mf.GetMetric() {
			switch mf.GetName() {
			case "edgelimit_events_published_total":
				m.published = met.GetCounter().GetValue()
			case "edgelimit_events_dropped_total":
				m.dropped[met.GetLabel()[0].GetValue()] = met.GetCounter().GetValue()
			case "edgelimit_events_buffered":
				m.buffered = met.GetGauge().GetValue()
			}
		}
	}
	return m
}

func (m metrics) totalDropped() float64 {
	var n float64
	for _, v := range m.dropped {
		n += v
	}
	return n
}

func decision(i int) event.Decision {
	now := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)
	return event.Decision{
		ID: event.NewID(now), Time: now, GatewayID: "gw-1", KeyID: "hot-key",
		KeyKind: event.KindAPIKey, ClientIP: "198.51.100.1", Route: "/v1/things",
		Method: "GET", Plan: "free", BindingRule: "per_minute", Allowed: i%3 != 0,
		Limit: 100, Remaining: 7, Cost: 1, CheckLatency: 300 * time.Microsecond,
	}
}

func TestPublishDelivers(t *testing.T) {
	c := newCluster(t, 4)
	// No periodic accounting record in this test: only the final one.
	p, reg := mustNew(t, Config{Brokers: c.ListenAddrs(), GatewayID: "gw-1", AccountEvery: time.Hour})
	const n = 3000
	want := make(map[[16]byte]event.Decision, n)
	all := make([]event.Decision, n)
	for i := range all {
		all[i] = decision(i)
		want[all[i].ID] = all[i]
	}
	var wg sync.WaitGroup
	for g := range 4 { // concurrent publishers, as in the gateway
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 4 {
				p.Publish(all[i])
			}
		}()
	}
	wg.Wait()
	closeWithin(t, p, 10*time.Second)

	m := readMetrics(t, reg)
	if m.published != n || m.totalDropped() != 0 || m.buffered != 0 {
		t.Errorf("after Close: published=%v dropped=%v buffered=%v, want %d, 0, 0", m.published, m.dropped, m.buffered, n)
	}
	if got := p.Attempted(); got != n {
		t.Errorf("Attempted() = %d, want %d", got, n)
	}

	partitions := map[int32]int{}
	var final []event.Accounting
	for _, r := range testenv.Consume(t, c.ListenAddrs(), "decisions", n+1) {
		if r.Key != nil {
			t.Fatalf("record key = %q, want none (no per-key partitioning)", r.Key)
		}
		if len(r.Headers) != 1 || r.Headers[0].Key != event.Header || event.CheckVersion(r.Headers[0].Value) != nil {
			t.Fatalf("record headers = %v, want only %s: %d", r.Headers, event.Header, event.Version)
		}
		d, err := event.Decode(r.Value)
		if err != nil {
			t.Fatalf("Decode(record at %d/%d): %v", r.Partition, r.Offset, err)
		}
		if d.Mode == event.ModeAccounting {
			if d.GatewayID != "gw-1" {
				t.Errorf("accounting record of gateway %q, want gw-1", d.GatewayID)
			}
			final = append(final, d.Accounting)
			continue
		}
		w, ok := want[d.ID]
		if !ok {
			t.Fatalf("record %x is unknown or a duplicate", d.ID)
		}
		if !w.Time.Equal(d.Time) || w.KeyID != d.KeyID || w.Allowed != d.Allowed {
			t.Fatalf("record %x = %+v, want %+v", d.ID, d, w)
		}
		delete(want, d.ID)
		partitions[r.Partition]++
	}
	if len(want) != 0 {
		t.Errorf("%d events never reached Kafka", len(want))
	}
	if len(final) != 1 || !final[0].Final || final[0].Decisions != n || final[0].Published != n || final[0].Dropped() != 0 {
		t.Errorf("accounting records %+v, want one, final, %d decisions all published", final, n)
	}
	// Every event has the same key; a keyed partitioner would put them all
	// on one partition.
	if len(partitions) < 2 {
		t.Errorf("one hot key's events landed on partitions %v, want them spread over several", partitions)
	}
}

// breakProduce makes the kfake broker close every produce connection until
// the returned function is called: Kafka is reachable for metadata but
// takes no events.
func breakProduce(c *kfake.Cluster) (restore func()) {
	var mu sync.Mutex
	broken := true
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		defer mu.Unlock()
		if !broken {
			return nil, nil, false
		}
		c.KeepControl()
		return nil, errors.New("broker down"), true
	})
	return func() {
		mu.Lock()
		broken = false
		mu.Unlock()
	}
}

// publishAll publishes n events from one goroutine and fails the test if it
// does not return while Kafka takes nothing: a blocking Publish would wait
// forever for buffer space that never frees.
func publishAll(t *testing.T, p *Publisher, from, n int) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := from; i < from+n; i++ {
			p.Publish(decision(i))
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Publish blocked while Kafka was down")
	}
}

func TestPublishBrokerDownBuffersThenDrops(t *testing.T) {
	c := newCluster(t, 2)
	const bound = 200
	p, reg := mustNew(t, Config{Brokers: c.ListenAddrs(), MaxBuffered: bound, Linger: time.Millisecond, AccountEvery: time.Hour})
	restore := breakProduce(c)

	const n = 5 * bound
	publishAll(t, p, 0, n)
	testenv.WaitFor(t, 10*time.Second, "the buffer to fill and the rest to drop", func() bool {
		m := readMetrics(t, reg)
		return m.buffered == bound && m.dropped[ReasonBufferFull] == n-bound
	})
	if m := readMetrics(t, reg); m.published != 0 {
		t.Fatalf("published = %v while Kafka took nothing, want 0", m.published)
	}

	restore()
	testenv.WaitFor(t, 20*time.Second, "buffered events to reach Kafka", func() bool {
		return readMetrics(t, reg).buffered == 0
	})
	publishAll(t, p, n, 100) // traffic after the outage goes through
	closeWithin(t, p, 10*time.Second)
	m := accounted(t, p, reg)
	if m.published != bound+100 {
		t.Errorf("published = %v, want the %d buffered during the outage plus 100 after", m.published, bound)
	}
	recs := testenv.Consume(t, c.ListenAddrs(), "decisions", bound+100+1)
	if got := len(recs); got != bound+100+1 {
		t.Errorf("topic holds %d records, want %d and the accounting record", got, bound+100)
	}
	// The final accounting record carries the drops into the stream.
	want := event.Accounting{RunStart: p.runStart.UTC(), Decisions: n + 100, Published: bound + 100, DroppedBufferFull: n - bound, Final: true}
	var got []event.Accounting
	for _, r := range recs {
		if d, err := event.Decode(r.Value); err == nil && d.Mode == event.ModeAccounting {
			got = append(got, d.Accounting)
		}
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("accounting records %+v, want one: %+v", got, want)
	}
}

func TestCloseGivesUpAtDeadline(t *testing.T) {
	c := newCluster(t, 1)
	p, reg := mustNew(t, Config{Brokers: c.ListenAddrs(), MaxBuffered: 50})
	breakProduce(c)
	publishAll(t, p, 0, 80)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with Kafka down = %v, want DeadlineExceeded", err)
	}
	p.Publish(decision(1000)) // after Close: dropped, not a panic or a block
	m := readMetrics(t, reg)
	want := map[string]float64{ReasonBufferFull: 30, ReasonClosed: 51, ReasonBrokerError: 0, ReasonEncodeError: 0}
	for r, w := range want {
		if m.dropped[r] != w {
			t.Errorf("dropped{reason=%q} = %v, want %v (all: %v)", r, m.dropped[r], w, m.dropped)
		}
	}
	if m.published != 0 {
		t.Errorf("published = %v, want 0", m.published)
	}
}

func TestPublishEncodeError(t *testing.T) {
	c := newCluster(t, 1)
	p, reg := mustNew(t, Config{Brokers: c.ListenAddrs()})
	d := decision(1)
	d.Route = strings.Repeat("/x", event.MaxFieldLen)
	p.Publish(d)
	p.Publish(decision(2))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := readMetrics(t, reg)
	if m.dropped[ReasonEncodeError] != 1 || m.published != 1 {
		t.Errorf("published=%v dropped=%v, want 1 published and 1 encode_error", m.published, m.dropped)
	}
}

func TestMetricsRegistered(t *testing.T) {
	c := newCluster(t, 1)
	p, reg := mustNew(t, Config{Brokers: c.ListenAddrs()})
	defer p.Close(context.Background())
	if n := testutil.CollectAndCount(reg, "edgelimit_events_dropped_total"); n != len(reasons) {
		t.Errorf("dropped series = %d, want one per reason (%d) from the start", n, len(reasons))
	}
	if _, err := New(Config{Brokers: c.ListenAddrs()}, reg, nil); err == nil {
		t.Error("second New on the same registry = nil error, want a duplicate registration error")
	}
}

// BenchmarkPublish measures what publishing costs per event, sustained:
// events are published from parallel goroutines in rounds of 10,000 and
// each round is flushed, so franz-go's batching, compression and sending
// are in the time too, and nothing is dropped for a full buffer (checked:
// dropped/op). Real Kafka when testenv provides it, else an in-process kfake
// (whose own work then also shares the CPU).
func BenchmarkPublish(b *testing.B) {
	brokers := newCluster(b, 4).ListenAddrs()
	if os.Getenv("EDGELIMIT_KAFKA_BROKERS") != "" {
		brokers = testenv.KafkaBrokers(b)
	}
	topic := fmt.Sprintf("bench-publish-%d", time.Now().UnixNano())
	testenv.CreateTopics(b, brokers, 4, topic)
	p, reg := mustNew(b, Config{Brokers: brokers, Topic: topic, MaxBuffered: 20_000})
	d := decision(1)
	// Warm up: the new topic's metadata and the producer id are fetched
	// once, outside the timing.
	p.Publish(d)
	if err := p.cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	const round = 10_000
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += 4 {
					p.Publish(d)
				}
			}()
		}
		wg.Wait()
		if err := p.cl.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := p.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	m := readMetrics(b, reg)
	b.ReportMetric(m.totalDropped()/float64(p.Attempted()), "dropped/op")
}
