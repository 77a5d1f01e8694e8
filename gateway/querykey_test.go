package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// TestAPIKeyInQuery: a key in a query parameter the upstream reads is
// charged to that key, in every spelling a framework reads as the same
// parameter; a second, different key anywhere in the request is refused.
// Before, the query was not read: the request was charged to the client's
// address (or, with a header key too, to the header's key) while the
// upstream served the query's key.
func TestAPIKeyInQuery(t *testing.T) {
	lim, _ := redisStore(t)
	up := newPathUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 30, Period: time.Minute}}}}
	cfg.Plans["pro"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 50, Period: time.Minute}}}}
	cfg.Plans["gold"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 70, Period: time.Minute}}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("secret-acme"), Plan: "pro"}, {ID: "other", SHA256: sha("secret-other"), Plan: "gold"}}
	gw := startGateway(t, cfg, Options{Store: lim})
	bearerOff := cfg
	bearerOff.IgnoreBearer = true
	gwNoBearer := startGateway(t, bearerOff, Options{Store: lim})
	none := cfg
	none.APIKeyParams = []string{"-"}
	gwNone := startGateway(t, none, Options{Store: lim})
	custom := cfg
	custom.APIKeyParams = []string{"token"}
	gwCustom := startGateway(t, custom, Options{Store: lim})

	tests := []struct {
		name       string
		url        string
		query      string
		header     string
		wantStatus int
		wantLimit  string
	}{
		{"api_key", gw.URL, "api_key=secret-acme", "", 200, "50"},
		{"apikey among others", gw.URL, "q=1&apikey=secret-acme&x=y", "", 200, "50"},
		{"upper case", gw.URL, "API_KEY=secret-acme", "", 200, "50"},
		{"escaped name", gw.URL, "api%5Fkey=secret-acme", "", 200, "50"},
		{"php dot", gw.URL, "api.key=secret-acme", "", 200, "50"},
		{"php array", gw.URL, "api_key[]=secret-acme", "", 200, "50"},
		{"semicolon separator", gw.URL, "q=1;api_key=secret-acme", "", 200, "50"},
		{"escaped value", gw.URL, "api_key=secret%2Dacme", "", 200, "50"},
		{"access_token", gw.URL, "access_token=secret-other", "", 200, "70"},
		{"same key in header and query", gw.URL, "api_key=secret-acme", "X-API-Key: secret-acme\r\n", 200, "50"},
		{"header and another query key", gw.URL, "api_key=secret-other", "X-API-Key: secret-acme\r\n", 400, ""},
		{"two query keys", gw.URL, "api_key=secret-acme&apikey=secret-other", "", 400, ""},
		{"repeated parameter", gw.URL, "api_key=secret-acme&api_key=secret-other", "", 400, ""},
		{"unknown query key", gw.URL, "api_key=nope", "", 401, ""},
		{"empty parameter", gw.URL, "api_key=", "", 200, "30"},
		{"other parameter", gw.URL, "key_api=secret-acme", "", 200, "30"},
		{"access_token with bearers ignored", gwNoBearer.URL, "access_token=secret-other", "", 200, "30"},
		{"api_key with bearers ignored", gwNoBearer.URL, "api_key=secret-other", "", 200, "70"},
		{"none configured", gwNone.URL, "api_key=secret-acme", "", 200, "30"},
		{"access_token with none configured", gwNone.URL, "access_token=secret-acme", "", 200, "50"},
		{"custom name", gwCustom.URL, "Token=secret-acme", "", 200, "50"},
		{"default name not configured", gwCustom.URL, "api_key=secret-acme", "", 200, "30"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rawDo(t, tt.url, "GET /x?"+tt.query+" HTTP/1.1\r\nHost: gw\r\n"+tt.header+"Connection: close\r\n\r\n")
			// Only an allowed request's limit names whom it was charged to.
			if r.status != tt.wantStatus || (tt.wantStatus == 200 && r.header.Get("X-RateLimit-Limit") != tt.wantLimit) {
				t.Errorf("GET /x?%s with %q = %d limit %q, want %d limit %q (%s)", tt.query, tt.header, r.status, r.header.Get("X-RateLimit-Limit"), tt.wantStatus, tt.wantLimit, r.body)
			}
			if seen := up.take(); tt.wantStatus != 200 && len(seen) != 0 {
				t.Errorf("GET /x?%s: upstream received %q, want nothing", tt.query, seen)
			}
		})
	}
}

func TestAPIKeyParamsValidate(t *testing.T) {
	for _, give := range [][]string{{""}, {"a&b"}, {"a=b"}, {"a;b"}, {"a b"}, {"-", "api_key"}, {"a%5F"}} {
		cfg := testConfig("http://127.0.0.1:1")
		cfg.APIKeyParams = give
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "api_key_params") {
			t.Errorf("Validate(api_key_params: %q) = %v, want an api_key_params error", give, err)
		}
	}
}
