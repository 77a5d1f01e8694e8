package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

func TestBreaker(t *testing.T) {
	now := time.Unix(1000, 0)
	var changes []string
	b := newBreaker(3, time.Second, func(from, to circuit) { changes = append(changes, from.String()+">"+to.String()) })
	allow := func() (bool, bool) { return b.allow(now) }
	// fail reports a call that started after everything before it ended.
	fail := func() {
		now = now.Add(time.Millisecond)
		start := now
		now = now.Add(25 * time.Millisecond)
		b.failure(start, now)
	}

	fail()
	fail()
	b.success() // resets the count: failures must be consecutive
	fail()
	fail()
	if ok, _ := allow(); !ok {
		t.Fatalf("open after 2 consecutive failures, want closed until 3")
	}
	fail()
	if ok, _ := allow(); ok {
		t.Fatalf("closed after 3 failures")
	}
	if got := b.retryIn(now); got != time.Second {
		t.Errorf("retryIn = %v, want 1s", got)
	}
	now = now.Add(time.Second)
	ok, probe := allow()
	if !ok || !probe {
		t.Fatalf("after the open interval: allow = %v probe %v, want one probe", ok, probe)
	}
	if ok, _ := allow(); ok {
		t.Errorf("a second caller got through while the probe is in flight")
	}
	b.failure(now, now) // the probe failed: open again
	if ok, _ := allow(); ok {
		t.Errorf("closed after a failed probe")
	}
	now = now.Add(time.Second)
	_, probe = allow()
	b.abandon(probe) // the probe's client went away: the next caller probes
	ok, probe = allow()
	if !ok || !probe {
		t.Errorf("after an abandoned probe: allow = %v probe %v", ok, probe)
	}
	b.success()
	if ok, probe := allow(); !ok || probe {
		t.Errorf("after a good probe: allow = %v probe %v, want closed", ok, probe)
	}
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if diff := cmp.Diff(want, changes); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
}

// TestBreakerOneStall: one stall times out every call in flight at once;
// it counts as one failure, not as many.
func TestBreakerOneStall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newBreaker(3, time.Second, nil)
	for i := range 50 {
		b.failure(t0.Add(time.Duration(i)*time.Microsecond), t0.Add(25*time.Millisecond+time.Duration(i)*time.Microsecond))
	}
	if c := b.current(); c != circuitClosed {
		t.Fatalf("50 calls timed out by one stall opened the circuit")
	}
	// Calls started after the stall was seen, failing too: a second and a
	// third round open it.
	for round := 1; round <= 2; round++ {
		start := t0.Add(time.Duration(round) * 30 * time.Millisecond)
		b.failure(start, start.Add(25*time.Millisecond))
	}
	if c := b.current(); c != circuitOpen {
		t.Errorf("three rounds of failures: circuit %v, want open", c)
	}
}

func TestRouteMatch(t *testing.T) {
	cfg := validConfig()
	cfg.Routes = []Route{
		{Name: "root", PathPrefix: "/", Upstream: "app"},
		{Name: "users", PathPrefix: "/v1/users", Upstream: "app"},
		{Name: "users-post", PathPrefix: "/v1/users", Methods: []string{"POST"}, Upstream: "app"},
		{Name: "static", PathPrefix: "/static/", Upstream: "app"},
		{Name: "deep", PathPrefix: "/v1/users/admin", Upstream: "app"},
	}
	st, err := compile(cfg, map[string]*upstream{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method, path, want string
	}{
		{"GET", "/", "root"},
		{"GET", "", "root"},
		{"GET", "/v1/users", "users"},
		{"GET", "/v1/users/7", "users"},
		{"GET", "/v1/users2", "root"},
		{"POST", "/v1/users/7", "users-post"},
		{"GET", "/v1/users/admin/x", "deep"},
		{"GET", "/static/app.js", "static"},
		{"GET", "/static", "root"},
		{"GET", "/v1/users/../admin", "root"},
		{"GET", "/v1//users/7", "users"},
		{"GET", "/v1/./users/admin", "deep"},
	}
	for _, tt := range tests {
		p, err := normalizePath(tt.path, st.cfg.Paths)
		if err != nil {
			t.Fatalf("normalizePath(%q): %v", tt.path, err)
		}
		rt := st.match(tt.method, p)
		if rt == nil || rt.Name != tt.want {
			got := "<nil>"
			if rt != nil {
				got = rt.Name
			}
			t.Errorf("match(%q, %q) = %s, want %s", tt.method, tt.path, got, tt.want)
		}
	}
}

func TestLookupKey(t *testing.T) {
	cfg := validConfig()
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: strings.ToUpper(sha("s3cret")), Plan: "pro"}, {SHA256: sha("other"), Plan: "free"}}
	st, err := compile(cfg, map[string]*upstream{})
	if err != nil {
		t.Fatal(err)
	}
	if k := st.lookupKey("s3cret"); k == nil || k.id != "acme" || k.plan.name != "pro" {
		t.Errorf("lookupKey(s3cret) = %+v", k)
	}
	if k := st.lookupKey("other"); k == nil || k.id != sha("other")[:16] {
		t.Errorf("lookupKey(other) = %+v, want the id defaulted from the hash", k)
	}
	if k := st.lookupKey("s3cret "); k != nil {
		t.Errorf("lookupKey(near miss) = %+v", k)
	}
	// Identification reads the key from either header, never keeps it.
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "bearer s3cret")
	id, ierr := st.identify(r)
	if ierr != identified || id.key != "k:acme" || id.kind != event.KindAPIKey {
		t.Errorf("identify(bearer) = %+v, %v", id, ierr)
	}
}

func TestLocalShare(t *testing.T) {
	cfg := validConfig()
	cfg.ExpectedGateways = 3
	cfg.FailurePolicy = FailLocal
	cfg.Plans["x"] = Plan{Rules: []Rule{
		{Rule: limiter.Rule{Name: "a", Limit: 100, Period: time.Minute, Burst: 10}},
		{Rule: limiter.Rule{Name: "b", Limit: 2, Period: time.Minute}},
		{Rule: limiter.Rule{Name: "c", Limit: 50, Period: time.Minute}, FailurePolicy: FailOpen},
		{Rule: limiter.Rule{Name: "d", Limit: 50, Period: time.Minute, Shadow: true}},
	}}
	st, err := compile(cfg, map[string]*upstream{})
	if err != nil {
		t.Fatal(err)
	}
	p := st.plans["x"]
	// The rate is divided exactly (period × 3), the capacity rounded down.
	want := []limiter.Rule{{Name: "a", Limit: 100, Period: 3 * time.Minute, Burst: 3}, {Name: "b", Limit: 2, Period: 3 * time.Minute, Burst: 1}}
	if diff := cmp.Diff(want, st.localRules(limits{plan: p, rules: p.rules})); diff != "" || p.closed || !p.local {
		t.Errorf("local shares (-want +got):\n%s closed %v local %v", diff, p.closed, p.local)
	}
}

// TestLocalShareValid: every gateway's local share of a valid rule is a
// rule the limiter accepts, and the fleet's shares together never refill
// faster than the rule (where its period can stretch). A sliding
// window's share has a shorter period when the limit does not divide by
// the gateways, and one under a millisecond (3 per 1ms over 2) was
// refused: every check of the outage answered 500; over hundreds of
// gateways a long period wrapped to a negative one, refused too.
func TestLocalShareValid(t *testing.T) {
	for _, algo := range []limiter.Algorithm{limiter.TokenBucket, limiter.SlidingWindow} {
		for _, period := range []time.Duration{time.Millisecond, 1500 * time.Microsecond, 7 * time.Millisecond, time.Second, limiter.MaxPeriod} {
			for limit := int64(1); limit <= 40; limit++ {
				for _, n := range []int64{1, 2, 3, 4, 5, 7, 8, 11, 12, 300, 1000, 1 << 20} {
					r := limiter.Rule{Name: "r", Limit: limit, Period: period, Algorithm: algo}
					got := localShare(r, n)
					if err := got.Validate(); err != nil {
						t.Errorf("localShare(%+v, %d) = %+v: %v", r, n, got, err)
						continue
					}
					// n × got.Limit per got.Period ≤ limit per period, but
					// where even the stretched period is too long: then
					// each gateway keeps one unit per period, as a burst
					// below n does.
					most := limit
					if period > limiter.MaxPeriod/time.Duration(n) {
						most = max(limit, n)
					}
					if float64(n*got.Limit)*float64(period) > float64(most)*float64(got.Period)*(1+1e-12) {
						t.Errorf("localShare(%+v, %d) = %+v: %d gateways admit %d per %v, more than the rule", r, n, got, n, n*got.Limit, got.Period)
					}
				}
			}
		}
	}
}

func TestRateHeaders(t *testing.T) {
	minute := limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}
	day := limiter.Rule{Name: "day", Limit: 5000, Period: 24 * time.Hour}
	shadow := limiter.Rule{Name: "new", Limit: 1, Period: time.Second, Shadow: true}
	burst := limiter.Rule{Name: "second", Limit: 10, Period: time.Second, Burst: 50}
	small := limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute, Burst: 10}
	d := limiter.Decision{Allowed: true, Binding: 0, Rules: []limiter.RuleResult{
		{Rule: minute, Allowed: true, Remaining: 7, ResetAfter: 55*time.Second + time.Millisecond},
		{Rule: day, Allowed: true, Remaining: 4000, ResetAfter: 4 * time.Hour},
		{Rule: shadow, Allowed: false, RetryAfter: time.Second},
	}}
	tests := []struct {
		name string
		give verdict
		want http.Header
	}{
		{"decided", verdict{d: d, known: true, rules: []limiter.Rule{minute, day, shadow}}, http.Header{
			"X-Ratelimit-Limit":     {"100"},
			"X-Ratelimit-Remaining": {"7"},
			"X-Ratelimit-Reset":     {"56"},
			"Ratelimit-Policy":      {`"minute";q=100;w=60, "day";q=5000;w=86400`},
			"Ratelimit":             {`"minute";r=7;t=56, "day";r=4000;t=14400`},
		}},
		{"store failed", verdict{rules: []limiter.Rule{minute, day}}, http.Header{
			"Ratelimit-Policy": {`"minute";q=100;w=60, "day";q=5000;w=86400`},
		}},
		// Burst above the limit: the limit advertised is the burst, so
		// the remaining count never exceeds it, and the policy's window is
		// the time to refill it (issue 14 row 13: Limit 10, Remaining 49).
		{"burst above limit", verdict{known: true, rules: []limiter.Rule{burst}, d: limiter.Decision{Allowed: true, Rules: []limiter.RuleResult{
			{Rule: burst, Allowed: true, Remaining: 49, ResetAfter: 6 * time.Second},
		}}}, http.Header{
			"X-Ratelimit-Limit":     {"50"},
			"X-Ratelimit-Remaining": {"49"},
			"X-Ratelimit-Reset":     {"6"},
			"Ratelimit-Policy":      {`"second";q=50;w=5`},
			"Ratelimit":             {`"second";r=49;t=6`},
		}},
		{"burst below limit", verdict{rules: []limiter.Rule{small}}, http.Header{
			"Ratelimit-Policy": {`"minute";q=10;w=6`},
		}},
	}
	for _, tt := range tests {
		h := http.Header{}
		setRateHeaders(h, tt.give)
		if diff := cmp.Diff(tt.want, h); diff != "" {
			t.Errorf("%s: setRateHeaders (-want +got):\n%s", tt.name, diff)
		}
	}
}

type fakePublisher struct {
	mu     sync.Mutex
	events []event.Decision
}

func (f *fakePublisher) Publish(d event.Decision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, d)
}

func TestPublishesEachDecision(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1, Period: time.Minute}}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("raw-secret-key"), Plan: "free"}, {SHA256: sha("unnamed-key"), Plan: "free"}}
	cfg.GatewayID = "gw-7"
	cfg.KeyHashSecret = "hash-secret"
	pub := &fakePublisher{}
	gw := startGateway(t, cfg, Options{Publisher: pub})
	get(t, gw.URL+"/a", "X-API-Key", "raw-secret-key", "User-Agent", "test/1")
	get(t, gw.URL+"/a", "X-API-Key", "raw-secret-key", "User-Agent", "test/1")
	// 401, after a decision of the auth failure plan by address (issue 9).
	get(t, gw.URL+"/a", "X-API-Key", "wrong")
	// A key without a configured id has no name: its default id is a
	// digest of the key, not something to publish.
	get(t, gw.URL+"/a", "X-API-Key", "unnamed-key")
	// POST /v1/check names the key as the proxied request does.
	do(t, http.MethodPost, gw.URL+"/v1/check", strings.NewReader(`{"key":"raw-secret-key"}`), "Content-Type", "application/json")

	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.events) != 5 {
		t.Fatalf("%d events, want 5", len(pub.events))
	}
	if e := pub.events[4]; e.KeyKind != event.KindAPIKey || e.KeyName != "acme" {
		t.Errorf("check event %+v, want key name acme", e)
	}
	if e := pub.events[2]; e.KeyKind != event.KindIP || e.Plan != DefaultAuthFailureRule.Name || !e.Allowed || e.KeyName != "" {
		t.Errorf("failed auth event %+v, want an allowed ip decision of plan %q, no key name", e, DefaultAuthFailureRule.Name)
	}
	if e := pub.events[3]; e.KeyKind != event.KindAPIKey || e.KeyName != "" {
		t.Errorf("unnamed key's event %+v, want an api_key decision without a key name", e)
	}
	pub.events = pub.events[:2]
	e0, e1 := pub.events[0], pub.events[1]
	if e0.ID == e1.ID || e0.KeyID != e1.KeyID || e0.KeyID == "" {
		t.Errorf("ids %x %x, key ids %q %q: want distinct event ids and one key id", e0.ID, e1.ID, e0.KeyID, e1.KeyID)
	}
	for _, e := range pub.events {
		if strings.Contains(e.KeyID, "raw-secret-key") || strings.Contains(e.KeyID, "acme") || strings.Contains(e.KeyID, sha("raw-secret-key")) {
			t.Errorf("KeyID %q reveals the key", e.KeyID)
		}
	}
	want := event.Decision{GatewayID: "gw-7", KeyKind: event.KindAPIKey, ClientIP: "127.0.0.1", UserAgentHash: userAgentHash("test/1"),
		Route: "all", Method: "GET", Plan: "free", BindingRule: "minute", Allowed: false, Limit: 1, Remaining: 0, Cost: 1,
		StoreStatus: event.StoreOK, Mode: event.ModeEnforced, KeyName: "acme"}
	got := e1
	got.ID, got.Time, got.KeyID, got.CheckLatency = [16]byte{}, time.Time{}, "", 0
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("second event (-want +got):\n%s", diff)
	}
}

// TestCanceledClient: a client gone before the decision is neither a store
// failure nor a decision.
func TestCanceledClient(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	gw := startGateway(t, cfg, Options{Store: blockingStore{}})
	st := gw.st.Load()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := gw.decide(ctx, st, limits{key: "ip:x", plan: st.anonymous}, 1)
	if !v.canceled {
		t.Errorf("decide with a canceled context = %+v, want canceled", v)
	}
	if n := counter(t, gw.m.storeUnavailable.WithLabelValues("error")) + counter(t, gw.m.storeUnavailable.WithLabelValues("timeout")); n != 0 {
		t.Errorf("a canceled client counted as a store failure")
	}
}

type blockingStore struct{}

func (blockingStore) Allow(ctx context.Context, _ string, _ []limiter.Rule, _ int64) (limiter.Decision, error) {
	<-ctx.Done()
	return limiter.Decision{}, ctx.Err()
}

// TestReady: the gateway is ready until it drains, whether its store
// answers or not (its failure policy answers); with ready_requires_store,
// only while the store answers (boot.Admin serves it).
func TestReady(t *testing.T) {
	up := newTestUpstream(t)
	down := func(context.Context) error { return context.DeadlineExceeded }
	if err := startGateway(t, testConfig(up.URL), Options{Ping: down}).Ready(context.Background()); err != nil {
		t.Errorf("Ready() with the store down = %v, want ready: its failure policy answers", err)
	}
	cfg := testConfig(up.URL)
	cfg.ReadyRequiresStore = true
	if err := startGateway(t, cfg, Options{Ping: down}).Ready(context.Background()); err == nil {
		t.Errorf("Ready() with the store down and ready_requires_store = nil")
	}
	gw := startGateway(t, testConfig(up.URL), Options{})
	if err := gw.Ready(context.Background()); err != nil {
		t.Errorf("Ready() without a shared store = %v", err)
	}
	gw.Drain()
	if err := gw.Ready(context.Background()); err == nil {
		t.Errorf("Ready() while draining = nil")
	}
}

// switchStore fails every check until it is switched on.
type switchStore struct {
	on    atomic.Bool
	warms atomic.Int64
}

func (s *switchStore) Allow(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	if !s.on.Load() {
		return limiter.Decision{}, errors.New("connection refused")
	}
	return limiter.NewMemory(time.Now, 10).Allow(ctx, key, rules, cost)
}

// TestReadyAfterWarmUp: with a shared store, the gateway is not ready, and
// says why, until WarmUp has warmed the link and made one real check;
// a store that fails keeps it so, and the gRPC door's readiness with it.
func TestReadyAfterWarmUp(t *testing.T) {
	up := newTestUpstream(t)
	store := &switchStore{}
	gw := startGateway(t, testConfig(up.URL), Options{Store: store, Warm: func(context.Context) error {
		store.warms.Add(1)
		return nil
	}})
	if err := gw.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "not tried yet") {
		t.Errorf("Ready() before the warm-up = %v, want an error saying it was not tried", err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.WarmUp(t.Context()) }()
	testenv.WaitFor(t, 30*time.Second, "the warm-up to try the store", func() bool { return store.warms.Load() >= 2 })
	if err := gw.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Ready() while the store fails = %v, want the store's error", err)
	}
	select {
	case <-gw.Warmed():
		t.Fatal("Warmed is closed while the store fails")
	default:
	}
	store.on.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("WarmUp = %v", err)
	}
	if err := gw.Ready(t.Context()); err != nil {
		t.Errorf("Ready() after the warm-up = %v", err)
	}
	<-gw.Warmed()
}

func TestReload(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	gw := startGateway(t, cfg, Options{})
	before := gw.st.Load()

	bad := cfg
	bad.AnonymousPlan = "gold"
	if err := gw.Reload(bad); err == nil {
		t.Fatalf("Reload(invalid) = nil")
	}
	if gw.st.Load() != before || counter(t, gw.m.reloads.WithLabelValues("failed")) != 1 {
		t.Errorf("an invalid reload replaced the config or was not counted")
	}

	next := cfg
	next.Plans = map[string]Plan{"free": {Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 7, Period: time.Minute}}}}}
	if err := gw.Reload(next); err != nil {
		t.Fatalf("Reload(valid) = %v", err)
	}
	if r := get(t, gw.URL+"/"); r.header.Get("X-RateLimit-Limit") != "7" {
		t.Errorf("after reload: limit %q, want 7", r.header.Get("X-RateLimit-Limit"))
	}
	if after := gw.st.Load(); after.routes[0].upstream != before.routes[0].upstream {
		t.Errorf("an unchanged upstream was rebuilt, dropping its connections")
	}
	if counter(t, gw.m.reloads.WithLabelValues("ok")) != 1 {
		t.Errorf("reload not counted")
	}
	if r := do(t, http.MethodConnect, gw.URL+"/", nil); r.status != http.StatusMethodNotAllowed {
		t.Errorf("CONNECT: %d, want 405", r.status)
	}
}

// TestRetryAfterFollowsTheWait: Retry-After is never earlier than the wait
// and its jitter is small relative to it, so a client that honours it is
// not slowed far below its rule (a 0.5s wait used to be told 2-4s).
func TestRetryAfterFollowsTheWait(t *testing.T) {
	tests := []struct {
		wait, maxJitter time.Duration
		lo, hi          int64
	}{
		{0, 3 * time.Second, 1, 1},
		{time.Millisecond, 3 * time.Second, 1, 1},
		{500 * time.Millisecond, 3 * time.Second, 1, 1},
		{time.Second, 3 * time.Second, 1, 2},
		{2 * time.Second, 3 * time.Second, 2, 3},
		{59900 * time.Millisecond, 5 * time.Second, 60, 65},
		{time.Hour, 3 * time.Second, 3600, 3603},
	}
	for _, tt := range tests {
		seen := map[int64]bool{}
		for range 200 {
			got := retryAfter(tt.wait, tt.maxJitter)
			if got < tt.lo || got > tt.hi {
				t.Fatalf("retryAfter(%v, %v) = %d, want %d..%d", tt.wait, tt.maxJitter, got, tt.lo, tt.hi)
			}
			seen[got] = true
		}
		if tt.hi-tt.lo >= 2 && len(seen) < 2 {
			t.Errorf("retryAfter(%v, %v) always %v: no jitter", tt.wait, tt.maxJitter, seen)
		}
	}
}

// TestKeyID: an event's key id is the hex of the first 16 bytes of
// HMAC-SHA256(secret, key), whatever the pooled hashes hashed before.
func TestKeyID(t *testing.T) {
	secret := []byte("s3cret")
	k := newKeyHasher(secret)
	for _, key := range []string{"ip:10.1.2.3", "", "k:" + strings.Repeat("x", 2000), "u:alice", "ip:10.1.2.3"} {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(key))
		want := hex.EncodeToString(mac.Sum(nil)[:16])
		if got := k.id(key); got != want {
			t.Errorf("id(%.20q) = %s, want %s", key, got, want)
		}
	}
}

// encodedPublisher encodes each event as the Kafka publisher does and
// keeps the decoded result, or the encoding error.
type encodedPublisher struct {
	mu     sync.Mutex
	events []event.Decision
	errs   []error
}

func (p *encodedPublisher) Publish(d event.Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := event.Encode(d)
	if err == nil {
		d, err = event.Decode(b)
	}
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	p.events = append(p.events, d)
}

// field is f of every event published, after failing t for any that
// could not be encoded.
func (p *encodedPublisher) field(t *testing.T, f func(event.Decision) string) []string {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) > 0 {
		t.Errorf("events not encodable: %v", p.errs)
	}
	var out []string
	for _, e := range p.events {
		out = append(out, f(e))
	}
	return out
}

// TestEventMethodBounded: whatever method a client sends, its decision's
// event can be encoded (a method over the field limit dropped the event,
// hiding the caller from analytics) and names one of a few methods (each
// new spelling was a row of its own in the per-key rollups).
func TestEventMethodBounded(t *testing.T) {
	cfg := testConfig(newTestUpstream(t).URL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}}}}
	pub := &encodedPublisher{}
	gw := startGateway(t, cfg, Options{Publisher: pub})
	long := strings.Repeat("X", 2*event.MaxFieldLen)
	for _, m := range []string{"get", long, "PROPFIND"} {
		rawDo(t, gw.URL, m+" /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	}
	do(t, http.MethodPost, gw.URL+"/v1/check", strings.NewReader(`{"path":"/a","method":"`+long+`"}`))

	got := pub.field(t, func(e event.Decision) string { return e.Method })
	if want := []string{"GET", "OTHER", "OTHER", "OTHER"}; !slices.Equal(got, want) {
		t.Errorf("event methods %q, want %q", got, want)
	}
}

// TestCheckClientIPCanonical: an address the check API is given names the
// client in its event as proxied traffic names it, and a zone of any
// length leaves the event encodable.
func TestCheckClientIPCanonical(t *testing.T) {
	cfg := testConfig(newTestUpstream(t).URL)
	cfg.TrustedProxies = []string{"127.0.0.1"}
	pub := &encodedPublisher{}
	gw := startGateway(t, cfg, Options{Publisher: pub})
	get(t, gw.URL+"/a", "X-Forwarded-For", "192.0.2.7")
	for _, ip := range []string{"::ffff:192.0.2.7", "2001:DB8:0::1", "fe80::1%" + strings.Repeat("x", 2*event.MaxFieldLen)} {
		if r := do(t, http.MethodPost, gw.URL+"/v1/check", strings.NewReader(`{"ip":"`+ip+`"}`)); r.status != http.StatusOK {
			t.Fatalf("check for ip %.40q = %d %s", ip, r.status, r.body)
		}
	}
	got := pub.field(t, func(e event.Decision) string { return e.ClientIP })
	if want := []string{"192.0.2.7", "192.0.2.7", "2001:db8::1", "fe80::1"}; !slices.Equal(got, want) {
		t.Errorf("event client ips %q, want %q", got, want)
	}
}
