package analytics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// eventLog is a gateway publisher that keeps every decision event.
type eventLog struct {
	mu     sync.Mutex
	events []event.Decision
}

func (l *eventLog) Publish(d event.Decision) {
	l.mu.Lock()
	l.events = append(l.events, d)
	l.mu.Unlock()
}

// counts is how many decisions are logged so far, and how many denied.
func (l *eventLog) counts() (n, denied int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if !e.Allowed {
			denied++
		}
	}
	return len(l.events), denied
}

// TestWhatIfMatchesGateway is the replay's accuracy check against the
// real thing: the same traffic goes, request by request and at the same
// moments, through two real gateways on a real Redis, one running rule X,
// the other the proposed rule Y. X's decisions are stored in ClickHouse;
// the what-if of Y over them must deny what the Y gateway actually denied,
// within 1 % in total (and 2 % summing each key's difference).
//
// Not parallel: the two gateways decide each request a moment apart, and
// the replay sees X's moment. Starved of CPU beside the package's parallel
// tests (CI once sent half the usual requests), those moments drifted
// across refills by more than the replay's own error (1.37 % apart).
func TestWhatIfMatchesGateway(t *testing.T) {
	conn := mustDatabase(t)
	rdb, prefix := mustRedis(t)
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	const secret = "whatif-accuracy-secret"
	ruleX := []gateway.Rule{{Rule: limiter.Rule{Name: "second", Limit: 3, Period: time.Second}}}
	ruleY := []gateway.Rule{
		{Rule: limiter.Rule{Name: "second", Limit: 1, Period: time.Second, Burst: 3}},
		{Rule: limiter.Rule{Name: "ten_seconds", Limit: 15, Period: 10 * time.Second, Algorithm: limiter.SlidingWindow}},
	}
	const nKeys = 40
	var keys []gateway.APIKey
	raw := make([]string, nKeys)
	for i := range raw {
		raw[i] = fmt.Sprintf("raw-whatif-%d-%s", i, prefix)
		keys = append(keys, apiKey(fmt.Sprintf("k%d", i), raw[i], "free"))
	}
	start := func(name string, rules []gateway.Rule, pub *eventLog) string {
		lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix + "-" + name, DenyCache: -1})
		if err != nil {
			t.Fatal(err)
		}
		return serveGateway(t, gateway.Config{
			GatewayID: "gw-" + name,
			Plans:     map[string]gateway.Plan{"free": {Rules: rules}},
			APIKeys:   keys,
			// One secret: both gateways name a key by the same id.
			KeyHashSecret: secret,
			StoreDeadline: time.Second,
		}, gateway.Options{Store: lim, Publisher: pub, Logger: quiet})
	}
	xLog, yLog := &eventLog{}, &eventLog{}
	xURL, yURL := start("x", ruleX, xLog), start("y", ruleY, yLog)

	// Each key sends at its own pace (2 to 8 a second on average, in
	// random gaps) for 8 seconds, and on until the traffic tests the
	// proposal (on a busy machine requests take longer, so fewer are sent
	// in 8 seconds); each request goes to both gateways at once.
	client := &http.Client{Timeout: 5 * time.Second}
	send := func(u, key string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/v1/items", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("request: %v", err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	from := time.Now().UTC().Add(-time.Second)
	stop := make(chan struct{})
	var load sync.WaitGroup
	for i := range nKeys {
		load.Add(1)
		go func() {
			defer load.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			mean := time.Second / time.Duration(2+i%7)
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(rng.Int64N(int64(2 * mean)))):
				}
				var both sync.WaitGroup
				both.Add(2)
				go func() { defer both.Done(); send(xURL, raw[i]) }()
				go func() { defer both.Done(); send(yURL, raw[i]) }()
				both.Wait()
			}
		}()
	}
	time.Sleep(8 * time.Second)
	testenv.WaitFor(t, time.Minute, "enough traffic to test the proposal", func() bool {
		n, denied := yLog.counts()
		return n >= 600 && denied >= 250
	})
	close(stop)
	load.Wait()
	to := time.Now().UTC().Add(2 * time.Second)

	mustInsert(t, conn, xLog.events)
	yDenied, xDenied := 0, 0
	yByKey := map[string]int{}
	for _, e := range yLog.events {
		if !e.Allowed {
			yDenied++
			yByKey[e.KeyID]++
		}
	}
	for _, e := range xLog.events {
		if !e.Allowed {
			xDenied++
		}
	}
	if len(xLog.events) != len(yLog.events) || len(xLog.events) < 500 {
		t.Fatalf("gateways decided %d and %d requests; want the same, at least 500", len(xLog.events), len(yLog.events))
	}

	p := analytics.Proposal{Plans: map[string][]limiter.Rule{"free": {ruleY[0].Rule, ruleY[1].Rule}}}
	rep, err := analytics.NewReader(conn).WhatIf(ctx, analytics.WhatIfQuery{Range: analytics.Range{From: from, To: to}, Proposal: p, Top: nKeys})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Read != int64(len(xLog.events)) || rep.Totals.WasDenied != int64(xDenied) {
		t.Fatalf("replayed %d decisions (%d were denied), want %d (%d)", rep.Read, rep.Totals.WasDenied, len(xLog.events), xDenied)
	}
	// Key by key: the replay's denials beside the Y gateway's.
	off := 0
	for _, k := range rep.TopKeys {
		off += int(math.Abs(float64(int(k.WouldDeny) - yByKey[k.KeyID])))
		delete(yByKey, k.KeyID)
	}
	for _, n := range yByKey {
		off += n // keys the replay never denied
	}
	diff := math.Abs(float64(rep.Totals.WouldDeny)-float64(yDenied)) / float64(yDenied)
	t.Logf("%d requests; rule X denied %d; rule Y's gateway denied %d, its replay %d (%.2f %% apart; keys' differences sum to %d, %.2f %%)",
		rep.Read, xDenied, yDenied, rep.Totals.WouldDeny, 100*diff, off, 100*float64(off)/float64(yDenied))
	if yDenied < 200 || int64(yDenied) <= int64(xDenied) {
		t.Fatalf("rule Y denied %d (rule X %d): the traffic does not test the proposal", yDenied, xDenied)
	}
	if diff > 0.01 {
		t.Errorf("replay of rule Y denies %d, the gateway running it denied %d: %.2f %% apart, want ≤ 1 %%", rep.Totals.WouldDeny, yDenied, 100*diff)
	}
	// Key by key is stricter than the total (errors of two keys do not
	// cancel): a request on the edge of a refill can come out the other
	// way, since the events' times are the gateway's after its Redis call,
	// to the millisecond.
	if float64(off) > 0.02*float64(yDenied) {
		t.Errorf("per key, the replay's denials differ from the gateway's by %d in all (%.2f %%), want ≤ 2 %%", off, 100*float64(off)/float64(yDenied))
	}
}
