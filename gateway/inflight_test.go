package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// slowUpstream is a real HTTP service that counts the requests it is
// answering at once, and the most it ever was; each answer takes hold.
type slowUpstream struct {
	*httptest.Server
	now, most atomic.Int64
}

func newSlowUpstream(t testing.TB, hold time.Duration) *slowUpstream {
	u := &slowUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.now.Add(1)
		defer u.now.Add(-1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		// A streamed answer: its end is the body's, not the header's.
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(hold)
		_, _ = io.WriteString(w, "data: b\n\n")
	}))
	t.Cleanup(u.Close)
	return u
}

// inFlightConfig limits every caller by a generous rate and at most n
// requests in flight.
func inFlightConfig(upstream string, n int64, lease time.Duration) Config {
	cfg := testConfig(upstream)
	cfg.Plans = map[string]Plan{"free": {Rules: []Rule{
		{Rule: limiter.Rule{Name: "minute", Limit: 1_000_000, Period: time.Minute}},
		{Rule: limiter.Rule{Name: "concurrent"}, InFlight: n, Lease: lease},
	}}}
	return cfg
}

// TestInFlightAcrossGateways: 3 gateways sharing one Redis, in_flight: 5,
// 50 concurrent callers on slow answers: the upstream never answers more
// than 5 of them at once, the others are told it is the in-flight limit,
// and every slot comes back when its answer ends.
func TestInFlightAcrossGateways(t *testing.T) {
	up := newSlowUpstream(t, 30*time.Millisecond)
	_, rdb := redisStore(t)
	prefix := "gwinflight" + randHex(6)
	var gws []*testGateway
	for range 3 {
		gws = append(gws, startGateway(t, inFlightConfig(up.URL, 5, 0), Options{Store: storeOn(t, newRedisClient(rdb.Options().Addr), prefix)}))
	}
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for c := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				r := get(t, gws[c%3].URL+"/stream")
				switch r.status {
				case http.StatusOK:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					denied.Add(1)
					var p problem
					r.json(t, &p)
					if len(p.Violated) != 1 || !p.Violated[0].InFlight || !strings.Contains(p.Detail, "in flight") {
						t.Errorf("a 429 that does not say it is the in-flight limit: %s", r.body)
					}
					if r.retryAfter(t) < 1 {
						t.Errorf("a 429 without a Retry-After")
					}
				default:
					t.Errorf("status %d", r.status)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d admitted, %d denied; at most %d at the upstream at once", admitted.Load(), denied.Load(), up.most.Load())
	if m := up.most.Load(); m > 5 || m < 2 {
		t.Errorf("the upstream answered %d at once, want at most 5 (and several)", m)
	}
	if denied.Load() == 0 {
		t.Error("50 callers on 5 slots: none was denied")
	}
	// Every answer has ended: all 5 slots are free, on any gateway.
	var free sync.WaitGroup
	var ok atomic.Int64
	for i := range 5 {
		free.Add(1)
		go func() {
			defer free.Done()
			if r := get(t, gws[i%3].URL+"/stream"); r.status == http.StatusOK {
				ok.Add(1)
			}
		}()
	}
	free.Wait()
	if ok.Load() != 5 {
		t.Errorf("after every answer ended, %d of 5 concurrent requests were admitted", ok.Load())
	}
}

// TestInFlightHeldByATunnel: an upgraded connection holds its slot until
// it closes; the headers show the slots left, and RateLimit-Policy
// promises no rate for them.
func TestInFlightHeldByATunnel(t *testing.T) {
	var opened atomic.Int64
	up := echoTunnelUpstream(t, &opened)
	cfg := inFlightConfig(up.URL, 1, 0)
	cfg.Routes = []Route{{Name: "ws", PathPrefix: "/", Upstream: "app", Upgrades: []string{"websocket"}}}
	lim, _ := redisStore(t)
	gw := startGateway(t, cfg, Options{Store: lim})
	conn, _, resp := dialUpgrade(t, gw.URL, "/ws", "websocket")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %d", resp.StatusCode)
	}
	if rl := resp.Header.Get(hRateLimit); !strings.Contains(rl, `"concurrent";r=0;t=0`) {
		t.Errorf("RateLimit %q, want the in-flight rule with no slot left", rl)
	}
	if p := resp.Header.Get(hPolicy); strings.Contains(p, "concurrent") {
		t.Errorf("RateLimit-Policy %q names the in-flight rule, which promises no rate", p)
	}
	if r := get(t, gw.URL+"/x"); r.status != http.StatusTooManyRequests {
		t.Fatalf("a second request while the tunnel is open: %d, want 429", r.status)
	}
	conn.Close()
	testenv.WaitFor(t, 30*time.Second, "the closed tunnel's slot to come back", func() bool {
		return get(t, gw.URL+"/x").status == http.StatusOK
	})
}

// TestInFlightConfig: what an in-flight rule cannot mean is refused at
// load; the check API leaves in-flight rules out (it sees no answer end).
func TestInFlightConfig(t *testing.T) {
	for name, edit := range map[string]func(*Rule){
		"with a limit":   func(r *Rule) { r.Limit = 5 },
		"with a period":  func(r *Rule) { r.Period = time.Minute },
		"too many":       func(r *Rule) { r.InFlight = limiter.MaxInFlight + 1 },
		"short lease":    func(r *Rule) { r.Lease = time.Millisecond },
		"in tokens":      func(r *Rule) { r.Unit = "tokens" },
		"lease, no slot": func(r *Rule) { r.InFlight, r.Limit, r.Period = 0, 5, time.Minute; r.Lease = time.Minute },
	} {
		cfg := inFlightConfig("http://127.0.0.1:1", 5, 0)
		rules := append([]Rule(nil), cfg.Plans["free"].Rules...)
		edit(&rules[1])
		cfg.Plans["free"] = Plan{Rules: rules}
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cfg := inFlightConfig("http://127.0.0.1:1", 5, 0)
	cfg.Plans["free"] = Plan{Rules: cfg.Plans["free"].Rules[1:]}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "in flight") {
		t.Errorf("a plan of only an in-flight rule: %v, want refused", err)
	}

	up := newSlowUpstream(t, 0)
	lim, _ := redisStore(t)
	cfg = inFlightConfig(up.URL, 1, 0)
	cfg.TrustedProxies = []string{"127.0.0.1"}
	gw := startGateway(t, cfg, Options{Store: lim})
	for range 3 {
		r := do(t, http.MethodPost, gw.URL+"/v1/check", strings.NewReader(`{"ip":"203.0.113.5","path":"/x"}`), "Content-Type", "application/json")
		var resp struct {
			Allowed bool `json:"allowed"`
		}
		_ = json.Unmarshal(r.body, &resp)
		if r.status != http.StatusOK || !resp.Allowed || strings.Contains(r.header.Get(hRateLimit), "concurrent") {
			t.Fatalf("the check API with an in-flight rule: %d %s %q", r.status, r.body, r.header.Get(hRateLimit))
		}
	}
}

// TestClientGoneMidAnswer: a client that goes away in the middle of a
// streamed answer (ReverseProxy then aborts the handler) gives its
// in-flight slot back at once and its token reservation is settled by
// the route's rule: the answer's end is its leaving.
func TestClientGoneMidAnswer(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[]}\n\n")
		w.(http.Flusher).Flush()
		if r.URL.Path != "/v1/chat/completions/slow" {
			_, _ = io.WriteString(w, "data: {\"usage\":{\"total_tokens\":7}}\n\n")
			return
		}
		select { // the usage never comes
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	cfg := llmConfig(up.URL, 1000, 24*time.Hour, plans.Tokens{Reserve: plans.Reserve{Default: 100, Max: 500}})
	p := cfg.Plans["llm"]
	p.Rules = append(p.Rules, Rule{Rule: limiter.Rule{Name: "concurrent"}, InFlight: 1})
	cfg.Plans["llm"] = p
	lim, _ := redisStore(t)
	ev := &eventLog{}
	gw := startGateway(t, cfg, Options{Store: lim, Publisher: ev})

	conn, br := rawConn(t, gw.URL, "POST /v1/chat/completions/slow HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the slow answer: %v, %v", resp, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // its first event
		t.Fatal(err)
	}
	if r := do(t, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader("{}")); r.status != http.StatusTooManyRequests {
		t.Fatalf("while the slow answer holds the slot: %d, want 429", r.status)
	}
	conn.Close()
	testenv.WaitFor(t, 30*time.Second, "the gone client's slot to come back", func() bool {
		return do(t, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader("{}")).status == http.StatusOK
	})
	all := ev.await(t, func(all []event.Decision) bool { return settlements(all) >= 2 })
	for _, e := range all {
		if e.Mode == event.ModeSettlement && e.Settled != 7 && (e.Reserved != 100 || e.Settled != 100) {
			t.Errorf("settlement %+v: the gone client's should keep its reservation (100), the other settle 7", e)
		}
	}
}

// TestAdminShowsInFlight: the key admin API shows an in-flight rule's
// free slots while an answer holds one, and a reset frees them.
func TestAdminShowsInFlight(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if r.URL.Path != "/hold" {
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	cfg := adminConfig(up.URL)
	cfg.Plans["pro"] = Plan{Rules: []Rule{
		{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}},
		{Rule: limiter.Rule{Name: "concurrent"}, InFlight: 1},
	}}
	lim, _ := redisStore(t)
	rig := startAdminOn(t, cfg, Options{Store: lim}, map[string]Secret{"oncall": testAdminToken})
	key := []string{"X-API-Key", rawAPIKey}
	conn, br := rawConn(t, rig.gw.URL, "GET /hold HTTP/1.1\r\nHost: gw\r\nX-API-Key: "+rawAPIKey+"\r\n\r\n")
	defer conn.Close()
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the held answer: %v, %v", resp, err)
	}
	r := rulesOf(t, rig.show(t, "api_key=alice"), "plan", "")
	if len(r) != 2 || r[1].Algorithm != "in_flight" || !r[1].Found || r[1].Remaining != 0 {
		t.Fatalf("while an answer holds the one slot: %+v", r)
	}
	if n := admitted(t, rig.gw.URL+"/a", 1, key...); n != 0 {
		t.Fatal("a second request got the one slot")
	}
	if resp := rig.call(t, http.MethodPost, "reset?api_key=alice", "Authorization", "Bearer "+testAdminToken); resp.status != http.StatusOK {
		t.Fatalf("reset = %d %s", resp.status, resp.body)
	}
	if n := admitted(t, rig.gw.URL+"/a", 1, key...); n != 1 {
		t.Fatal("the slot was not freed by the reset")
	}
}
