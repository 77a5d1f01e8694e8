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

// TestMethodOverrideInQuery: a POST whose query names, as _method, a
// method limited on another route is refused: Laravel, Express and Spring
// would run it as that method, on a route the gateway did not charge.
// Where the named method falls to the same route, nothing changes.
// Before, such a POST was charged as a POST and run as the other method.
func TestMethodOverrideInQuery(t *testing.T) {
	up := newPathUpstream(t)
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}}}}
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Routes = []Route{
			{Name: "all", PathPrefix: "/", Upstream: "app"},
			{Name: "delete", PathPrefix: "/v1/items", Methods: []string{"DELETE"}, Upstream: "app", Cost: 10},
		}
	})
	tests := []struct {
		name       string
		method     string
		target     string
		wantStatus int
	}{
		{"delete named", "POST", "/v1/items/7?_method=DELETE", 400},
		{"lower case value", "POST", "/v1/items/7?_method=delete", 400},
		{"escaped name", "POST", "/v1/items/7?%5Fmethod=DELETE", 400},
		{"after a semicolon", "POST", "/v1/items/7?a=1;_method=DELETE", 400},
		{"upper-case name", "POST", "/v1/items/7?_METHOD=DELETE", 400},
		{"one of two", "POST", "/v1/items/7?_method=PUT&_method=DELETE", 400},
		{"lower-case post", "post", "/v1/items/7?_method=DELETE", 400},
		{"same route", "POST", "/v1/items/7?_method=PUT", 200},
		{"elsewhere", "POST", "/v1/other?_method=DELETE", 200},
		{"not a POST", "GET", "/v1/items/7?_method=DELETE", 200},
		{"empty", "POST", "/v1/items/7?_method=", 200},
		{"another parameter", "POST", "/v1/items/7?method=DELETE", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rawDo(t, gw.URL, tt.method+" "+tt.target+" HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			if r.status != tt.wantStatus {
				t.Errorf("%s %s = %d, want %d (%s)", tt.method, tt.target, r.status, tt.wantStatus, r.body)
			}
			if seen := up.take(); tt.wantStatus != 200 && len(seen) != 0 {
				t.Errorf("%s %s: upstream received %q, want nothing", tt.method, tt.target, seen)
			}
		})
	}
}
