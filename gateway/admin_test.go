package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

const (
	testAdminToken = "oncall-token-0123456789"
	rawAPIKey      = "sk_live_raw-api-key-never-logged"
)

// adminStore is a limiter store the admin API can inspect and reset.
type adminStore interface {
	checker
	keyAdmin
}

// countingStore is a few-line store for the admin API's tests: per key
// and rule, units used in a window that never ends, all-or-nothing.
type countingStore struct {
	mu   sync.Mutex
	used map[string]map[string]int64
}

func newCountingStore() *countingStore { return &countingStore{used: map[string]map[string]int64{}} }

func (s *countingStore) Allow(_ context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used[key] == nil {
		s.used[key] = map[string]int64{}
	}
	d := limiter.Decision{Allowed: true, Time: time.Now()}
	for _, r := range rules {
		left := r.Capacity() - s.used[key][r.Name]
		rr := limiter.RuleResult{Rule: r, Allowed: left >= cost, Remaining: left, ResetAfter: r.Period}
		if !rr.Allowed {
			d.Allowed, rr.RetryAfter = false, r.Period
		}
		d.Rules = append(d.Rules, rr)
	}
	if d.Allowed {
		for i, r := range rules {
			s.used[key][r.Name] += cost
			d.Rules[i].Remaining -= cost
		}
	}
	return d, nil
}

func (s *countingStore) Inspect(_ context.Context, key string, rules []limiter.Rule) (limiter.KeyState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := limiter.KeyState{Key: key}
	for _, r := range rules {
		used, ok := s.used[key][r.Name]
		rs := limiter.RuleState{Rule: r.Name, Algorithm: r.Algorithm, Found: ok, Remaining: r.Capacity() - used}
		if r.Algorithm == limiter.SlidingWindow {
			rs.Count = used
		}
		ks.Rules = append(ks.Rules, rs)
		if ok {
			ks.TTL = r.Period
		}
	}
	return ks, nil
}

func (s *countingStore) Reset(_ context.Context, key string, rules []limiter.Rule) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rules {
		delete(s.used[key], r.Name)
	}
	return nil
}

func (s *countingStore) Clear(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.used, key)
	return nil
}

// adminRig is a started gateway on store with its admin API served the way
// cmd/gateway mounts it, its log and events kept.
type adminRig struct {
	gw    *testGateway
	admin *httptest.Server
	log   *testenv.LogBuffer
	pub   *fakePublisher
}

func adminConfig(upstream string) Config {
	cfg := testConfig(upstream)
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 3, Period: time.Minute}}}}
	cfg.Plans["export"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "export-hour", Limit: 2, Period: time.Hour, Algorithm: limiter.SlidingWindow}}}}
	cfg.APIKeys = []APIKey{{ID: "alice", SHA256: sha(rawAPIKey), Plan: "pro"}}
	cfg.Routes = []Route{
		{Name: "export", PathPrefix: "/export", Upstream: "app", Plan: "export"},
		{Name: "health", PathPrefix: "/healthz", Upstream: "app", Exempt: true},
		{Name: "all", PathPrefix: "/", Upstream: "app"},
	}
	cfg.KeyHashSecret = "hash-secret"
	cfg.GatewayID = "gw-admin"
	return cfg
}

func startAdmin(t *testing.T, store adminStore, tokens map[string]Secret) *adminRig {
	t.Helper()
	opts := Options{}
	if store != nil {
		opts.Store = store
	}
	return startAdminOn(t, adminConfig(newTestUpstream(t).URL), opts, tokens)
}

// startAdminOn is startAdmin with cfg and opts; the rig sets the logger
// and the publisher.
func startAdminOn(t *testing.T, cfg Config, opts Options, tokens map[string]Secret) *adminRig {
	t.Helper()
	rig := &adminRig{log: &testenv.LogBuffer{}, pub: &fakePublisher{}}
	opts.Publisher, opts.Logger = rig.pub, slog.New(slog.NewJSONHandler(rig.log, nil))
	rig.gw = startGateway(t, cfg, opts)
	a, err := NewAdmin(rig.gw.Gateway, AdminConfig{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Register(mux)
	rig.admin = httptest.NewServer(mux)
	t.Cleanup(rig.admin.Close)
	return rig
}

func (r *adminRig) call(t *testing.T, method, query string, hdr ...string) reply {
	t.Helper()
	path := AdminPath
	if method == http.MethodPost {
		path, query, _ = strings.Cut(query, "?")
		path = AdminPath + "/" + path
	}
	return do(t, method, r.admin.URL+path+"?"+query, nil, hdr...)
}

func (r *adminRig) show(t *testing.T, query string) keyView {
	t.Helper()
	resp := r.call(t, http.MethodGet, query, "Authorization", "Bearer "+testAdminToken)
	if resp.status != http.StatusOK {
		t.Fatalf("show %s = %d %s", query, resp.status, resp.body)
	}
	var v keyView
	resp.json(t, &v)
	return v
}

// rulesOf finds the rule set of scope (and route) in v.
func rulesOf(t *testing.T, v keyView, scope, route string) []ruleView {
	t.Helper()
	for _, s := range v.RuleSets {
		if s.Scope == scope && s.Route == route {
			if len(s.Buckets) == 0 || s.Buckets[0].Error != "" {
				t.Fatalf("rule set %s %s: %+v", scope, route, s.Buckets)
			}
			return s.Buckets[0].Rules
		}
	}
	t.Fatalf("no rule set %s %q in %+v", scope, route, v.RuleSets)
	return nil
}

// testAdminEndToEnd: request until denied, show says nothing remains,
// reset, admitted again; clear; every change audited without a secret.
func testAdminEndToEnd(t *testing.T, store adminStore) {
	rig := startAdmin(t, store, map[string]Secret{"oncall": testAdminToken})
	key := []string{"X-API-Key", rawAPIKey}
	if n := admitted(t, rig.gw.URL+"/a", 4, key...); n != 3 {
		t.Fatalf("admitted %d of 4 at 3/min, want 3", n)
	}
	if n := admitted(t, rig.gw.URL+"/export/x", 3, key...); n != 2 {
		t.Fatalf("export admitted %d of 3 at 2/h, want 2", n)
	}
	v := rig.show(t, "api_key=alice")
	if v.KeyID == "" || v.APIKeyID != "alice" || v.Plan != "pro" || v.Kind != "api_key" {
		t.Errorf("show = %+v, want api_key alice, plan pro, a key id", v)
	}
	if r := rulesOf(t, v, "plan", ""); !r[0].Found || r[0].Remaining != 0 || r[0].Limit != 3 {
		t.Errorf("plan rules after 3 of 3: %+v, want found, 0 remaining", r)
	}
	if r := rulesOf(t, v, "route", "export"); !r[0].Found || r[0].Remaining != 0 || r[0].Name != "export-hour" ||
		r[0].Algorithm != "sliding_window" || r[0].Count != 2 {
		t.Errorf("export rules after 2 of 2: %+v, want a sliding window found, count 2, 0 remaining", r)
	}

	// Reset one route's rule set: the other stays spent.
	resp := rig.call(t, http.MethodPost, "reset?api_key=alice&route=export", "Authorization", "Bearer "+testAdminToken)
	if resp.status != http.StatusOK {
		t.Fatalf("reset = %d %s", resp.status, resp.body)
	}
	resp.json(t, &v)
	if r := rulesOf(t, v, "route", "export"); r[0].Remaining != 2 || v.Action != "reset" {
		t.Errorf("export after reset: %+v (action %q), want 2 remaining", r, v.Action)
	}
	if n := admitted(t, rig.gw.URL+"/export/x", 1, key...); n != 1 {
		t.Error("export still denied after its reset")
	}
	if n := admitted(t, rig.gw.URL+"/a", 1, key...); n != 0 {
		t.Error("the plan's rule set was reset with only the export route's asked for")
	}
	// Reset every rule set.
	if resp := rig.call(t, http.MethodPost, "reset?api_key=alice", "Authorization", "Bearer "+testAdminToken); resp.status != http.StatusOK {
		t.Fatalf("reset all = %d %s", resp.status, resp.body)
	}
	if n := admitted(t, rig.gw.URL+"/a", 1, key...); n != 1 {
		t.Error("denied after reset")
	}
	// Clear: nothing stored is left.
	if resp := rig.call(t, http.MethodPost, "clear?api_key=alice", "Authorization", "Bearer "+testAdminToken); resp.status != http.StatusOK {
		t.Fatalf("clear = %d %s", resp.status, resp.body)
	}
	v = rig.show(t, "api_key=alice")
	for _, s := range v.RuleSets {
		for _, r := range s.Buckets[0].Rules {
			if r.Found || r.Remaining != r.Capacity {
				t.Errorf("after clear, %s %s: %+v, want nothing stored, full", s.Scope, s.Route, r)
			}
		}
	}

	// Audited: a log line per change naming the token's name and the key
	// by id, an admin record per rule set changed; no secret anywhere.
	logs := rig.log.String()
	for _, want := range []string{`"msg":"admin key reset"`, `"msg":"admin key clear"`, `"actor":"oncall"`, `"api_key_id":"alice"`, `"key_id":"` + v.KeyID + `"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	for _, secret := range []string{rawAPIKey, testAdminToken} {
		if strings.Contains(logs, secret) {
			t.Errorf("log holds a secret %q", secret)
		}
	}
	rig.pub.mu.Lock()
	defer rig.pub.mu.Unlock()
	var audits []event.Decision
	for _, e := range rig.pub.events {
		if e.Mode == event.ModeAdmin {
			audits = append(audits, e)
		}
		b, err := event.Encode(e)
		if err != nil {
			t.Fatalf("event does not encode: %v", err)
		}
		for _, secret := range []string{rawAPIKey, testAdminToken} {
			if strings.Contains(string(b), secret) {
				t.Errorf("event %+v holds a secret", e)
			}
		}
	}
	// reset export (1) + reset all (2 sets) + clear (2 sets).
	if len(audits) != 5 {
		t.Fatalf("%d admin records, want 5: %+v", len(audits), audits)
	}
	if a := audits[0]; a.Admin != (event.AdminAction{Action: "reset", Actor: "oncall"}) || a.KeyID != v.KeyID ||
		a.Route != "export" || a.Plan != "export" || a.GatewayID != "gw-admin" || a.KeyKind != event.KindAPIKey {
		t.Errorf("first admin record %+v, want reset by oncall of route export, key %s", a, v.KeyID)
	}
	if a := audits[4]; a.Admin.Action != "clear" {
		t.Errorf("last admin record %+v, want a clear", a)
	}
}

// TestAdminEndToEnd runs show, reset and clear on every store: real Redis,
// standalone and Cluster, the gateway's in-memory store, and the fake.
func TestAdminEndToEnd(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		lim, _ := redisStore(t)
		testAdminEndToEnd(t, lim)
	})
	t.Run("cluster", func(t *testing.T) {
		testAdminEndToEnd(t, clusterStore(t))
	})
	t.Run("memory", func(t *testing.T) { testAdminEndToEnd(t, nil) })
	t.Run("fake", func(t *testing.T) { testAdminEndToEnd(t, newCountingStore()) })
}

func TestAdminAuth(t *testing.T) {
	rig := startAdmin(t, newCountingStore(), map[string]Secret{"oncall": testAdminToken, "other": "other-token-0123456789"})
	tests := []struct {
		name   string
		header []string
		want   int
	}{
		{name: "no token", want: http.StatusUnauthorized},
		{name: "basic auth", header: []string{"Authorization", "Basic b25jYWxsOng="}, want: http.StatusUnauthorized},
		{name: "wrong token", header: []string{"Authorization", "Bearer " + testAdminToken + "x"}, want: http.StatusUnauthorized},
		{name: "prefix of a token", header: []string{"Authorization", "Bearer " + testAdminToken[:10]}, want: http.StatusUnauthorized},
		{name: "right token", header: []string{"Authorization", "Bearer " + testAdminToken}, want: http.StatusOK},
		{name: "the other token", header: []string{"Authorization", "bearer other-token-0123456789"}, want: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, m := range []string{http.MethodGet, http.MethodPost} {
				q := "api_key=alice"
				if m == http.MethodPost {
					q = "reset?api_key=alice"
				}
				r := rig.call(t, m, q, tt.header...)
				if r.status != tt.want {
					t.Errorf("%s %s = %d %s, want %d", m, tt.name, r.status, r.body, tt.want)
				}
				if tt.want == http.StatusUnauthorized && r.header.Get("WWW-Authenticate") == "" {
					t.Errorf("%s %s: 401 without WWW-Authenticate", m, tt.name)
				}
			}
		})
	}
	if logs := rig.log.String(); strings.Contains(logs, testAdminToken) {
		t.Errorf("log holds the admin token:\n%s", logs)
	}

	// No token configured: every endpoint says the API is off, and why.
	off := startAdmin(t, newCountingStore(), nil)
	r := off.call(t, http.MethodGet, "api_key=alice", "Authorization", "Bearer "+testAdminToken)
	if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "disabled") || !strings.Contains(string(r.body), "EDGELIMIT_ADMIN_TOKEN") {
		t.Errorf("disabled API = %d %s, want 404 saying it is disabled and how to enable it", r.status, r.body)
	}
	if _, err := NewAdmin(off.gw.Gateway, AdminConfig{Tokens: map[string]Secret{"short": "abc"}}); err == nil {
		t.Error("NewAdmin took a 3-character token")
	}
}

// TestAdminOtherPathsAndMethods: a wrong method on an endpoint, or a path
// under /admin/ that is none, answers in a problem body as the API's
// other errors do, not the mux's text/plain.
func TestAdminOtherPathsAndMethods(t *testing.T) {
	lim, _ := redisStore(t)
	rig := startAdmin(t, lim, map[string]Secret{"oncall": testAdminToken})
	tests := []struct {
		method, path string
		want         int
		wantAllow    string
	}{
		{http.MethodPost, AdminPath, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodDelete, AdminPath, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, AdminPath + "/reset", http.StatusMethodNotAllowed, "POST"},
		{http.MethodPut, AdminPath + "/clear", http.StatusMethodNotAllowed, "POST"},
		{http.MethodGet, AdminPath + "/", http.StatusNotFound, ""},
		{http.MethodPost, AdminPath + "/delete", http.StatusNotFound, ""},
		{http.MethodGet, "/admin/v2/keys", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		r := do(t, tt.method, rig.admin.URL+tt.path+"?api_key=alice", nil, "Authorization", "Bearer "+testAdminToken)
		var p problem
		if ct := r.header.Get("Content-Type"); r.status != tt.want || ct != "application/problem+json" {
			t.Errorf("%s %s = %d %q %s, want %d application/problem+json", tt.method, tt.path, r.status, ct, r.body, tt.want)
			continue
		}
		r.json(t, &p)
		if p.Status != tt.want || p.Type == "" || p.Detail == "" || r.header.Get("Allow") != tt.wantAllow {
			t.Errorf("%s %s: %+v Allow %q, want status %d with a type and detail, Allow %q", tt.method, tt.path, p, r.header.Get("Allow"), tt.want, tt.wantAllow)
		}
	}
	// The endpoints themselves still answer.
	if v := rig.show(t, "api_key=alice"); v.APIKeyID != "alice" {
		t.Errorf("show after the fallback: %+v", v)
	}
}

func TestAdminBadInput(t *testing.T) {
	rig := startAdmin(t, newCountingStore(), map[string]Secret{"oncall": testAdminToken})
	tests := []struct {
		name, query string
		want        int
		detail      string
	}{
		{name: "unknown key id", query: "api_key=nobody", want: http.StatusNotFound, detail: "api_keys[].id"},
		{name: "raw key instead of id", query: "api_key=" + rawAPIKey, want: http.StatusNotFound, detail: "never the key itself"},
		{name: "unknown route", query: "api_key=alice&route=nope", want: http.StatusBadRequest, detail: "nope"},
		{name: "exempt route", query: "api_key=alice&route=health", want: http.StatusBadRequest, detail: "exempt"},
		{name: "no identity", query: "route=all", want: http.StatusBadRequest, detail: "exactly one"},
		{name: "two identities", query: "api_key=alice&ip=10.0.0.1", want: http.StatusBadRequest, detail: "exactly one"},
		{name: "bad ip", query: "ip=10.0.0", want: http.StatusBadRequest, detail: "not an IP"},
		{name: "unknown plan", query: "api_key=alice&plan=nope", want: http.StatusBadRequest, detail: "nope"},
		{name: "route and plan", query: "api_key=alice&plan=pro&route=all", want: http.StatusBadRequest, detail: "not both"},
		{name: "unknown parameter", query: "key=alice", want: http.StatusBadRequest, detail: "Unknown parameter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, q := range []string{tt.query, "reset?" + tt.query, "clear?" + tt.query} {
				m := http.MethodGet
				if q != tt.query {
					m = http.MethodPost
				}
				r := rig.call(t, m, q, "Authorization", "Bearer "+testAdminToken)
				if r.status != tt.want || !strings.Contains(string(r.body), tt.detail) {
					t.Errorf("%s %s = %d %s, want %d naming %s", m, q, r.status, r.body, tt.want, tt.detail)
				}
				if strings.Contains(string(r.body), rawAPIKey) {
					t.Errorf("%s %s: the answer echoes the raw key", m, q)
				}
			}
		})
	}
	if strings.Contains(rig.log.String(), rawAPIKey) {
		t.Error("log holds the raw key")
	}
	// An address lists its own plan and the auth failure bucket.
	v := rig.show(t, "ip=192.0.2.9")
	var scopes []string
	for _, s := range v.RuleSets {
		scopes = append(scopes, s.Scope+":"+s.Route)
	}
	if got := strings.Join(scopes, " "); got != "plan: route:export auth-failure:" {
		t.Errorf("rule sets of an address: %s, want plan, route export, auth-failure", got)
	}
	if v := rig.show(t, "ip=192.0.2.9&plan=pro"); len(v.RuleSets) != 1 || v.RuleSets[0].Scope != "check-plan" || v.RuleSets[0].Plan != "pro" {
		t.Errorf("plan=pro: %+v, want the check API's bucket of plan pro", v.RuleSets)
	}
}

// TestAdminDirectives: show says which split and NAT directives hold for
// the key here, and lists every gateway's bucket under a split; reset
// refills the bucket this gateway checks, so the caller is admitted again.
func TestAdminDirectives(t *testing.T) {
	ctx := context.Background()
	rig := newDirectiveRig(t)
	cfg := adminConfig(newTestUpstream(t).URL)
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 4, Period: time.Minute}}}}
	a := startAdminOn(t, cfg, Options{Store: rig.newStore(t), Directives: rig.watcher}, map[string]Secret{"oncall": testAdminToken})
	keyID := a.show(t, "api_key=alice").KeyID
	exp := time.Now().Add(time.Minute)
	if err := rig.store.WriteSplits(ctx, []limiter.SplitDirective{{Key: limiter.DirectiveKey("api_key", keyID),
		Shares: map[string]float64{"gw-admin": 0.5, "gw-other": 0.5}, Expires: exp}}); err != nil {
		t.Fatal(err)
	}
	if err := rig.store.WriteNATs(ctx, []limiter.NATDirective{{Key: "ip:192.0.2.9", Factor: 3, Clients: 6, Expires: exp}}); err != nil {
		t.Fatal(err)
	}
	rig.watcher.Refresh(ctx)

	key := []string{"X-API-Key", rawAPIKey}
	if n := admitted(t, a.gw.URL+"/a", 3, key...); n != 2 {
		t.Fatalf("admitted %d of 3 under a split giving this gateway 2 of 4, want 2", n)
	}
	v := a.show(t, "api_key=alice&route=all")
	s := v.RuleSets[0]
	if s.Directives.Split == nil || s.Directives.SplitSkipped {
		t.Fatalf("directives %+v, want the split in force", s.Directives)
	}
	var names []string
	for _, b := range s.Buckets {
		names = append(names, b.Bucket)
		if b.InForce != (b.Bucket == "gw:gw-admin") {
			t.Errorf("bucket %s in force: %v", b.Bucket, b.InForce)
		}
		if b.Bucket == "gw:gw-admin" && (b.Rules[0].Limit != 2 || b.Rules[0].Remaining != 0) {
			t.Errorf("this gateway's bucket %+v, want limit 2, 0 remaining", b.Rules[0])
		}
	}
	if got := strings.Join(names, " "); got != "shared gw:gw-admin gw:gw-other" {
		t.Errorf("buckets %s, want shared gw:gw-admin gw:gw-other", got)
	}
	if r := a.call(t, http.MethodPost, "reset?api_key=alice", "Authorization", "Bearer "+testAdminToken); r.status != http.StatusOK {
		t.Fatalf("reset = %d %s", r.status, r.body)
	}
	if n := admitted(t, a.gw.URL+"/a", 1, key...); n != 1 {
		t.Error("denied after reset under a split")
	}

	// NAT: the address's plan shows the raised limit.
	v = a.show(t, "ip=192.0.2.9")
	if s := v.RuleSets[0]; s.Directives.NAT == nil || s.Directives.NAT.Factor != 3 || s.Buckets[0].Rules[0].Limit != 15 {
		t.Errorf("address under a NAT directive: %+v, want factor 3 and the limit raised 5 -> 15", s)
	}
}
