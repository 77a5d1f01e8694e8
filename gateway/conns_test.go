package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestConnectionCap: connections over max_connections are closed on
// accept; a freed slot serves again.
func TestConnectionCap(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.MaxConnections = 2
	gw := startGateway(t, cfg, Options{})
	addr := strings.TrimPrefix(gw.URL, "http://")

	// askOn sends one keep-alive request on conn: its status, or 0 when
	// the gateway closed the connection instead.
	askOn := func(conn net.Conn) int {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: gw\r\n\r\n"); err != nil {
			return 0
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial()
	if sa, sb := askOn(a), askOn(b); sa != 200 || sb != 200 {
		t.Fatalf("first two connections = %d, %d, want 200", sa, sb)
	}
	if s := askOn(dial()); s != 0 {
		t.Fatalf("third connection = %d, want closed", s)
	}
	if n := counter(t, gw.m.rejected.WithLabelValues("too_many_connections")); n != 1 {
		t.Errorf("rejected{too_many_connections} = %v, want 1", n)
	}
	a.Close()
	testenv.WaitFor(t, 5*time.Second, "a freed connection slot", func() bool { return askOn(dial()) == 200 })
}

// TestHugeHeaderAnswered: through Listener, a 431 still reaches a client
// that sent more than was read (net/http half-closes the connection, so
// the client reads the answer rather than a reset).
func TestHugeHeaderAnswered(t *testing.T) {
	up := newTestUpstream(t)
	cfg := testConfig(up.URL)
	cfg.MaxHeaderBytes = 4 << 10
	gw := startGateway(t, cfg, Options{})
	for range 5 {
		if r := get(t, gw.URL+"/", "X-Junk", strings.Repeat("a", 64<<10)); r.status != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("huge header: status %d, want 431", r.status)
		}
	}
}

// TestUnreadableRequestsAnsweredAsProblems: the answers net/http writes by
// itself, for a request it cannot read, are problem bodies like every
// other answer of the gateway, and counted: a client or probe branching
// on application/problem+json sees no text/plain from the gateway.
func TestUnreadableRequestsAnsweredAsProblems(t *testing.T) {
	gw := redisGateway(t, func(cfg *Config) { cfg.MaxHeaderBytes = 4 << 10 })
	tests := []struct {
		name       string
		give       string
		wantStatus int
		wantType   string
		wantReason string
		wantDetail string
	}{
		{"header line without a colon", "GET /x HTTP/1.1\r\nHost: gw\r\nX-API-Key k\r\n\r\n",
			http.StatusBadRequest, probBadRequest, "malformed_request", "malformed request line or header"},
		{"no host", "GET /x HTTP/1.1\r\nX-API-Key: k\r\n\r\n",
			http.StatusBadRequest, probBadRequest, "malformed_request", "missing required Host header"},
		{"bad method", "G(T /x HTTP/1.1\r\nHost: gw\r\n\r\n",
			http.StatusBadRequest, probBadRequest, "malformed_request", "malformed request line"},
		{"header fields too large", "GET /x HTTP/1.1\r\nHost: gw\r\nX-Junk: " + strings.Repeat("a", 64<<10) + "\r\n\r\n",
			http.StatusRequestHeaderFieldsTooLarge, probHeadersTooLarge, "headers_too_large", "larger than"},
		{"unknown transfer coding", "POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip\r\n\r\n",
			http.StatusNotImplemented, probBadRequest, "unsupported_transfer_encoding", "only chunked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := counter(t, gw.m.rejected.WithLabelValues(tt.wantReason))
			r := rawDo(t, gw.URL, tt.give)
			if ct := r.header.Get("Content-Type"); r.status != tt.wantStatus || ct != "application/problem+json" {
				t.Fatalf("%q = %d %q %s, want %d application/problem+json", tt.give[:min(len(tt.give), 40)], r.status, ct, r.body, tt.wantStatus)
			}
			var p problem
			r.json(t, &p)
			if p.Type != tt.wantType || p.Status != tt.wantStatus || p.Title != http.StatusText(tt.wantStatus) || !strings.Contains(p.Detail, tt.wantDetail) {
				t.Errorf("problem = %+v, want type %s, status %d, detail with %q", p, tt.wantType, tt.wantStatus, tt.wantDetail)
			}
			if n := counter(t, gw.m.rejected.WithLabelValues(tt.wantReason)); n != before+1 {
				t.Errorf("rejected_total{reason=%q} = %v, want %v", tt.wantReason, n, before+1)
			}
		})
	}
	// A handler's answer of the same status is left as it is.
	if r := rawDo(t, gw.URL, "GET /a%2fb HTTP/1.1\r\nHost: gw\r\n\r\n"); r.status != http.StatusBadRequest || r.header.Get("Date") == "" {
		t.Errorf("ambiguous path: %d Date %q, want the gateway's own 400 with a Date", r.status, r.header.Get("Date"))
	}
}
