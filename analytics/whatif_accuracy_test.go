package analytics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
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

// TestWhatIfReplaysOverridesAndGrants: a real gateway on a real Redis
// limits three API keys of one plan, one with overrides of both its rules
// and one that on-call grants more of its daily quota mid-traffic. The
// self-check (the rules that ran, the overrides and the grant among them)
// reproduces every decision; replayed under the plan's rules alone, or
// without the grant, it did not.
func TestWhatIfReplaysOverridesAndGrants(t *testing.T) {
	conn := mustDatabase(t)
	rdb, prefix := mustRedis(t)
	ctx := context.Background()
	day := limiter.MustCalendar(limiter.Day, "UTC", "")
	plan := []limiter.Rule{
		{Name: "second", Limit: 10, Period: time.Second, Burst: 5},
		{Name: "daily", Limit: 15, Calendar: day},
	}
	big := map[string]gateway.Override{"second": {Limit: 20, Burst: 10}, "daily": {Limit: 40}}
	keys := []gateway.APIKey{apiKey("big", "raw-big-"+prefix, "free"), apiKey("small", "raw-small-"+prefix, "free"),
		apiKey("plain", "raw-plain-"+prefix, "free")}
	keys[0].Overrides = big
	lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix, DenyCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	log := &eventLog{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	gw, err := gateway.New(gateway.Config{
		GatewayID: "gw-o", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Plans:   map[string]gateway.Plan{"free": {Rules: []gateway.Rule{{Rule: plan[0]}, {Rule: plan[1]}}}},
		APIKeys: keys, StoreDeadline: time.Second,
		Upstreams: map[string]gateway.Upstream{"app": {URL: up.URL}},
		Routes:    []gateway.Route{{Name: "api", PathPrefix: "/", Upstream: "app"}},
	}, gateway.Options{Store: lim, Publisher: log, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	traffic := httptest.NewServer(gw.Handler())
	t.Cleanup(traffic.Close)
	const token = "whatif-grant-token-0123456789abcdef"
	admin, err := gateway.NewAdmin(gw, gateway.AdminConfig{Tokens: map[string]gateway.Secret{"oncall": token}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	admin.Register(mux)
	adminSrv := httptest.NewServer(mux)
	t.Cleanup(adminSrv.Close)

	client := &http.Client{Timeout: 5 * time.Second}
	do := func(req *http.Request) int {
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	from := time.Now().UTC().Add(-time.Second)
	admitted := map[string]int{}
	var mu sync.Mutex
	var load sync.WaitGroup
	for _, name := range []string{"big", "small", "plain"} {
		load.Add(1)
		go func() {
			defer load.Done()
			for i := range 80 {
				if name == "small" && i == 50 {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, adminSrv.URL+gateway.AdminPath+"/grant?api_key=small&rule=daily&units=10", nil)
					req.Header.Set("Authorization", "Bearer "+token)
					if code := do(req); code != http.StatusOK {
						t.Errorf("grant = %d", code)
					}
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, traffic.URL+"/v1/items", nil)
				req.Header.Set("X-API-Key", "raw-"+name+"-"+prefix)
				if do(req) == http.StatusOK {
					mu.Lock()
					admitted[name]++
					mu.Unlock()
				}
				time.Sleep(25 * time.Millisecond)
			}
		}()
	}
	load.Wait()
	// The traffic tests both: the overrides admitted more than the plan
	// could, and the grant admitted what the plan's quota had refused.
	if admitted["big"] <= 15 || admitted["plain"] != 15 || admitted["small"] <= 15 {
		t.Fatalf("admitted %v; want big and small past the plan's daily 15, plain at it", admitted)
	}
	n, denied := log.counts()
	mustInsert(t, conn, log.events)

	ran := analytics.Proposal{Plans: map[string][]limiter.Rule{"free": plan}, Keys: map[string]analytics.ProposedKey{
		"big": {Plan: "free", Rules: []limiter.Rule{big["second"].Apply(gateway.Rule{Rule: plan[0]}).Rule, big["daily"].Apply(gateway.Rule{Rule: plan[1]}).Rule}}}}
	rep, err := analytics.NewReader(conn).WhatIf(ctx, analytics.WhatIfQuery{
		Range: analytics.Range{From: from, To: time.Now().UTC().Add(2 * time.Second)}, Proposal: ran, Ran: &ran})
	if err != nil {
		t.Fatal(err)
	}
	c := rep.SelfCheck
	t.Logf("%d decisions (%d denied, admitted %v), %d grant; self-check %+v", n, denied, admitted, rep.Grants, c)
	if rep.Grants != 1 || c == nil || c.Requests != int64(n-1) || c.Agreement != 1 || c.WasDenied != int64(denied) {
		t.Errorf("replayed %d grants, self-check %+v; want the grant and all %d decisions (%d denied) reproduced", rep.Grants, c, n-1, denied)
	}
}
