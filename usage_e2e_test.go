package edgelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestUsageEqualsTheLimitersCount: two gateways on one Redis publish
// through a real Kafka broker to the consumer and a real ClickHouse;
// three API keys spend a daily calendar quota on routes of cost 1 and 5
// until it refuses them. For each key the usage statement of the quota's
// window says requests = allowed + denied = what its client saw, and its
// allowed cost is the limiter's own count in the window, to the unit.
func TestUsageEqualsTheLimitersCount(t *testing.T) {
	p := newPipelineRig(t, "usage")
	ctx := p.ctx
	f := newUsageFleet(t, p, publish.Config{}, limiter.Config{})
	p.runConsumer(t)

	clients := map[string]*seen{}
	for i, k := range f.keys {
		clients[k] = &seen{}
		// Each key its own mix: 60 units of quota, 30 to 45 requests.
		for j := range 30 + 5*i {
			clients[k].add(t, f.send(t, j%2, k, (j+i)%3 == 0))
		}
		if clients[k].denied == 0 {
			t.Fatalf("%s was never refused: the quota did not bite", k)
		}
	}
	f.close(t)

	lim, err := limiter.New(p.rdb, limiter.Config{Prefix: f.prefix, DenyCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	r := analytics.NewReader(p.ch)
	for _, k := range f.keys {
		ks, err := lim.Inspect(ctx, limiter.APIKeyKey(k), f.rules)
		if err != nil {
			t.Fatal(err)
		}
		start, _ := f.day.Bounds(ks.Time)
		var st analytics.UsageStatement
		testenv.WaitFor(t, 60*time.Second, k+"'s decisions committed", func() bool {
			st, err = r.Usage(ctx, analytics.UsageQuery{From: start, To: ks.Time.Add(time.Minute), Keys: []string{k}, By: []string{analytics.UsageByKey}})
			if errors.Is(err, analytics.ErrBadQuery) {
				return false // no decision of the key committed yet
			}
			if err != nil {
				t.Fatal(err)
			}
			// and both gateways' final accounting
			return st.Total.Requests >= clients[k].requests && settled(st) == 2
		})
		c, got, count := clients[k], st.Total, ks.Rules[1].Count
		if got.Requests != c.requests || got.Allowed != c.allowed || got.Denied != c.denied || got.Requests != got.Allowed+got.Denied {
			t.Errorf("%s: statement %d = %d allowed + %d denied; the client saw %d = %d + %d", k, got.Requests, got.Allowed, got.Denied, c.requests, c.allowed, c.denied)
		}
		if got.AllowedCost != count || count == 0 {
			t.Errorf("%s: the statement's allowed cost %d, the limiter's count in the window %d: want them equal", k, got.AllowedCost, count)
		}
		if st.Dropped != 0 || len(st.Gateways) != 2 {
			t.Errorf("%s: the statement names %d drops of %+v; want none, of both gateways", k, st.Dropped, st.Gateways)
		}
		// Every decision the store numbered is stored; the deny cache's
		// are counted apart, unnumbered.
		if len(st.Sequences) != 1 || st.Missing != 0 || st.Sequences[0].Stored == 0 ||
			st.Sequences[0].Stored+st.Sequences[0].Unnumbered != got.Requests {
			t.Errorf("%s: sequences %+v, %d missing; want its numbered decisions all stored, and with the unnumbered its %d requests",
				k, st.Sequences, st.Missing, got.Requests)
		}
	}
	p.stopConsumer(t)
}

// TestUsageNamesTheDropsWhenKafkaStops: the same fleet on a Kafka broker
// that is stopped for part of the run. The gateways drop what their
// bounded buffers cannot hold, counting it; their accounting reaches the
// stream once the broker is back, and the statement of the period names,
// per gateway, exactly the drops the gateways counted, says it is
// incomplete, and the decisions it holds plus those drops are what the
// clients saw.
func TestUsageNamesTheDropsWhenKafkaStops(t *testing.T) {
	srv := testenv.Private(t, "kafka")
	p := newPipelineRigOn(t, "usagedrops", srv.Brokers(t))
	ctx := p.ctx
	from := time.Now().UTC().Truncate(time.Minute)
	// A buffer of 16 events: the outage overflows it at once.
	// No deny cache: every decision is the store's, and numbered.
	f := newUsageFleet(t, p, publish.Config{MaxBuffered: 16, AccountEvery: 200 * time.Millisecond}, limiter.Config{DenyCache: -1})

	var c seen
	phase := func(n int) {
		for j := range n {
			c.add(t, f.send(t, j%2, f.keys[j%3], j%4 == 0))
		}
	}
	phase(30)
	testenv.WaitFor(t, 60*time.Second, "the first events published", func() bool {
		return f.pubs[0].Accounting().Published > 0 && f.pubs[1].Accounting().Published > 0
	})
	srv.Halt(t)
	phase(120)
	testenv.WaitFor(t, 60*time.Second, "both gateways to drop", func() bool {
		return f.pubs[0].Accounting().DroppedBufferFull > 0 && f.pubs[1].Accounting().DroppedBufferFull > 0
	})
	srv.Resume(t)
	testenv.WaitFor(t, 60*time.Second, "the buffered events published after the outage", func() bool {
		for _, pub := range f.pubs {
			if a := pub.Accounting(); a.Published+a.Dropped() != a.Decisions {
				return false
			}
		}
		return true
	})
	phase(30)
	drops := map[string]int64{}
	for i, pub := range f.pubs {
		// Close sends the run's final accounting record, after the flush.
		f.closeOne(t, i)
		drops[f.ids[i]] = pub.Accounting().Dropped()
	}
	p.runConsumer(t)

	r := analytics.NewReader(p.ch)
	q := analytics.UsageQuery{From: from, To: time.Now().UTC().Add(time.Minute), By: []string{analytics.UsageByKey}}
	var st analytics.UsageStatement
	testenv.WaitFor(t, 60*time.Second, "every published decision and both final reports committed", func() bool {
		var err error
		st, err = r.Usage(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return settled(st) == 2 && st.Total.Requests+st.Dropped >= c.requests
	})
	got := map[string]int64{}
	for _, g := range st.Gateways {
		got[g.GatewayID] += g.Dropped
	}
	if got["gw-a"] != drops["gw-a"] || got["gw-b"] != drops["gw-b"] || drops["gw-a"] == 0 {
		t.Errorf("the statement's drops per gateway %v, the gateways' own counters %v: want them equal", got, drops)
	}
	if st.Complete || !strings.Contains(st.Incomplete, fmt.Sprintf("dropped %d decision events", drops["gw-a"]+drops["gw-b"])) {
		t.Errorf("complete %v (%q): want incomplete, naming the %d drops", st.Complete, st.Incomplete, drops["gw-a"]+drops["gw-b"])
	}
	// The sequences see every dropped decision: all were the store's
	// (no deny cache), and each key's last decision came after the outage.
	if st.Missing != drops["gw-a"]+drops["gw-b"] || len(st.Sequences) != 3 {
		t.Errorf("sequences %+v: %d missing; want the %d dropped, over the 3 keys", st.Sequences, st.Missing, drops["gw-a"]+drops["gw-b"])
	}
	t.Logf("clients saw %d requests; stored %d; gateways dropped %v; sequences %+v", c.requests, st.Total.Requests, drops, st.Sequences)
	if st.Total.Requests+st.Dropped != c.requests || st.Total.Requests != st.Total.Allowed+st.Total.Denied {
		t.Errorf("stored %d (= %d + %d) + dropped %d; the clients saw %d", st.Total.Requests, st.Total.Allowed, st.Total.Denied, st.Dropped, c.requests)
	}
	p.stopConsumer(t)
}

// seen counts what a client saw.
type seen struct{ requests, allowed, denied int64 }

func (s *seen) add(t *testing.T, status int) {
	t.Helper()
	s.requests++
	switch status {
	case http.StatusOK:
		s.allowed++
	case http.StatusTooManyRequests:
		s.denied++
	default:
		t.Fatalf("status %d", status)
	}
}

// usageFleet is two gateways (gw-a, gw-b) on the rig's Redis, publishing
// to its topic, with three API keys of a plan with a daily calendar quota
// of 60 units and routes of cost 1 (/cheap) and 5 (/dear).
type usageFleet struct {
	prefix string
	day    *limiter.Calendar
	rules  []limiter.Rule
	keys   []string
	ids    []string
	pubs   []*publish.Publisher
	addrs  []string
	closed []bool
}

func newUsageFleet(t *testing.T, p *pipelineRig, pubCfg publish.Config, limCfg limiter.Config) *usageFleet {
	t.Helper()
	// A day that starts twelve hours from now: the test never waits for,
	// nor meets, the window's end.
	day := limiter.MustCalendar(limiter.Day, "UTC", time.Now().UTC().Add(12*time.Hour).Format("15:04"))
	f := &usageFleet{
		prefix: "usage" + p.suffix, day: day,
		rules: []limiter.Rule{{Name: "minute", Limit: 10000, Period: time.Minute}, {Name: "day", Limit: 60, Calendar: day}},
		keys:  []string{"acme", "globex", "initech"}, ids: []string{"gw-a", "gw-b"},
	}
	for _, id := range f.ids {
		cfg := pubCfg
		cfg.GatewayID = id
		pub := p.publisher(t, cfg)
		lc := limCfg
		lc.Prefix = f.prefix
		lim, err := limiter.New(p.rdb, lc)
		if err != nil {
			t.Fatal(err)
		}
		gc := proxyConfig(t, id)
		gc.KeyHashSecret = "usage-secret"
		gc.StoreDeadline = time.Second // -race on two cores: keep every answer the store's
		gc.Routes = append([]gateway.Route{{Name: "dear", PathPrefix: "/dear", Upstream: "app", Cost: 5}}, gc.Routes...)
		var gr []gateway.Rule
		for _, r := range f.rules {
			gr = append(gr, gateway.Rule{Rule: r})
		}
		gc.Plans = map[string]gateway.Plan{"pro": {Rules: gr}}
		for _, k := range f.keys {
			gc.APIKeys = append(gc.APIKeys, gateway.APIKey{ID: k, SHA256: sha256Hex(k + "-key"), Plan: "pro"})
		}
		gw, err := gateway.New(gc, gateway.Options{Store: lim, Publisher: pub, Logger: p.log})
		if err != nil {
			t.Fatal(err)
		}
		f.pubs, f.addrs, f.closed = append(f.pubs, pub), append(f.addrs, serveOn(t, gw.Server())), append(f.closed, false)
	}
	t.Cleanup(func() {
		for i := range f.pubs {
			if !f.closed[i] {
				f.closeOne(t, i)
			}
		}
	})
	return f
}

// send makes one request of key's client through gateway i, to /dear or
// /cheap, and returns its status.
func (f *usageFleet) send(t *testing.T, i int, key string, dear bool) int {
	t.Helper()
	path := "/cheap"
	if dear {
		path = "/dear"
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+f.addrs[i]+path, nil)
	req.Header.Set("X-API-Key", key+"-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// close flushes every gateway's events.
func (f *usageFleet) close(t *testing.T) {
	t.Helper()
	for i := range f.pubs {
		f.closeOne(t, i)
	}
}

func (f *usageFleet) closeOne(t *testing.T, i int) {
	t.Helper()
	f.closed[i] = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.pubs[i].Close(ctx); err != nil {
		t.Errorf("flush %s's events: %v", f.ids[i], err)
	}
}

// settled is how many gateway runs of st have settled their accounting.
func settled(st analytics.UsageStatement) int {
	n := 0
	for _, g := range st.Gateways {
		if g.Settled {
			n++
		}
	}
	return n
}
