package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// authConfig needs an API key everywhere and limits failed
// authentication to 3 a minute per address.
func authConfig(upstreamURL string) Config {
	cfg := testConfig(upstreamURL)
	cfg.AnonymousPlan = ""
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("good-key"), Plan: "free"}}
	cfg.Plans["guess"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "guess", Limit: 3, Period: time.Minute}}}}
	cfg.AuthFailurePlan = "guess"
	cfg.TrustedProxies = []string{"127.0.0.1"}
	return cfg
}

// TestAuthFailureLimited: guessing keys costs like any request: past the
// auth failure plan an address gets 429, not another 401, and every
// attempt is a decision with rate-limit headers.
func TestAuthFailureLimited(t *testing.T) {
	up := newTestUpstream(t)
	gw := startGateway(t, authConfig(up.URL), Options{})
	const client = "192.0.2.1"
	for i := range 3 {
		r := get(t, gw.URL+"/a", "X-API-Key", "guess-"+string(rune('a'+i)), "X-Forwarded-For", client)
		if r.status != http.StatusUnauthorized || r.header.Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("guess %d = %d (X-RateLimit-Limit %q), want 401 with limit 3", i, r.status, r.header.Get("X-RateLimit-Limit"))
		}
	}
	for _, hdr := range [][]string{{"X-API-Key", "guess-z"}, {"Authorization", "Bearer guess-y"}, {}} {
		r := get(t, gw.URL+"/a", append(hdr, "X-Forwarded-For", client)...)
		if r.status != http.StatusTooManyRequests || r.retryAfter(t) < 1 {
			t.Fatalf("over the limit with %q = %d %s, want 429 with Retry-After", hdr, r.status, r.body)
		}
	}
	// Another address still gets its 401; a good key is not held back.
	if r := get(t, gw.URL+"/a", "X-API-Key", "guess", "X-Forwarded-For", "192.0.2.2"); r.status != http.StatusUnauthorized {
		t.Errorf("other address = %d, want 401", r.status)
	}
	if r := get(t, gw.URL+"/a", "X-API-Key", "good-key", "X-Forwarded-For", client); r.status != http.StatusOK {
		t.Errorf("good key from the limited address = %d, want 200", r.status)
	}
	if n := counter(t, gw.m.decisions.WithLabelValues("denied", "guess", "enforced")); n != 3 {
		t.Errorf("denied guess decisions = %v, want 3", n)
	}
	if n := counter(t, gw.m.rejected.WithLabelValues("unknown_key")); n != 4 {
		t.Errorf("rejected{unknown_key} = %v, want 4 (the 401s only)", n)
	}
	// The decision API is a guessing oracle too.
	for i := range 4 {
		r := do(t, "POST", gw.URL+"/v1/check", strings.NewReader(`{"key":"guess"}`), "X-Forwarded-For", "192.0.2.3")
		want := http.StatusUnauthorized
		if i == 3 {
			want = http.StatusTooManyRequests
		}
		if r.status != want {
			t.Fatalf("check guess %d = %d, want %d", i, r.status, want)
		}
	}
}

func TestAuthFailureDefaultPlan(t *testing.T) {
	up := newTestUpstream(t)
	for _, tt := range []struct {
		plan     string
		want429  bool
		requests int
	}{
		{"", true, int(DefaultAuthFailureRule.Limit) + 1},
		{"-", false, int(DefaultAuthFailureRule.Limit) + 1},
	} {
		cfg := authConfig(up.URL)
		cfg.AuthFailurePlan = tt.plan
		gw := startGateway(t, cfg, Options{})
		var last int
		for range tt.requests {
			last = get(t, gw.URL+"/a", "X-API-Key", "nope").status
		}
		if got := last == http.StatusTooManyRequests; got != tt.want429 {
			t.Errorf("auth_failure_plan %q: request %d = %d, want 429: %v", tt.plan, tt.requests, last, tt.want429)
		}
	}
	cfg := authConfig(up.URL)
	cfg.AuthFailurePlan = "missing"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "auth_failure_plan") {
		t.Errorf("Validate(auth_failure_plan: missing) = %v, want an auth_failure_plan error", err)
	}
}

// TestRefusalsLimited: a request refused before its decision (no route
// matches, or its path, body, method override or upgrade is one the
// gateway will not pass on; or no call at all: CONNECT, "OPTIONS *") is
// charged to its address's auth failure bucket like a failed
// authentication, with rate-limit headers: free, it could be sent at line
// rate (probing for routes), and its answer broke the promise of
// rate-limit headers on every response. Past the plan the
// answer is 429; the address's own traffic is not charged for it.
func TestRefusalsLimited(t *testing.T) {
	gw := redisGateway(t, func(c *Config) {
		c.Plans["guess"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "guess", Limit: 3, Period: time.Hour}}}} // no refill while the test runs
		c.AuthFailurePlan = "guess"
		c.TrustedProxies = []string{"127.0.0.1"}
		c.MaxBodyBytes = 8
		c.Routes = []Route{
			{Name: "api", PathPrefix: "/api", Methods: []string{"GET", "POST"}, Upstream: "app"},
			{Name: "delete", PathPrefix: "/api", Methods: []string{"DELETE"}, Upstream: "app"},
		}
	})
	tests := []struct {
		name   string
		reason string // "": not counted in rejected_total
		give   string // the request, its head ending in X-Forwarded-For's value
		body   string
		want   int
	}{
		{"no route", "no_route", "GET /elsewhere HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: ", "", http.StatusNotFound},
		{"unmatched method", "no_route", "PUT /api/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nX-Forwarded-For: ", "", http.StatusNotFound},
		{"bad path", "bad_path", "GET /api/a%2Fb HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: ", "", http.StatusBadRequest},
		{"method override", "method_override", "POST /api/x?_method=DELETE HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nX-Forwarded-For: ", "", http.StatusBadRequest},
		{"body too large", "body_too_large", "POST /api/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 9\r\nX-Forwarded-For: ", "123456789", http.StatusRequestEntityTooLarge},
		{"check API, no route", "", "POST /v1/check HTTP/1.1\r\nHost: gw\r\nContent-Length: 22\r\nX-Forwarded-For: ", `{"path": "/elsewhere"}`, http.StatusNotFound},
		{"check API, bad JSON", "", "POST /v1/check HTTP/1.1\r\nHost: gw\r\nContent-Length: 1\r\nX-Forwarded-For: ", "{", http.StatusBadRequest},
		{"CONNECT", "", "CONNECT internal:22 HTTP/1.1\r\nHost: internal:22\r\nX-Forwarded-For: ", "", http.StatusMethodNotAllowed},
		{"asterisk target", "bad_path", "GET * HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: ", "", http.StatusBadRequest},
		{"mixed framing", "mixed_framing", "POST /api/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: ", "0\r\n\r\n", http.StatusBadRequest},
		{"server-wide OPTIONS", "", "OPTIONS * HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: ", "", http.StatusOK},
		{"upgrade", "upgrade_not_allowed", "GET /api/x HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Forwarded-For: ", "", http.StatusBadRequest},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip := fmt.Sprintf("192.0.2.%d", 10+i)
			before := counter(t, gw.m.rejected.WithLabelValues(tt.reason))
			for n := range 3 {
				r := rawDo(t, gw.URL, tt.give+ip+"\r\n\r\n"+tt.body)
				if r.status != tt.want || r.header.Get("X-RateLimit-Limit") != "3" || r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-n) {
					t.Fatalf("refusal %d = %d (X-RateLimit-Limit %q, Remaining %q) %s, want %d with limit 3, remaining %d",
						n, r.status, r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"), r.body, tt.want, 2-n)
				}
			}
			if r := rawDo(t, gw.URL, tt.give+ip+"\r\n\r\n"+tt.body); r.status != http.StatusTooManyRequests || r.retryAfter(t) < 1 {
				t.Errorf("past the auth failure plan = %d %s, want 429 with Retry-After", r.status, r.body)
			}
			if n := counter(t, gw.m.rejected.WithLabelValues(tt.reason)) - before; tt.reason != "" && n != 3 {
				t.Errorf("rejected{%s} grew by %v, want 3 (the refusals, not the 429)", tt.reason, n)
			}
			// The address's traffic has its own bucket, untouched.
			if r := get(t, gw.URL+"/api/x", "X-Forwarded-For", ip); r.status != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "4" {
				t.Errorf("routed request from the address = %d, remaining %q, want 200 with 4 of 5 left", r.status, r.header.Get("X-RateLimit-Remaining"))
			}
		})
	}
}
