package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// echoTunnelUpstream switches any protocol it is asked to and echoes
// what it reads; it counts the tunnels it opened.
func echoTunnelUpstream(t *testing.T, opened *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := r.Header.Get("Upgrade")
		if up == "" {
			_, _ = io.WriteString(w, "plain "+r.Proto)
			return
		}
		opened.Add(1)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + up + "\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(conn, brw)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// dialUpgrade asks the gateway to switch path's connection to proto and
// returns the connection, its reader and the response.
func dialUpgrade(t *testing.T, gwURL, path, proto string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, br := rawConn(t, gwURL, "GET "+path+" HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: "+proto+"\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

func TestUpgrades(t *testing.T) {
	var opened atomic.Int64
	up := echoTunnelUpstream(t, &opened)
	cfg := testConfig(up.URL)
	cfg.Routes = []Route{
		{Name: "all", PathPrefix: "/", Upstream: "app"},
		{Name: "ws", PathPrefix: "/ws", Upstream: "app", Upgrades: []string{"websocket"}, Cost: 2, TunnelMaxDuration: 300 * time.Millisecond},
	}
	gw := startGateway(t, cfg, Options{})

	t.Run("not configured", func(t *testing.T) {
		_, _, resp := dialUpgrade(t, gw.URL, "/x", "websocket")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("websocket on a route without upgrades = %d, want 400", resp.StatusCode)
		}
		_, _, resp = dialUpgrade(t, gw.URL, "/ws", "evil-tunnel")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("unlisted protocol = %d, want 400", resp.StatusCode)
		}
		if n := opened.Load(); n != 0 {
			t.Errorf("upstream opened %d tunnels, want 0", n)
		}
	})
	t.Run("h2c ignored", func(t *testing.T) {
		_, br, resp := dialUpgrade(t, gw.URL, "/x", "h2c")
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
		_ = br
		if resp.StatusCode != http.StatusOK || string(b) != "plain HTTP/1.1" {
			t.Errorf("h2c offer = %d %q, want 200 as plain HTTP/1.1", resp.StatusCode, b)
		}
	})
	t.Run("websocket bounded", func(t *testing.T) {
		conn, br, resp := dialUpgrade(t, gw.URL, "/ws", "websocket")
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("websocket on /ws = %d, want 101", resp.StatusCode)
		}
		// Charged once, at the route's cost.
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != "2" {
			t.Errorf("X-RateLimit-Remaining %q, want 2 (5 - 1 for h2c - cost 2)", got)
		}
		_, _ = io.WriteString(conn, "ping")
		buf := make([]byte, 4)
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("echo = %q, %v", buf, err)
		}
		start := time.Now()
		_, err := br.ReadByte()
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("tunnel still open after %v, want closed at tunnel_max_duration", time.Since(start))
		}
		if err == nil {
			t.Fatal("read a byte nobody sent")
		}
	})
}
