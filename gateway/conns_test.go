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
