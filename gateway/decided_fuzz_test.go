package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

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
	type got struct {
		Method, URI string
		Header      http.Header
	}
	var mu sync.Mutex
	var last *got
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = &got{r.Method, r.RequestURI, r.Header.Clone()}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"ok": "1"})
	}))
	f.Cleanup(up.Close)
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
		mu.Lock()
		last = nil
		mu.Unlock()
		res := rawDo(t, gw.URL, "GET "+target+" HTTP/1.1\r\nHost: gw\r\n"+name+": "+value+"\r\nConnection: close\r\n\r\n")
		mu.Lock()
		seen := last
		mu.Unlock()
		if seen == nil {
			return // refused or not routed: nothing reached the upstream
		}
		p, _, _ := strings.Cut(target, "?")
		decided, err := normalizePath(p, st.cfg.Paths)
		if err != nil {
			t.Fatalf("%q reached the upstream (%d) although its path is refused: %v", target, res.status, err)
		}
		gotPath, _, _ := strings.Cut(seen.URI, "?")
		if gotPath != decided || seen.Method != http.MethodGet {
			t.Fatalf("decided GET %q, the upstream got %s %q", decided, seen.Method, seen.URI)
		}
		for _, h := range overrideHeaders {
			if v := seen.Header.Get(h); v != "" && !strings.HasPrefix(h, "X-Forwarded-") {
				t.Fatalf("%s: %q reached the upstream", h, v)
			}
		}
		if v := seen.Header.Get("X-Forwarded-Prefix") + seen.Header.Get("X-Forwarded-Path"); v != "" {
			t.Fatalf("a client's forwarding prefix reached the upstream: %q", v)
		}
		for k := range seen.Header {
			if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), "X-Original-URL") {
				t.Fatalf("%s reached the upstream", k)
			}
		}
	})
}
