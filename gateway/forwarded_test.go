package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// headerUpstream answers with every header it received.
func headerUpstream(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(r.Header)
	}))
	t.Cleanup(srv.Close)
	return srv
}

const spoofed = "X-Real-IP: 203.0.113.1\r\n" +
	"True-Client-IP: 203.0.113.2\r\n" +
	"X-Client-IP: 203.0.113.3\r\n" +
	"X-Forwarded-Port: 443\r\n" +
	"X-Forwarded-Prefix: /admin\r\n" +
	"X-Forwarded-Proto: https\r\n" +
	"X-Forwarded-Host: victim.example\r\n" +
	"X-Forwarded-For: 203.0.113.4\r\n" +
	"x_forwarded_for: 203.0.113.5\r\n" +
	"Forwarded: for=203.0.113.6;proto=https\r\n" +
	"X-Original-Forwarded-For: 203.0.113.7\r\n" +
	"CF-Connecting-IP: 203.0.113.8\r\n" +
	"Fastly-Client-IP: 203.0.113.9\r\n" +
	"X-User-ID: alice\r\n" +
	"X_User_ID: mallory\r\n" +
	"x-real_ip: 203.0.113.10\r\n" +
	"Client-IP: 203.0.113.11\r\n" +
	"X-Envoy-External-Address: 203.0.113.12\r\n" +
	"X-Originating-IP: 203.0.113.13\r\n" +
	"X-Remote-IP: 203.0.113.14\r\n" +
	"X-Remote-Addr: 203.0.113.15\r\n"

// forwardedHeaders sends the raw request head through a gateway that
// trusts the user header under cfg's trust settings, and returns the
// headers the upstream received.
func forwardedHeaders(t *testing.T, trusted []string, hops int, head string) http.Header {
	t.Helper()
	up := headerUpstream(t)
	cfg := testConfig(up.URL)
	cfg.UserHeader = "X-User-ID"
	cfg.TrustedProxies, cfg.TrustedHops = trusted, hops
	gw := startGateway(t, cfg, Options{})
	res := rawDo(t, gw.URL, head)
	if res.status != 200 {
		t.Fatalf("status %d %s", res.status, res.body)
	}
	var got http.Header
	res.json(t, &got)
	return got
}

// TestUntrustedHeadersStripped: what an untrusted client sets to name
// itself never reaches the upstream; the gateway's own view does.
func TestUntrustedHeadersStripped(t *testing.T) {
	got := forwardedHeaders(t, nil, 0, "GET /x HTTP/1.1\r\nHost: gw.example\r\n"+spoofed+"Connection: close\r\n\r\n")
	want := map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "gw.example"}
	for k, v := range got {
		f := foldHeader(k)
		if w, ok := want[k]; ok {
			if len(v) != 1 || v[0] != w {
				t.Errorf("upstream got %s: %q, want %q", k, v, w)
			}
			continue
		}
		if strings.Contains(f, "forward") || strings.Contains(f, "ip") || strings.Contains(f, "user") || strings.Contains(f, "addr") {
			t.Errorf("upstream got client-set %s: %q", k, v)
		}
	}
}

// TestConnectionKeepsDecidedHeaders: a client's Connection header does
// not take from the upstream a header the gateway read the request by
// (ReverseProxy drops every header Connection names): a text/plain body
// the _method scan passed over reached Rack untyped, which parses such a
// POST as a form and ran it as the DELETE it named. Other headers named
// there are still hop-by-hop.
func TestConnectionKeepsDecidedHeaders(t *testing.T) {
	got := forwardedHeaders(t, nil, 0, "POST /x HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nContent-Encoding: identity\r\n"+
		"X-Hop: 1\r\nConnection: Content-Type, content-encoding,X-Hop, close\r\nContent-Length: 14\r\n\r\n_method=DELETE")
	for name, want := range map[string]string{"Content-Type": "text/plain", "Content-Encoding": "identity", "X-Hop": ""} {
		if v := strings.Join(got[name], ","); v != want {
			t.Errorf("upstream got %s %q, want %q", name, v, want)
		}
	}
}

// TestTrustedForwarding: behind a trusted TLS load balancer the upstream
// learns the client's scheme and host, and the chains are extended, not
// replaced; underscore twins are still removed. Behind a proxy known only
// by trusted_hops the forwarding chain survives, identity headers do not.
func TestTrustedForwarding(t *testing.T) {
	type header struct{ name, want string }
	tests := []struct {
		name    string
		trusted []string
		hops    int
		give    string // request headers after Host
		want    []header
	}{
		{
			name:    "trusted proxy",
			trusted: []string{"127.0.0.1"},
			give: "X-Forwarded-For: 192.0.2.1\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: api.example.com\r\n" +
				"Forwarded: for=192.0.2.1;proto=https;host=api.example.com\r\nX-User-ID: carol\r\nX_User_ID: mallory\r\n" +
				"X-HTTP-Method-Override: DELETE\r\nX-Original-URL: /admin\r\nX-Method-Override: PUT\r\n",
			want: []header{
				// The gateway decided on the method and path it read: a
				// client's override passed on by a proxy is still the
				// client's.
				{"X-Http-Method-Override", ""},
				{"X-Original-Url", ""},
				{"X-Method-Override", ""},
				{"X-Forwarded-For", "192.0.2.1, 127.0.0.1"},
				{"X-Forwarded-Proto", "https"},
				{"X-Forwarded-Host", "api.example.com"},
				{"Forwarded", "for=192.0.2.1;proto=https;host=api.example.com,for=127.0.0.1"},
				{"X-User-Id", "carol"},
				{"X_user_id", ""},
			},
		},
		{
			name: "trusted hops",
			hops: 1,
			give: "X-Forwarded-For: 192.0.2.1\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: api.example.com\r\n" +
				"X-Forwarded-Prefix: /admin\r\nX-Real-IP: 203.0.113.1\r\nX-User-ID: mallory\r\n",
			want: []header{
				{"X-Forwarded-For", "192.0.2.1, 127.0.0.1"},
				{"X-Forwarded-Proto", "https"},
				{"X-Forwarded-Host", "api.example.com"},
				{"X-Forwarded-Prefix", ""},
				{"X-Real-Ip", ""},
				{"X-User-Id", ""},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := forwardedHeaders(t, tt.trusted, tt.hops, "GET /x HTTP/1.1\r\nHost: gw.internal\r\n"+tt.give+"Connection: close\r\n\r\n")
			for _, h := range tt.want {
				if v := strings.Join(got[h.name], ","); v != h.want {
					t.Errorf("upstream got %s %q, want %q", h.name, v, h.want)
				}
			}
		})
	}
}

// TestMalformedForwardedFor: a malformed entry where a trusted proxy
// names the client is refused, never limited as the proxy itself.
func TestMalformedForwardedFor(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.TrustedProxies = []string{"127.0.0.1"}
	gw := startGateway(t, cfg, Options{})
	if r := get(t, gw.URL+"/", "X-Forwarded-For", "192.0.2.1, not-an-ip"); r.status != http.StatusBadRequest {
		t.Errorf("malformed X-Forwarded-For: %d %s, want 400", r.status, r.body)
	}
	// Left of the first untrusted address nothing is believed anyway.
	if r := get(t, gw.URL+"/", "X-Forwarded-For", "not-an-ip, 192.0.2.1"); r.status != http.StatusOK {
		t.Errorf("garbage left of the client: %d %s, want 200", r.status, r.body)
	}
}

func TestClientIP(t *testing.T) {
	tests := []struct {
		name    string
		trusted []string
		hops    int
		peer    string
		xff     []string
		want    string // "": refused
	}{
		{name: "no trust", peer: "198.51.100.1:1", xff: []string{"192.0.2.1"}, want: "198.51.100.1"},
		{name: "link-local peer", peer: "[fe80::1%eth0]:1", want: "fe80::1"},
		{name: "trusted link-local peer", trusted: []string{"fe80::/10"}, peer: "[fe80::1%eth0]:1", xff: []string{"192.0.2.1"}, want: "192.0.2.1"},
		{name: "untrusted peer", trusted: []string{"10.0.0.0/8"}, peer: "198.51.100.1:1", xff: []string{"192.0.2.1"}, want: "198.51.100.1"},
		{name: "trusted peer", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"192.0.2.1"}, want: "192.0.2.1"},
		{name: "trusted chain", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"192.0.2.9, 192.0.2.1, 10.0.0.7"}, want: "192.0.2.1"},
		{name: "two headers", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"192.0.2.1", "10.0.0.7"}, want: "192.0.2.1"},
		{name: "all trusted", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"10.0.0.8, 10.0.0.7"}, want: "10.0.0.8"},
		{name: "ipv6 brackets", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"[2001:db8::1]"}, want: "2001:db8::1"},
		{name: "no header", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", want: "10.0.0.1"},
		{name: "malformed at client", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"192.0.2.1:80"}},
		{name: "malformed behind trusted", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"192.0.2.1, bogus, 10.0.0.2"}},
		{name: "malformed beyond client", trusted: []string{"10.0.0.0/8"}, peer: "10.0.0.1:1", xff: []string{"bogus, 192.0.2.1"}, want: "192.0.2.1"},
		{name: "hops 1", hops: 1, peer: "10.9.9.9:1", xff: []string{"203.0.113.1, 192.0.2.1"}, want: "192.0.2.1"},
		{name: "hops 2", hops: 2, peer: "10.9.9.9:1", xff: []string{"203.0.113.1, 192.0.2.1, 10.1.1.1"}, want: "192.0.2.1"},
		{name: "hops beyond chain", hops: 3, peer: "10.9.9.9:1", xff: []string{"192.0.2.1"}, want: "192.0.2.1"},
		{name: "hops no header", hops: 1, peer: "192.0.2.7:1", want: "192.0.2.7"},
		{name: "hops malformed", hops: 1, peer: "10.9.9.9:1", xff: []string{"192.0.2.1, x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig()
			cfg.TrustedProxies, cfg.TrustedHops = tt.trusted, tt.hops
			st, err := compile(cfg, map[string]*upstream{})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.peer
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got, ok := st.clientIP(r)
			if tt.want == "" && ok || tt.want != "" && (!ok || got != tt.want) {
				t.Errorf("clientIP(%s, %q) = %q, %v; want %q", tt.peer, tt.xff, got, ok, tt.want)
			}
		})
	}
}

// TestTrustedProxySecret: with trusted_proxy_secret, an address inside
// trusted_proxies is believed only with the secret, so no other host in
// the range can state a client address or a user (issue 9: trusted CIDRs
// let any host inside the range pick its own identity); the secret never
// reaches the upstream.
func TestTrustedProxySecret(t *testing.T) {
	up := headerUpstream(t)
	cfg := testConfig(up.URL)
	cfg.UserHeader = "X-User-ID"
	cfg.TrustedProxies = []string{"127.0.0.0/8"}
	cfg.TrustedProxySecret = "proxy-proof-0123456789"
	gw := startGateway(t, cfg, Options{})
	for _, tt := range []struct {
		name, proof      string
		wantXFF, wantUsr string
	}{
		{"no secret", "", "127.0.0.1", ""},
		{"wrong secret", "guess", "127.0.0.1", ""},
		{"the secret", "proxy-proof-0123456789", "192.0.2.9, 127.0.0.1", "alice"},
	} {
		hdr := []string{"X-Forwarded-For", "192.0.2.9", "X-User-ID", "alice"}
		if tt.proof != "" {
			hdr = append(hdr, ProxySecretHeader, tt.proof)
		}
		r := get(t, gw.URL+"/x", hdr...)
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d %s", tt.name, r.status, r.body)
		}
		var got http.Header
		r.json(t, &got)
		if xff, usr := strings.Join(got["X-Forwarded-For"], ","), got.Get("X-User-Id"); xff != tt.wantXFF || usr != tt.wantUsr {
			t.Errorf("%s: upstream saw X-Forwarded-For %q, user %q; want %q, %q", tt.name, xff, usr, tt.wantXFF, tt.wantUsr)
		}
		if v := got.Get(ProxySecretHeader); v != "" {
			t.Errorf("%s: the proxy's secret reached the upstream: %q", tt.name, v)
		}
	}
}

// TestOneUser: a trusted proxy that adds its user header instead of
// replacing the client's leaves two users; the client's comes first, so
// believing the first let a client name any user, a fresh budget each.
// Two different users are refused; one, repeated or beside an empty
// field, is the user.
func TestOneUser(t *testing.T) {
	lim, _ := redisStore(t)
	up := newPathUpstream(t)
	cfg := testConfig(up.URL)
	cfg.Plans["users"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 7, Period: time.Minute}}}}
	cfg.UserHeader, cfg.UserPlan = "X-User-ID", "users"
	cfg.TrustedProxies = []string{"127.0.0.0/8"}
	gw := startGateway(t, cfg, Options{Store: lim})
	for _, tt := range []struct {
		give       string // header lines
		wantStatus int
		wantLimit  string
	}{
		{"X-User-ID: mallory-" + randHex(4) + "\r\nX-User-ID: alice\r\n", 400, ""},
		{"X-User-ID: alice\r\nX-User-ID: alice\r\n", 200, "7"},
		{"X-User-ID:\r\nX-User-ID: alice\r\n", 200, "7"},
		{"X-User-ID: alice\r\n", 200, "7"},
	} {
		r := rawDo(t, gw.URL, "GET /x HTTP/1.1\r\nHost: gw\r\n"+tt.give+"Connection: close\r\n\r\n")
		if r.status != tt.wantStatus || r.header.Get("X-RateLimit-Limit") != tt.wantLimit {
			t.Errorf("GET with %q = %d limit %q, want %d limit %q (%s)", tt.give, r.status, r.header.Get("X-RateLimit-Limit"), tt.wantStatus, tt.wantLimit, r.body)
		}
		if seen := up.take(); tt.wantStatus != 200 && len(seen) != 0 {
			t.Errorf("GET with %q: upstream received %q, want nothing", tt.give, seen)
		}
	}
}
