package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/limiter"
)

func TestHeadersAllowedAndDenied(t *testing.T) {
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{
			{Rule: limiter.Rule{Name: "minute", Limit: 3, Period: time.Minute}},
			{Rule: limiter.Rule{Name: "hour", Limit: 100, Period: time.Hour}},
			{Rule: limiter.Rule{Name: "canary", Limit: 1, Period: time.Hour, Shadow: true}},
		}}
	})

	wantRemaining := []string{"2", "1", "0"}
	for i, rem := range wantRemaining {
		r := get(t, gw.URL+"/things")
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, body %s", i, r.status, r.body)
		}
		var s seen
		r.json(t, &s)
		got := map[string]string{
			"X-RateLimit-Limit":     r.header.Get("X-RateLimit-Limit"),
			"X-RateLimit-Remaining": r.header.Get("X-RateLimit-Remaining"),
			"X-RateLimit-Reset":     r.header.Get("X-RateLimit-Reset"),
			"RateLimit-Policy":      r.header.Get("RateLimit-Policy"),
			"RateLimit":             r.header.Get("RateLimit"),
			"path":                  s.Path,
		}
		// Reset: the minute bucket refills one unit per 20s; the hour
		// bucket one per 36s. Shadow rules never show.
		want := map[string]string{
			"X-RateLimit-Limit":     "3",
			"X-RateLimit-Remaining": rem,
			"X-RateLimit-Reset":     strconv.Itoa(20 * (i + 1)),
			"RateLimit-Policy":      `"minute";q=3;w=60, "hour";q=100;w=3600`,
			"RateLimit":             fmt.Sprintf(`"minute";r=%s;t=%d, "hour";r=%d;t=%d`, rem, 20*(i+1), 99-i, 36*(i+1)),
			"path":                  "/things",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("request %d headers (-want +got):\n%s", i, diff)
		}
		if n := len(r.header.Values("X-RateLimit-Limit")); n != 1 {
			t.Errorf("request %d: %d X-RateLimit-Limit headers, want 1 (upstream's must be dropped)", i, n)
		}
	}

	r := get(t, gw.URL+"/things")
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", r.status)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("429 Content-Type = %q", ct)
	}
	if got := r.header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("429 X-RateLimit-Remaining = %q, want 0", got)
	}
	if got := r.header.Get("RateLimit-Policy"); got != `"minute";q=3;w=60, "hour";q=100;w=3600` {
		t.Errorf("429 RateLimit-Policy = %q", got)
	}
	// The minute rule frees one unit within 20s: Retry-After is that,
	// rounded up, plus 1..3 seconds of jitter.
	if ra := r.retryAfter(t); ra < 21 || ra > 23 {
		t.Errorf("Retry-After = %d, want 21..23", ra)
	}
	var p problem
	r.json(t, &p)
	if p.Status != 429 || p.Type != probRateLimited || len(p.Violated) != 1 || p.Violated[0].Name != "minute" {
		t.Errorf("problem = %+v, want 429 naming rule minute", p)
	}

	// Shadow decisions are counted; denials are not logged (no logger
	// output is asserted elsewhere), and no key or IP is a label.
	metrics := scrape(t, gw)
	for _, want := range []string{
		`edgelimit_gateway_decisions_total{mode="shadow",result="allowed",rule="minute"} 2`,
		`edgelimit_gateway_decisions_total{mode="enforced",result="denied",rule="minute"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, "127.0.0.1") {
		t.Errorf("metrics hold a client IP")
	}
}

// TestRetryAfterNeverEarly waits out a denial: the request must be allowed
// no later than Retry-After said.
func TestRetryAfterNeverEarly(t *testing.T) {
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "second", Limit: 2, Period: time.Second}}}}
		cfg.RetryJitter = time.Second
	})

	for range 2 {
		if r := get(t, gw.URL+"/"); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
	}
	denied := get(t, gw.URL+"/")
	deniedAt := time.Now()
	if denied.status != http.StatusTooManyRequests {
		t.Fatalf("3rd request: status %d, want 429", denied.status)
	}
	ra := time.Duration(denied.retryAfter(t)) * time.Second
	// Poll until allowed; every denial before that must lie within the
	// Retry-After window, or the header told the client to come back early.
	var lastDenied time.Time
	for {
		sent := time.Now()
		r := get(t, gw.URL+"/")
		if r.status == http.StatusOK {
			break
		}
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("status %d", r.status)
		}
		lastDenied = sent
		if sent.Sub(deniedAt) > ra+5*time.Second {
			t.Fatalf("still denied %v after a Retry-After of %v", sent.Sub(deniedAt), ra)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if !lastDenied.IsZero() && lastDenied.Sub(deniedAt) >= ra {
		t.Errorf("denied %v after a Retry-After of %v", lastDenied.Sub(deniedAt), ra)
	}

	// The decision API reports the exact wait: Retry-After always exceeds it.
	for range 20 {
		r := do(t, http.MethodPost, gw.URL+"/v1/check", strings.NewReader(`{}`))
		if r.status != http.StatusTooManyRequests {
			continue
		}
		var cr checkResponse
		r.json(t, &cr)
		if ms := r.retryAfter(t) * 1000; ms <= cr.RetryAfterMS {
			t.Errorf("Retry-After %dms not after the exact wait %dms", ms, cr.RetryAfterMS)
		}
	}
}

func TestJitterSpreadsClients(t *testing.T) {
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1, Period: time.Minute}}}}
		cfg.TrustedProxies = []string{"127.0.0.1"}
		cfg.RetryJitter = 5 * time.Second
	})

	values := map[int64]int{}
	for i := range 30 {
		ip := fmt.Sprintf("203.0.113.%d", i+1)
		if r := get(t, gw.URL+"/", "X-Forwarded-For", ip); r.status != http.StatusOK {
			t.Fatalf("client %s: first request status %d", ip, r.status)
		}
		r := get(t, gw.URL+"/", "X-Forwarded-For", ip)
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("client %s: second request status %d, want 429", ip, r.status)
		}
		ra := r.retryAfter(t)
		// The wait is just under 60s, plus under 5 seconds of jitter.
		if ra < 60 || ra > 65 {
			t.Errorf("client %s: Retry-After %d, want 60..65", ip, ra)
		}
		values[ra]++
	}
	if len(values) < 3 {
		t.Errorf("30 clients got only %d distinct Retry-After values: %v", len(values), values)
	}
}

func TestForwardedFor(t *testing.T) {
	lim, _ := redisStore(t)
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 3, Period: time.Minute}}}}
	cfg.UserHeader = "X-User-ID"

	t.Run("untrusted peer", func(t *testing.T) {
		gw := startGateway(t, cfg, Options{Store: lim})
		for i := range 3 {
			r := get(t, gw.URL+"/", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1), "X-User-ID", "alice")
			if r.status != http.StatusOK {
				t.Fatalf("request %d: status %d", i, r.status)
			}
			var s seen
			r.json(t, &s)
			if s.XFF != "127.0.0.1" || s.User != "" {
				t.Errorf("upstream saw XFF %q user %q, want the peer only and no user", s.XFF, s.User)
			}
		}
		// A fourth address and another user id change nothing: the bucket
		// is the peer's.
		r := get(t, gw.URL+"/", "X-Forwarded-For", "198.51.100.99", "X-User-ID", "bob")
		if r.status != http.StatusTooManyRequests {
			t.Errorf("spoofed X-Forwarded-For from an untrusted peer: status %d, want 429", r.status)
		}
	})

	t.Run("trusted proxy", func(t *testing.T) {
		cfg := cfg
		cfg.TrustedProxies = []string{"127.0.0.0/8"}
		gw := startGateway(t, cfg, Options{Store: lim})
		for i := range 5 {
			r := get(t, gw.URL+"/", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
			if r.status != http.StatusOK {
				t.Fatalf("client %d: status %d, want 200 (own bucket)", i, r.status)
			}
			var s seen
			r.json(t, &s)
			if want := fmt.Sprintf("192.0.2.%d, 127.0.0.1", i+1); s.XFF != want {
				t.Errorf("upstream saw XFF %q, want %q", s.XFF, want)
			}
		}
		for i := range 4 {
			r := get(t, gw.URL+"/", "X-Forwarded-For", "192.0.2.200")
			if want := i < 3; (r.status == http.StatusOK) != want {
				t.Errorf("same client, request %d: status %d", i, r.status)
			}
		}
		// IPv6 clients share their /64.
		for i := range 4 {
			r := get(t, gw.URL+"/", "X-Forwarded-For", fmt.Sprintf("2001:db8:1:2::%x", i+1))
			if want := i < 3; (r.status == http.StatusOK) != want {
				t.Errorf("IPv6 /64, request %d: status %d", i, r.status)
			}
		}
		if r := get(t, gw.URL+"/", "X-Forwarded-For", "2001:db8:1:3::1"); r.status != http.StatusOK {
			t.Errorf("another /64: status %d, want 200", r.status)
		}
		// A user id from a trusted proxy is the identity.
		for i := range 4 {
			r := get(t, gw.URL+"/", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", 100+i), "X-User-ID", "carol")
			if want := i < 3; (r.status == http.StatusOK) != want {
				t.Errorf("user carol, request %d: status %d", i, r.status)
			}
		}
	})
}

func TestAPIKeys(t *testing.T) {
	lim, _ := redisStore(t)
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 50, Period: time.Minute}}}}
	cfg.APIKeys = []APIKey{
		{ID: "acme", SHA256: sha("secret-acme"), Plan: "pro"},
		{SHA256: sha("secret-big"), Plan: "pro", Overrides: map[string]Override{"minute": {Limit: 500}}},
	}
	gw := startGateway(t, cfg, Options{Store: lim})

	tests := []struct {
		name       string
		hdr        []string
		wantStatus int
		wantLimit  string
	}{
		{"X-API-Key", []string{"X-API-Key", "secret-acme"}, 200, "50"},
		{"bearer", []string{"Authorization", "Bearer secret-acme"}, 200, "50"},
		{"override", []string{"X-API-Key", "secret-big"}, 200, "500"},
		{"anonymous", nil, 200, "5"},
		// Failed authentication is limited by address first (issue 9):
		// its headers are the auth failure plan's.
		{"unknown key", []string{"X-API-Key", "nope"}, 401, "20"},
		{"unknown bearer", []string{"Authorization", "Bearer nope"}, 401, "20"},
		{"basic auth is not a key", []string{"Authorization", "Basic dXNlcjpwYXNz"}, 200, "5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := get(t, gw.URL+"/", tt.hdr...)
			if r.status != tt.wantStatus || r.header.Get("X-RateLimit-Limit") != tt.wantLimit {
				t.Errorf("GET with %v = %d limit %q, want %d limit %q (%s)", tt.hdr, r.status, r.header.Get("X-RateLimit-Limit"), tt.wantStatus, tt.wantLimit, r.body)
			}
		})
	}

	cfg.UnknownKey = UnknownKeyAnonymous
	anon := startGateway(t, cfg, Options{Store: lim})
	if r := get(t, anon.URL+"/", "X-API-Key", "nope"); r.status != 200 || r.header.Get("X-RateLimit-Limit") != "5" {
		t.Errorf("unknown key as anonymous: %d limit %q, want 200 limit 5", r.status, r.header.Get("X-RateLimit-Limit"))
	}
}

// TestOneAPIKey: a request is charged to the key its upstream will read,
// however it spells or repeats the header or the query parameter that
// carries it; two different keys anywhere in the request are refused
// rather than charged to one and served as the other. Before the query
// was read, a key there was charged to the client's address (or, beside
// a header key, to the header's) while the upstream served it.
func TestOneAPIKey(t *testing.T) {
	lim, _ := redisStore(t)
	up := newPathUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 30, Period: time.Minute}}}}
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 50, Period: time.Minute}}}}
	cfg.Plans["gold"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 70, Period: time.Minute}}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("secret-acme"), Plan: "pro"}, {ID: "other", SHA256: sha("secret-other"), Plan: "gold"}}
	gw := startGateway(t, cfg, Options{Store: lim})
	with := func(edit func(*Config)) string {
		c := cfg
		edit(&c)
		return startGateway(t, c, Options{Store: lim}).URL
	}
	noBearer := with(func(c *Config) { c.IgnoreBearer = true })
	noParams := with(func(c *Config) { c.APIKeyParams = []string{"-"} })
	custom := with(func(c *Config) { c.APIKeyParams = []string{"token"} })
	unknownAnonymous := with(func(c *Config) { c.UnknownKey = UnknownKeyAnonymous })

	tests := []struct {
		name       string
		url        string
		query      string
		give       string // header lines
		wantStatus int
		wantLimit  string
	}{
		{"empty first field", gw.URL, "", "X-API-Key:\r\nX-API-Key: secret-acme\r\n", 200, "50"},
		{"underscore spelling", gw.URL, "", "X_API_KEY: secret-acme\r\n", 200, "50"},
		{"same key twice", gw.URL, "", "X-API-Key: secret-acme\r\nAuthorization: Bearer secret-acme\r\n", 200, "50"},
		{"two fields", gw.URL, "", "X-API-Key: secret-acme\r\nX-API-Key: secret-other\r\n", 400, ""},
		{"two keys in one field", gw.URL, "", "X-API-Key: secret-acme, secret-other\r\n", 400, ""},
		{"two keys in one field, unknown keys anonymous", unknownAnonymous, "", "X-API-Key: secret-acme, secret-other\r\n", 400, ""},
		{"one key and a comma", gw.URL, "", "X-API-Key: secret-acme,\r\n", 200, "50"},
		{"header and underscore twin", gw.URL, "", "X-API-Key: secret-acme\r\nX_Api_Key: secret-other\r\n", 400, ""},
		{"header and bearer", gw.URL, "", "X-API-Key: secret-acme\r\nAuthorization: Bearer secret-other\r\n", 400, ""},
		// Python's split() (Flask-HTTPAuth, Django REST framework) and Go's
		// strings.Fields end the scheme at any of these; as no key, these
		// were charged to the address and served as the key.
		{"bearer after a tab", gw.URL, "", "Authorization: Bearer\tsecret-acme\r\n", 200, "50"},
		{"bearer after latin-1 nbsp", gw.URL, "", "Authorization: bearer\xa0secret-acme\r\n", 200, "50"},
		{"bearer after latin-1 nel", gw.URL, "", "Authorization: Bearer\x85secret-acme\r\n", 200, "50"},
		{"bearer after utf-8 nbsp", gw.URL, "", "Authorization: Bearer\u00a0secret-acme\r\n", 200, "50"},
		{"bearer tab twin of a header key", gw.URL, "", "X-API-Key: secret-acme\r\nAuthorization: Bearer\tsecret-other\r\n", 400, ""},
		{"another scheme", gw.URL, "", "Authorization: Bearerx secret-acme\r\n", 200, "30"},
		// Python's strip() trims these bytes too.
		{"key ending in latin-1 nbsp", gw.URL, "", "X-API-Key: secret-acme\xa0\r\n", 200, "50"},
		{"bearer ending in latin-1 nel", gw.URL, "", "Authorization: Bearer secret-acme\x85\r\n", 200, "50"},
		{"unknown second key", gw.URL, "", "X-API-Key: secret-acme\r\nX-API-Key: nope\r\n", 400, ""},
		{"query api_key", gw.URL, "api_key=secret-acme", "", 200, "50"},
		{"query apikey among others", gw.URL, "q=1&apikey=secret-acme&x=y", "", 200, "50"},
		{"query upper case", gw.URL, "API_KEY=secret-acme", "", 200, "50"},
		{"query escaped name", gw.URL, "api%5Fkey=secret-acme", "", 200, "50"},
		{"query php dot", gw.URL, "api.key=secret-acme", "", 200, "50"},
		{"query php array", gw.URL, "api_key[]=secret-acme", "", 200, "50"},
		{"query php leading spaces", gw.URL, "+%20api_key=secret-acme", "", 200, "50"},
		{"query php nul", gw.URL, "api_key%00x=secret-acme", "", 200, "50"},
		{"query rack 2 brackets", gw.URL, "[api_key]=secret-acme", "", 200, "50"},
		{"query asp.net %u escape", gw.URL, "%u0061pi_key=secret-acme", "", 200, "50"},
		{"query php nul beside a bad escape", gw.URL, "api_key%00%zz=secret-acme", "", 200, "50"},
		{"query semicolon separator", gw.URL, "q=1;api_key=secret-acme", "", 200, "50"},
		{"query escaped value", gw.URL, "api_key=secret%2Dacme", "", 200, "50"},
		{"query access_token", gw.URL, "access_token=secret-other", "", 200, "70"},
		{"same key in header and query", gw.URL, "api_key=secret-acme", "X-API-Key: secret-acme\r\n", 200, "50"},
		{"header and another query key", gw.URL, "api_key=secret-other", "X-API-Key: secret-acme\r\n", 400, ""},
		{"two query keys", gw.URL, "api_key=secret-acme&apikey=secret-other", "", 400, ""},
		{"repeated parameter", gw.URL, "api_key=secret-acme&api_key=secret-other", "", 400, ""},
		{"unknown query key", gw.URL, "api_key=nope", "", 401, ""},
		{"empty parameter", gw.URL, "api_key=", "", 200, "30"},
		{"other parameter", gw.URL, "key_api=secret-acme", "", 200, "30"},
		{"access_token with bearers ignored", noBearer, "access_token=secret-other", "", 200, "30"},
		{"api_key with bearers ignored", noBearer, "api_key=secret-other", "", 200, "70"},
		{"no parameters configured", noParams, "api_key=secret-acme", "", 200, "30"},
		{"access_token without parameters", noParams, "access_token=secret-acme", "", 200, "50"},
		{"custom parameter", custom, "Token=secret-acme", "", 200, "50"},
		{"default parameter not configured", custom, "api_key=secret-acme", "", 200, "30"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rawDo(t, tt.url, "GET /x?"+tt.query+" HTTP/1.1\r\nHost: gw\r\n"+tt.give+"Connection: close\r\n\r\n")
			// Only an allowed request's limit names whom it was charged to.
			if r.status != tt.wantStatus || (tt.wantStatus == 200 && r.header.Get("X-RateLimit-Limit") != tt.wantLimit) {
				t.Errorf("GET /x?%s with %q = %d limit %q, want %d limit %q (%s)", tt.query, tt.give, r.status, r.header.Get("X-RateLimit-Limit"), tt.wantStatus, tt.wantLimit, r.body)
			}
			if seen := up.take(); tt.wantStatus != 200 && len(seen) != 0 {
				t.Errorf("GET /x?%s with %q: upstream received %q, want nothing", tt.query, tt.give, seen)
			}
		})
	}
}

func TestRoutesAndCost(t *testing.T) {
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 10, Period: time.Minute}}}}
		cfg.Plans["search"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "search", Limit: 2, Period: time.Minute}}}}
		cfg.Routes = []Route{
			{Name: "all", PathPrefix: "/", Upstream: "app"},
			{Name: "export", PathPrefix: "/v1/export", Methods: []string{"POST"}, Upstream: "app", Cost: 4},
			{Name: "huge", PathPrefix: "/v1/huge", Upstream: "app", Cost: 11},
			{Name: "report", PathPrefix: "/v1/report", Methods: []string{"GET"}, Upstream: "app", Cost: 2},
			{Name: "search", PathPrefix: "/v1/search", Upstream: "app", Plan: "search"},
			{Name: "health", PathPrefix: "/healthz", Upstream: "app", Exempt: true},
		}
	})

	// An exempt route is proxied without a check: no headers, no cost.
	for range 3 {
		if r := get(t, gw.URL+"/healthz"); r.status != 200 || r.header.Get("RateLimit-Policy") != "" {
			t.Errorf("exempt route: %d policy %q, want 200 and no rate-limit headers", r.status, r.header.Get("RateLimit-Policy"))
		}
	}

	// POST /v1/export costs 4 of the 10.
	if r := do(t, http.MethodPost, gw.URL+"/v1/export/x", nil); r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "6" {
		t.Errorf("POST export: %d remaining %q, want 200 and 6", r.status, r.header.Get("X-RateLimit-Remaining"))
	}
	// GET /v1/export falls to the catch-all, costing 1.
	if r := get(t, gw.URL+"/v1/export/x"); r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "5" {
		t.Errorf("GET export: %d remaining %q, want 200 and 5", r.status, r.header.Get("X-RateLimit-Remaining"))
	}
	// The search route has its own plan and bucket.
	for i := range 3 {
		r := get(t, gw.URL+"/v1/search?q=x")
		if want := i < 2; (r.status == 200) != want || r.header.Get("X-RateLimit-Limit") != "2" {
			t.Errorf("search %d: %d limit %q", i, r.status, r.header.Get("X-RateLimit-Limit"))
		}
	}
	if r := get(t, gw.URL+"/other"); r.header.Get("X-RateLimit-Remaining") != "4" {
		t.Errorf("search must not use the caller's plan bucket: remaining %q, want 4", r.header.Get("X-RateLimit-Remaining"))
	}
	// A cost above every rule's capacity: 429, no Retry-After, an
	// explanation, and nothing consumed.
	r := get(t, gw.URL+"/v1/huge")
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "" {
		t.Errorf("huge: status %d Retry-After %q, want 429 without Retry-After", r.status, r.header.Get("Retry-After"))
	}
	var p problem
	r.json(t, &p)
	if p.Type != probOverCapacity || !strings.Contains(p.Detail, "capacity 10") || !strings.Contains(p.Detail, "will not help") {
		t.Errorf("huge: problem %+v", p)
	}
	if r := get(t, gw.URL+"/other"); r.header.Get("X-RateLimit-Remaining") != "3" {
		t.Errorf("after huge: remaining %q, want 3", r.header.Get("X-RateLimit-Remaining"))
	}
	// A method echo does not know is still proxied.
	if r := do(t, "PURGE", gw.URL+"/cache", nil); r.status != 200 {
		t.Errorf("PURGE: status %d, want 200", r.status)
	}
	// A HEAD is charged as the GET upstream routers run it as (2 of the
	// 2 left), not as the catch-all's 1.
	if r := do(t, http.MethodHead, gw.URL+"/v1/report/x", nil); r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("HEAD report: %d remaining %q, want 200 and 0", r.status, r.header.Get("X-RateLimit-Remaining"))
	}
}

func TestUpstreamFailures(t *testing.T) {
	lim, _ := redisStore(t)
	up := newTestUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	cfg := testConfig(up.URL)
	cfg.Upstreams["down"] = Upstream{URL: closed}
	cfg.Upstreams["slow"] = Upstream{URL: up.URL, Timeout: 200 * time.Millisecond}
	cfg.Routes = append(cfg.Routes,
		Route{Name: "down", PathPrefix: "/down", Upstream: "down"},
		Route{Name: "slow", PathPrefix: "/hang", Upstream: "slow"},
	)
	gw := startGateway(t, cfg, Options{Store: lim})

	for _, tt := range []struct {
		path   string
		status int
		typ    string
	}{
		{"/down", http.StatusBadGateway, probUpstreamDown},
		{"/hang", http.StatusGatewayTimeout, probUpstreamSlow},
	} {
		r := get(t, gw.URL+tt.path)
		var p problem
		r.json(t, &p)
		if r.status != tt.status || p.Type != tt.typ || p.Upstream == "" {
			t.Errorf("GET %s = %d %+v, want %d %s", tt.path, r.status, p, tt.status, tt.typ)
		}
		if r.header.Get("X-RateLimit-Limit") == "" || r.header.Get("RateLimit-Policy") == "" {
			t.Errorf("GET %s: no rate-limit headers on the %d", tt.path, r.status)
		}
	}
	m := scrape(t, gw)
	for _, want := range []string{
		`edgelimit_gateway_upstream_errors_total{kind="unreachable",route="down"} 1`,
		`edgelimit_gateway_upstream_errors_total{kind="timeout",route="slow"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestAbuse(t *testing.T) {
	gw := redisGateway(t, func(cfg *Config) {
		cfg.MaxHeaderBytes = 4 << 10
		cfg.MaxBodyBytes = 1 << 20
		cfg.Timeouts.ReadHeader = 300 * time.Millisecond
		cfg.Timeouts.Read = 500 * time.Millisecond
		cfg.APIKeys = []APIKey{{ID: "k", SHA256: sha("k"), Plan: "free"}}
	})

	t.Run("unknown key", func(t *testing.T) {
		r := get(t, gw.URL+"/", "X-API-Key", "wrong")
		var p problem
		r.json(t, &p)
		if r.status != http.StatusUnauthorized || p.Type != probUnknownKey {
			t.Errorf("unknown key: %d %+v, want 401", r.status, p)
		}
	})
	t.Run("huge header", func(t *testing.T) {
		r := get(t, gw.URL+"/", "X-Junk", strings.Repeat("a", 64<<10))
		if r.status != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("huge header: status %d, want 431", r.status)
		}
	})
	t.Run("huge body with length", func(t *testing.T) {
		before := get(t, gw.URL+"/", "X-API-Key", "k").header.Get("X-RateLimit-Remaining")
		r := do(t, http.MethodPost, gw.URL+"/", bytes.NewReader(make([]byte, 2<<20)), "X-API-Key", "k")
		if r.status != http.StatusRequestEntityTooLarge {
			t.Errorf("huge body: status %d, want 413", r.status)
		}
		after := get(t, gw.URL+"/", "X-API-Key", "k").header.Get("X-RateLimit-Remaining")
		if b, _ := strconv.Atoi(before); strconv.Itoa(b-1) != after {
			t.Errorf("a refused body consumed budget: remaining %s then %s", before, after)
		}
	})
	t.Run("huge chunked body", func(t *testing.T) {
		body := io.MultiReader(bytes.NewReader(make([]byte, 2<<20))) // no length: chunked
		r := do(t, http.MethodPost, gw.URL+"/", body)
		if r.status != http.StatusRequestEntityTooLarge {
			t.Errorf("huge chunked body: status %d, want 413 (%s)", r.status, r.body)
		}
	})
	t.Run("body within limit", func(t *testing.T) {
		r := do(t, http.MethodPost, gw.URL+"/", bytes.NewReader(make([]byte, 1000)), "X-API-Key", "k")
		var s seen
		r.json(t, &s)
		if r.status != http.StatusOK || s.Body != 1000 {
			t.Errorf("small body: %d, upstream read %d bytes", r.status, s.Body)
		}
	})
	t.Run("slow headers", func(t *testing.T) {
		_, br := rawConn(t, gw.URL, "GET / HTTP/1.1\r\nHost: x\r\n") // and never the blank line
		resp, err := http.ReadResponse(br, nil)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the gateway kept a slow client's connection open")
		}
		if err == nil && resp.StatusCode < 400 {
			t.Errorf("slow headers answered %d", resp.StatusCode)
		}
	})
	t.Run("slow body", func(t *testing.T) {
		_, br := rawConn(t, gw.URL, "POST / HTTP/1.1\r\nHost: x\r\nX-API-Key: k\r\nContent-Length: 100\r\n\r\nhalf")
		resp, err := http.ReadResponse(br, nil)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the gateway kept a slow body's connection open")
		}
		if err == nil && resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("slow body answered %d, want 408", resp.StatusCode)
		}
	})
	// Still serving.
	if r := get(t, gw.URL+"/"); r.status != http.StatusOK {
		t.Errorf("after abuse: status %d", r.status)
	}
}

func TestCheckAPI(t *testing.T) {
	lim, _ := redisStore(t)
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 2, Period: time.Minute}}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("secret-acme"), Plan: "pro"}}
	cfg.Routes = append(cfg.Routes, Route{Name: "export", PathPrefix: "/export", Upstream: "app", Cost: 2})
	gw := startGateway(t, cfg, Options{Store: lim})

	post := func(body string) (reply, checkResponse) {
		t.Helper()
		r := do(t, http.MethodPost, gw.URL+"/v1/check", strings.NewReader(body), "Content-Type", "application/json")
		var cr checkResponse
		if r.status == 200 || r.status == 429 {
			r.json(t, &cr)
		}
		return r, cr
	}
	r, cr := post(`{"key":"secret-acme"}`)
	if r.status != 200 || !cr.Allowed || cr.KeyKind != "api_key" || cr.Plan != "pro" || r.header.Get("X-RateLimit-Remaining") != "1" || r.header.Get("RateLimit-Policy") != `"minute";q=2;w=60` {
		t.Errorf("first check: %d %+v headers %v", r.status, cr, r.header)
	}
	r, cr = post(`{"key":"secret-acme","method":"GET","path":"/export/all"}`)
	if r.status != 429 || cr.Allowed || cr.Route != "export" || cr.Cost != 2 || cr.RetryAfterMS <= 0 || r.header.Get("Retry-After") == "" || cr.Problem == nil || cr.Problem.Title != "Too Many Requests" {
		t.Errorf("route check over the limit: %d %+v", r.status, cr)
	}
	if r, _ := post(`{"key":"nope"}`); r.status != 401 {
		t.Errorf("unknown key: %d, want 401", r.status)
	}
	if r, _ := post(`{"ip":"192.0.2.1"}`); r.status != 403 {
		t.Errorf("ip from an untrusted peer: %d, want 403", r.status)
	}
	if r, _ := post(`{"key":`); r.status != 400 {
		t.Errorf("bad JSON: %d, want 400", r.status)
	}
	if r, _ := post(`{"cost":1}`); r.status != 200 {
		t.Errorf("the caller itself (anonymous): %d, want 200", r.status)
	}

	cfg.TrustedProxies = []string{"127.0.0.1"}
	trusted := startGateway(t, cfg, Options{Store: lim})
	r = do(t, http.MethodPost, trusted.URL+"/v1/check", strings.NewReader(`{"ip":"2001:db8::1","plan":"pro","cost":2}`))
	r.json(t, &cr)
	if r.status != 200 || cr.KeyKind != "ip" || cr.Plan != "pro" || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("trusted check for an ip and plan: %d %+v", r.status, cr)
	}
}

func TestNoRoute(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Routes = []Route{{Name: "api", PathPrefix: "/api", Upstream: "app"}}
	gw := startGateway(t, cfg, Options{}) // in-memory store
	if r := get(t, gw.URL+"/elsewhere"); r.status != http.StatusNotFound {
		t.Errorf("no route: %d, want 404", r.status)
	}
	if r := get(t, gw.URL+"/api/x"); r.status != http.StatusOK || r.header.Get("X-RateLimit-Limit") != "5" {
		t.Errorf("in-memory store: %d limit %q", r.status, r.header.Get("X-RateLimit-Limit"))
	}
	// "/api/../elsewhere" is "/elsewhere".
	req, _ := http.NewRequest(http.MethodGet, gw.URL+"/api/x", nil)
	req.URL.Path = "/api/../elsewhere"
	req.URL.RawPath = "/api/../elsewhere"
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("dot-dot path: %d, want 404", resp.StatusCode)
	}
}

// TestRedisCluster runs the gateway on the Redis Cluster: all rules of a key
// share one slot, so one script call checks them.
func TestRedisCluster(t *testing.T) {
	lim := clusterStore(t)
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.TrustedProxies = []string{"127.0.0.1"}
	cfg.Plans["free"] = Plan{Rules: []Rule{
		{Rule: limiter.Rule{Name: "minute", Limit: 2, Period: time.Minute}},
		{Rule: limiter.Rule{Name: "hour", Limit: 100, Period: time.Hour}},
		{Rule: limiter.Rule{Name: "day", Limit: 1000, Period: 24 * time.Hour, Algorithm: "sliding_window"}},
	}}
	gw := startGateway(t, cfg, Options{Store: lim})
	for c := range 20 { // clients spread over the cluster's slots
		ip := fmt.Sprintf("198.18.0.%d", c+1)
		for i := range 3 {
			r := get(t, gw.URL+"/", "X-Forwarded-For", ip)
			if want := i < 2; (r.status == http.StatusOK) != want {
				t.Fatalf("client %s request %d: status %d (%s)", ip, i, r.status, r.body)
			}
		}
	}
	if n := counter(t, gw.m.failOpen); n != 0 {
		t.Errorf("%v requests failed open on the cluster", n)
	}
}

// TestTraceRefused: TRACE (and IIS's TRACK, in any case) gets 405 with
// Allow and a problem body, charged like the other refusals before a
// decision, unless the route lists it; the upstream never sees it.
// Before, it was proxied on every route that takes any method.
func TestTraceRefused(t *testing.T) {
	up := newPathUpstream(t)
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Routes = []Route{
			{Name: "all", PathPrefix: "/", Upstream: "app"},
			{Name: "health", PathPrefix: "/health", Upstream: "app", Exempt: true},
			{Name: "debug", PathPrefix: "/debug", Methods: []string{"GET", "TRACE"}, Upstream: "app"},
		}
	})
	tests := []struct {
		method, path string
		want         int
	}{
		{"TRACE", "/v1/items", http.StatusMethodNotAllowed},
		{"trace", "/v1/items", http.StatusMethodNotAllowed},
		{"TRACK", "/v1/items", http.StatusMethodNotAllowed},
		{"TRACE", "/health", http.StatusMethodNotAllowed},
		{"TRACE", "/debug/x", http.StatusOK},
		{"GET", "/v1/items", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			up.takeRequests()
			rejected := counter(t, gw.m.rejected.WithLabelValues("method_not_allowed"))
			r := rawDo(t, gw.URL, tt.method+" "+tt.path+" HTTP/1.1\r\nHost: gw\r\nCookie: session=secret\r\nConnection: close\r\n\r\n")
			if r.status != tt.want {
				t.Fatalf("%s %s = %d (%s), want %d", tt.method, tt.path, r.status, r.body, tt.want)
			}
			got := up.takeRequests()
			if tt.want == http.StatusOK {
				if len(got) != 1 || got[0].method != tt.method {
					t.Errorf("%s %s: the upstream received %v, want the request", tt.method, tt.path, got)
				}
				return
			}
			if len(got) != 0 {
				t.Errorf("%s %s: the upstream received %d requests, want none", tt.method, tt.path, len(got))
			}
			if !bytes.Contains(r.body, []byte("method-not-allowed")) || r.header.Get("Allow") == "" || r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s %s answer %s (Allow %q), want a method-not-allowed problem and Allow", tt.method, tt.path, r.body, r.header.Get("Allow"))
			}
			if r.header.Get(hLimit) == "" {
				t.Errorf("%s %s: refusal without rate-limit headers (%v), want the auth failure bucket's", tt.method, tt.path, r.header)
			}
			if n := counter(t, gw.m.rejected.WithLabelValues("method_not_allowed")) - rejected; n != 1 {
				t.Errorf("rejected_total{reason=\"method_not_allowed\"} rose by %v, want 1", n)
			}
		})
	}
}
