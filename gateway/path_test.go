package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

func TestNormalizePath(t *testing.T) {
	tests := []struct {
		name string
		give string
		pc   PathConfig
		want string // "" : refused
	}{
		{name: "root", give: "/", want: "/"},
		{name: "empty", give: "", want: "/"},
		{name: "plain", give: "/api/export", want: "/api/export"},
		{name: "trailing slash kept", give: "/api/", want: "/api/"},
		{name: "merged slashes", give: "//api///export", want: "/api/export"},
		{name: "dot segment", give: "/api/./export", want: "/api/export"},
		{name: "dot dot", give: "/api/search/../export", want: "/api/export"},
		{name: "dot dot above root", give: "/../../healthz", want: "/healthz"},
		{name: "trailing dot dot", give: "/api/search/..", want: "/api/"},
		{name: "encoded dots", give: "/api/search/%2e%2e/healthz", want: "/api/healthz"},
		{name: "encoded dots upper", give: "/api/%2E%2E/%2E/healthz", want: "/healthz"},
		{name: "encoded unreserved decoded", give: "/%7euser/%41b", want: "/~user/Ab"},
		{name: "reserved escape kept upper", give: "/api/a%3fb%2a", want: "/api/a%3Fb%2A"},
		{name: "utf8 escape kept", give: "/caf%c3%a9", want: "/caf%C3%A9"},
		{name: "raw unsafe byte escaped", give: `/a"b`, want: "/a%22b"},
		{name: "escaped percent alone", give: "/100%25", want: "/100%25"},
		{name: "case kept", give: "/api/EXPORT", want: "/api/EXPORT"},
		{name: "encoded slash", give: "/api/search/..%2Fhealthz"},
		{name: "encoded slash lower", give: "/api/search/..%2fhealthz"},
		{name: "encoded backslash", give: "/api/%5C..%5Chealthz"},
		{name: "raw backslash", give: `/api\..\healthz`},
		{name: "encoded nul", give: "/api/export%00.json"},
		{name: "encoded control", give: "/api/a%0d%0ab"},
		{name: "double encoded slash", give: "/api/search/..%252Fhealthz"},
		{name: "overlong slash", give: "/api/%c0%af../healthz"},
		{name: "invalid utf8", give: "/api/%ff"},
		{name: "trailing dot", give: "/api/export."},
		{name: "trailing dots", give: "/api/export.../x"},
		{name: "trailing space", give: "/api/export%20"},
		{name: "trailing space and dot", give: "/api/export%20./x"},
		{name: "space inside kept", give: "/api/a%20b", want: "/api/a%20b"},
		{name: "params refused", give: "/api/export;jsessionid=1"},
		{name: "params allowed", give: "/api/export;jsessionid=1", pc: PathConfig{AllowParams: true}, want: "/api/export;jsessionid=1"},
		{name: "dot dot params", give: "/api/..;/healthz", pc: PathConfig{AllowParams: true}},
		{name: "bad escape", give: "/api/%zz"},
		{name: "short escape", give: "/api/%4"},
		{name: "relative", give: "api/export"},
		{name: "asterisk", give: "*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := normalizePath(tt.give, tt.pc)
			var amb errAmbiguousPath
			switch {
			case tt.want == "" && !errors.As(err, &amb):
				t.Errorf("normalizePath(%q) = %q, %v; want refused", tt.give, got, err)
			case tt.want != "" && (err != nil || got != tt.want):
				t.Errorf("normalizePath(%q) = %q, %v; want %q", tt.give, got, err, tt.want)
			}
		})
	}
}

func TestRoutePath(t *testing.T) {
	tests := []struct {
		give string
		pc   PathConfig
		want string
	}{
		{"/api/export;jsessionid=1", PathConfig{AllowParams: true}, "/api/export"},
		{"/a;x/b;y=1/c", PathConfig{AllowParams: true}, "/a/b/c"},
		{"/api/EXPORT", PathConfig{IgnoreCase: true}, "/api/export"},
		{"/api/EXPORT", PathConfig{}, "/api/EXPORT"},
	}
	for _, tt := range tests {
		if got := routePath(tt.give, tt.pc); got != tt.want {
			t.Errorf("routePath(%q, %+v) = %q, want %q", tt.give, tt.pc, got, tt.want)
		}
	}
}

// FuzzNormalizePath: a normalised path is its own normal form, and the
// request line the upstream is sent parses back to exactly it, so the
// route the gateway decided is the route the upstream's path matches.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "/api/search/..%2Fhealthz", "/a/%2e%2e/b", "//x//y/", "/%c0%af", "/a;b", "/caf%C3%A9", `/a"b`, "/100%25"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, p string, params bool) {
		pc := PathConfig{AllowParams: params}
		if plainPath(p) {
			if slow, err := normalizeSlow(p, pc); err != nil || slow != p {
				t.Fatalf("plainPath(%q), but its normal form is %q, %v", p, slow, err)
			}
		}
		n, err := normalizePath(p, pc)
		if err != nil {
			return
		}
		if again, err := normalizePath(n, pc); err != nil || again != n {
			t.Fatalf("normalizePath(%q) = %q, but normalizePath(%q) = %q, %v", p, n, n, again, err)
		}
		decoded, escaped := joinPath("", n)
		u := &url.URL{Scheme: "http", Host: "up", Path: decoded, RawPath: escaped}
		back, err := url.ParseRequestURI(u.RequestURI())
		if err != nil {
			t.Fatalf("forwarded %q does not parse: %v", u.RequestURI(), err)
		}
		if got := requestPath(back.RawPath, back.EscapedPath()); got != n {
			t.Fatalf("decided on %q, upstream reads %q", n, got)
		}
	})
}

// pathUpstream is a real service that records each request it receives
// whole: its method, request target, headers and body. It reads every
// body in full, as a framework does before it looks for a form's
// _method, and records no request whose body was cut short: no framework
// runs one.
type pathUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []upstreamRequest
}

type upstreamRequest struct {
	method, uri string
	header      http.Header
	body        []byte
}

func newPathUpstream(t testing.TB) *pathUpstream {
	u := &pathUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.seen = append(u.seen, upstreamRequest{r.Method, r.RequestURI, r.Header.Clone(), body})
		u.mu.Unlock()
		_, _ = io.WriteString(w, "upstream\n")
	}))
	t.Cleanup(u.Close)
	return u
}

// takeRequests returns the requests received since the last take.
func (u *pathUpstream) takeRequests() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen
	u.seen = nil
	return s
}

// take returns the request targets received since the last take.
func (u *pathUpstream) take() []string {
	var uris []string
	for _, r := range u.takeRequests() {
		uris = append(uris, r.uri)
	}
	return uris
}

// pathConfig has the routes of issue 9: an exempt health check, a cheap
// API, a strictly limited search and an expensive export; nothing else
// (no "/" route) is exposed.
func pathConfig(upstreamURL string) Config {
	cfg := testConfig(upstreamURL)
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000, Period: time.Minute}}}}
	cfg.Plans["search"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "search", Limit: 1, Period: time.Minute}}}}
	cfg.Routes = []Route{
		{Name: "health", PathPrefix: "/healthz", Upstream: "app", Exempt: true},
		{Name: "api", PathPrefix: "/api/", Upstream: "app"},
		{Name: "search", PathPrefix: "/api/search", Upstream: "app", Plan: "search"},
		{Name: "export", PathPrefix: "/api/export", Methods: []string{"POST"}, Upstream: "app", Cost: 10},
	}
	return cfg
}

// TestOnePath sends each path of issue 9, and a table of tricky
// encodings, on a raw connection: either the client gets 400 and the
// upstream nothing, or the upstream receives exactly the normalised path
// and the route the gateway charged is the route that path matches.
func TestOnePath(t *testing.T) {
	tests := []struct {
		name, method, target string
		pc                   PathConfig
		wantStatus           int
		wantRoute            string // the route charged; "" when refused
		wantPath             string // what the upstream received
	}{
		// The examples.
		{name: "encoded slash to exempt health", method: "GET", target: "/api/search/..%2Fhealthz", wantStatus: 400},
		{name: "encoded slash to unrouted internal", method: "GET", target: "/internal/..%2Fapi/healthz", wantStatus: 400},
		{name: "encoded slash off export", method: "POST", target: "/api/export/..%2Fcsv", wantStatus: 400},
		{name: "jsessionid refused", method: "POST", target: "/api/export;jsessionid=1", wantStatus: 400},
		{name: "upper case is not export", method: "POST", target: "/api/EXPORT", wantStatus: 200, wantRoute: "api", wantPath: "/api/EXPORT"},
		// Django and Werkzeug upper-case the method: "post" runs the export.
		{name: "lower-case method is export", method: "post", target: "/api/export", wantStatus: 200, wantRoute: "export", wantPath: "/api/export"},
		// Tricky encodings.
		{name: "encoded dots resolved", method: "GET", target: "/api/search/%2e%2e/%2E%2E/healthz", wantStatus: 200, wantRoute: "health", wantPath: "/healthz"},
		{name: "encoded dots to unrouted", method: "GET", target: "/api/%2e%2e/internal/x", wantStatus: 404},
		{name: "double encoded slash", method: "GET", target: "/api/search/..%252Fhealthz", wantStatus: 400},
		{name: "merged slashes", method: "POST", target: "//api//export", wantStatus: 200, wantRoute: "export", wantPath: "/api/export"},
		{name: "dot segment", method: "POST", target: "/api/./export", wantStatus: 200, wantRoute: "export", wantPath: "/api/export"},
		{name: "dot dot into export", method: "POST", target: "/api/search/../export", wantStatus: 200, wantRoute: "export", wantPath: "/api/export"},
		{name: "trailing dot", method: "POST", target: "/api/export.", wantStatus: 400},
		{name: "trailing space", method: "POST", target: "/api/export%20", wantStatus: 400},
		{name: "nul", method: "GET", target: "/api/search%00/q", wantStatus: 400},
		{name: "overlong slash", method: "GET", target: "/api/search/%c0%af..%c0%afhealthz", wantStatus: 400},
		{name: "backslash", method: "GET", target: `/api/search\..\..\healthz`, wantStatus: 400},
		{name: "encoded backslash", method: "GET", target: "/api/search/..%5Chealthz", wantStatus: 400},
		{name: "unreserved decoded", method: "POST", target: "/api/%65xport", wantStatus: 200, wantRoute: "export", wantPath: "/api/export"},
		{name: "escape kept", method: "GET", target: "/api/x/caf%c3%a9%3f", wantStatus: 200, wantRoute: "api", wantPath: "/api/x/caf%C3%A9%3F"},
		{name: "query kept", method: "GET", target: "/api//x?q=%2F..", wantStatus: 200, wantRoute: "api", wantPath: "/api/x?q=%2F.."},
		{name: "absolute form", method: "POST", target: "http://gw/api/./export", wantStatus: 200, wantRoute: "export", wantPath: "/api/export"},
		{name: "params allowed route as java does", method: "POST", target: "/api/export;jsessionid=1", pc: PathConfig{AllowParams: true},
			wantStatus: 200, wantRoute: "export", wantPath: "/api/export;jsessionid=1"},
		{name: "params allowed dot dot refused", method: "GET", target: "/api/search/..;/healthz", pc: PathConfig{AllowParams: true}, wantStatus: 400},
		{name: "ignore case", method: "POST", target: "/api/EXPORT", pc: PathConfig{IgnoreCase: true}, wantStatus: 200, wantRoute: "export", wantPath: "/api/EXPORT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newPathUpstream(t)
			cfg := pathConfig(up.URL)
			cfg.Paths = tt.pc
			gw := startGateway(t, cfg, Options{})
			res := rawDo(t, gw.URL, tt.method+" "+tt.target+" HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			if res.status != tt.wantStatus {
				t.Fatalf("%s %s = %d %s, want %d", tt.method, tt.target, res.status, res.body, tt.wantStatus)
			}
			seen := up.take()
			if tt.wantPath == "" {
				if len(seen) != 0 {
					t.Fatalf("%s %s: upstream received %q, want nothing", tt.method, tt.target, seen)
				}
				return
			}
			if len(seen) != 1 || seen[0] != tt.wantPath {
				t.Fatalf("%s %s: upstream received %q, want [%q]", tt.method, tt.target, seen, tt.wantPath)
			}
			// The route the upstream's path matches is the one charged.
			st := gw.st.Load()
			p, _, _ := strings.Cut(seen[0], "?")
			if rt := st.match(tt.method, p); rt == nil || rt.Name != tt.wantRoute {
				t.Errorf("upstream path %q matches route %v, want %s", p, rt, tt.wantRoute)
			}
			if n := counter(t, gw.m.requests.WithLabelValues(tt.wantRoute, "200")); n != 1 {
				t.Errorf("requests_total{route=%q} = %v, want 1", tt.wantRoute, n)
			}
			if tt.wantRoute != "health" && res.header.Get("X-RateLimit-Limit") == "" {
				t.Errorf("%s %s: no rate-limit headers", tt.method, tt.target)
			}
		})
	}
}

// TestRequestTargetForms: an absolute-form target with an empty path is
// "/", decided and forwarded as such; a target with no path at all is a
// 400 that says so, not echo's bare 404.
func TestRequestTargetForms(t *testing.T) {
	up := newPathUpstream(t)
	gw := startGateway(t, testConfig(up.URL), Options{})
	tests := []struct {
		give       string
		wantStatus int
		wantPath   string // what the upstream received; "": nothing
	}{
		{"http://gw", 200, "/"},
		{"http://gw?q=1", 200, "/?q=1"},
		{"a:admin/x", 400, ""},
		{"mailto:admin", 400, ""},
		{"*", 400, ""},
	}
	for _, tt := range tests {
		res := rawDo(t, gw.URL, "GET "+tt.give+" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
		var p problem
		if res.status != 200 {
			res.json(t, &p)
		}
		if res.status != tt.wantStatus || res.status == 400 && (p.Type != probBadPath || p.Detail == "") {
			t.Errorf("GET %s = %d %s, want %d (an ambiguous-path problem when refused)", tt.give, res.status, res.body, tt.wantStatus)
		}
		seen := up.take()
		if tt.wantPath == "" && len(seen) != 0 || tt.wantPath != "" && (len(seen) != 1 || seen[0] != tt.wantPath) {
			t.Errorf("GET %s: upstream received %q, want %q", tt.give, seen, tt.wantPath)
		}
	}
}

// TestOnePathAfterDenial is the attack: once search is denied, an
// encoded slash must not buy more searches as the exempt health check.
func TestOnePathAfterDenial(t *testing.T) {
	up := newPathUpstream(t)
	gw := startGateway(t, pathConfig(up.URL), Options{})
	if res := get(t, gw.URL+"/api/search/q"); res.status != 200 {
		t.Fatalf("first search = %d, want 200", res.status)
	}
	if res := get(t, gw.URL+"/api/search/q"); res.status != 429 {
		t.Fatalf("second search = %d, want 429", res.status)
	}
	up.take()
	for i := 0; i < 3; i++ {
		res := get(t, gw.URL+"/api/search/..%2Fhealthz")
		if res.status != 400 {
			t.Fatalf("GET /api/search/..%%2Fhealthz = %d %s, want 400", res.status, res.body)
		}
	}
	if seen := up.take(); len(seen) != 0 {
		t.Fatalf("upstream ran %q after the denial", seen)
	}
}

// TestCheckPathNormalised: the decision API routes its path field as
// proxied traffic routes the request path.
func TestCheckPathNormalised(t *testing.T) {
	up := newPathUpstream(t)
	gw := startGateway(t, pathConfig(up.URL), Options{})
	tests := []struct {
		path       string
		wantStatus int
		wantRoute  string
		wantCost   int64
	}{
		{"/api/export/..%2Fcsv", 400, "", 0},
		{"//api/./export", 200, "export", 10},
		{"/api/search/../export?x=1", 200, "export", 10},
		{"/api/EXPORT", 200, "api", 1},
	}
	for _, tt := range tests {
		body := fmt.Sprintf(`{"method":"POST","path":%q}`, tt.path)
		res := do(t, "POST", gw.URL+"/v1/check", strings.NewReader(body), "Content-Type", "application/json")
		if res.status != tt.wantStatus {
			t.Fatalf("check %s = %d %s, want %d", tt.path, res.status, res.body, tt.wantStatus)
		}
		if tt.wantStatus != 200 {
			continue
		}
		var cr checkResponse
		res.json(t, &cr)
		if cr.Route != tt.wantRoute || cr.Cost != tt.wantCost {
			t.Errorf("check %s = route %q cost %d, want %q cost %d", tt.path, cr.Route, cr.Cost, tt.wantRoute, tt.wantCost)
		}
	}
}

func TestRoutePrefixNormalForm(t *testing.T) {
	cfg := validConfig()
	cfg.Routes = []Route{{Name: "a", PathPrefix: "/api//x", Upstream: "app"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "normal form") {
		t.Fatalf("Validate(/api//x) = %v, want a normal-form error", err)
	}
}

// overrideHeaders are headers with which an upstream framework could act
// on another path or method than the one the gateway decided on.
var overrideHeaders = []string{
	"X-Original-URL", "X-Rewrite-URL", "X-Override-URL", "X-HTTP-Method-Override",
	"X-HTTP-Method", "X-Method-Override", "X-Forwarded-Prefix", "X-Forwarded-Path", "X_Original_URL",
}

// FuzzDecidedIsForwarded sends arbitrary paths with arbitrary values of
// path- and method-overriding headers through a started gateway to a real
// upstream, and asserts that whenever the upstream is reached, it receives
// exactly the path and method the gateway routed and charged, and none of
// the overriding headers (issue 9: the path decided is the path forwarded).
func FuzzDecidedIsForwarded(f *testing.F) {
	for i, s := range []string{"/api/search/q", "/api/search/..%2Fhealthz", "/internal/..%2Fapi/healthz", "/api/export;jsessionid=1",
		"/api/EXPORT", "//api//export", "/api/./export/", "/a/%2e%2e/healthz", "/%c0%af", "/api/export%00", "/x?y=/z"} {
		f.Add(s, uint8(i), "/admin")
	}
	up := newPathUpstream(f)
	cfg := testConfig(up.URL)
	// Never denies: the test is about paths.
	cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1 << 30, Period: time.Minute}}}}
	cfg.Routes = []Route{
		{Name: "health", PathPrefix: "/healthz", Upstream: "app", Exempt: true},
		{Name: "export", PathPrefix: "/api/export", Upstream: "app", Cost: 10},
		{Name: "api", PathPrefix: "/api/", Upstream: "app"},
	}
	gw := startGateway(f, cfg, Options{})
	st := gw.st.Load()
	f.Fuzz(func(t *testing.T, target string, which uint8, value string) {
		if target == "" || target[0] != '/' || strings.ContainsFunc(target+value, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return // not a request line or header value a client can send
		}
		name := overrideHeaders[int(which)%len(overrideHeaders)]
		up.take()
		res := rawDo(t, gw.URL, "GET "+target+" HTTP/1.1\r\nHost: gw\r\n"+name+": "+value+"\r\nConnection: close\r\n\r\n")
		reqs := up.takeRequests()
		if len(reqs) == 0 {
			return // refused or not routed: nothing reached the upstream
		}
		seen := reqs[0]
		p, _, _ := strings.Cut(target, "?")
		decided, err := normalizePath(p, st.cfg.Paths)
		if err != nil {
			t.Fatalf("%q reached the upstream (%d) although its path is refused: %v", target, res.status, err)
		}
		gotPath, _, _ := strings.Cut(seen.uri, "?")
		if gotPath != decided || seen.method != http.MethodGet {
			t.Fatalf("decided GET %q, the upstream got %s %q", decided, seen.method, seen.uri)
		}
		for _, h := range overrideHeaders {
			if v := seen.header.Get(h); v != "" && !strings.HasPrefix(h, "X-Forwarded-") {
				t.Fatalf("%s: %q reached the upstream", h, v)
			}
		}
		if v := seen.header.Get("X-Forwarded-Prefix") + seen.header.Get("X-Forwarded-Path"); v != "" {
			t.Fatalf("a client's forwarding prefix reached the upstream: %q", v)
		}
		for k := range seen.header {
			if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), "X-Original-URL") {
				t.Fatalf("%s reached the upstream", k)
			}
		}
	})
}
