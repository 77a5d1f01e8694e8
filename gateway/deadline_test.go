package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// streamConfig has listener timeouts of 400ms and 600ms: far shorter than
// the transfers below, which stay active throughout.
func streamConfig(upstreamURL string) Config {
	cfg := testConfig(upstreamURL)
	cfg.Timeouts = Timeouts{Read: 400 * time.Millisecond, Write: 600 * time.Millisecond}
	cfg.Upstreams["app"] = Upstream{URL: upstreamURL, Timeout: 300 * time.Millisecond}
	return cfg
}

// streamThrough asks a gateway with streamConfig for /events from an
// upstream that streams with send, and returns the response, its body
// closed when the test ends.
func streamThrough(t *testing.T, send http.HandlerFunc) *http.Response {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		send(w, r)
	}))
	t.Cleanup(up.Close)
	gw := startGateway(t, streamConfig(up.URL), Options{})
	resp, err := client.Get(gw.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestStreamingOutlivesWriteTimeout: an SSE stream that sends an event
// every 50ms runs past the write (and read) timeout to its end.
func TestStreamingOutlivesWriteTimeout(t *testing.T) {
	const events = 30 // 1.5s
	resp := streamThrough(t, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for i := range events {
			fmt.Fprintf(w, "data: %d\n\n", i)
			_ = rc.Flush()
			time.Sleep(50 * time.Millisecond)
		}
	})
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			n++
		}
	}
	if n != events {
		t.Fatalf("got %d of %d events (%v): the stream was cut", n, events, sc.Err())
	}
}

// TestStalledStreamCut: a stream that stops sending is still cut.
func TestStalledStreamCut(t *testing.T) {
	resp := streamThrough(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: first\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a stalled stream was still open after 5s; write timeout 600ms")
	}
}

// TestSlowActiveUpload: a body sent a little at a time over 1.2s, past
// the 400ms read timeout, reaches the upstream whole.
func TestSlowActiveUpload(t *testing.T) {
	up := newTestUpstream(t)
	gw := startGateway(t, streamConfig(up.URL), Options{})
	pr, pw := io.Pipe()
	go func() {
		for range 24 {
			_, _ = pw.Write([]byte("0123456789"))
			time.Sleep(50 * time.Millisecond)
		}
		_ = pw.Close()
	}()
	res := do(t, http.MethodPost, gw.URL+"/upload", pr)
	var s seen
	if res.status != http.StatusOK {
		t.Fatalf("slow upload = %d %s, want 200", res.status, res.body)
	}
	res.json(t, &s)
	if s.Body != 240 {
		t.Errorf("upstream read %d bytes, want 240", s.Body)
	}
}

// TestStalledUpload: a body that stops arriving gets 408.
func TestStalledUpload(t *testing.T) {
	up := newTestUpstream(t)
	gw := startGateway(t, streamConfig(up.URL), Options{})
	res := rawDo(t, gw.URL, "POST /upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\nhalf")
	if res.status != http.StatusRequestTimeout {
		t.Errorf("stalled upload = %d, want 408", res.status)
	}
}

// TestFraming: framing errors are 400 and end the connection.
func TestFraming(t *testing.T) {
	up := newTestUpstream(t)
	gw := startGateway(t, testConfig(up.URL), Options{})
	tests := []struct {
		name, req  string
		wantStatus int
	}{
		{"malformed chunk size", "POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400},
		{"chunk longer than said", "POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n", 400},
		{"connect", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405},
		{"content-length with chunked", "POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400},
		{"chunked with content-length", "POST /x HTTP/1.1\r\nHost: gw\r\ntransfer-encoding: chunked\r\ncontent-length: 30\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: gw\r\n\r\n", 400},
		// net/http ignores Transfer-Encoding in HTTP/1.0 and would frame by
		// Content-Length, or take the chunked body for the next request.
		{"http/1.0 chunked with content-length", "POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 30\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: gw\r\n\r\n", 400},
		{"http/1.0 chunked", "POST /x HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: gw\r\n\r\n", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, br := rawConn(t, gw.URL, tt.req)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s = %d %s %s, want %d problem+json", tt.name, resp.StatusCode, resp.Header.Get("Content-Type"), body, tt.wantStatus)
			}
			if tt.wantStatus == 405 {
				if !strings.Contains(string(body), "method-not-allowed") || resp.Header.Get("Allow") == "" {
					t.Errorf("CONNECT answer %s Allow %q, want a method-not-allowed problem and Allow", body, resp.Header.Get("Allow"))
				}
				return
			}
			// The connection is closed after the answer.
			if _, err := br.ReadByte(); err == nil {
				t.Errorf("connection still open after a framing error")
			}
		})
	}
}

// TestFramingScan: the scanner finds Content-Length and Transfer-Encoding
// in one head however the bytes are split across reads, and not in
// separate heads or in a chunked request alone.
func TestFramingScan(t *testing.T) {
	tests := []struct {
		name string
		give string
		want bool
	}{
		{"both", "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", true},
		{"both other order, any case", "POST / HTTP/1.1\r\ntransfer-ENCODING: chunked\r\nHost: x\r\nCONTENT-length: 3\r\n\r\n", true},
		{"bare newlines", "POST / HTTP/1.1\nContent-Length: 3\nTransfer-Encoding: chunked\n\n", true},
		{"chunked only", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false},
		{"two requests", "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcPOST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
		{"content-transfer-encoding is not it", "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Transfer-Encoding: base64\r\n\r\n", false},
	}
	for _, tt := range tests {
		for split := 1; split <= len(tt.give); split++ {
			c := &framingConn{}
			for b := []byte(tt.give); len(b) > 0; {
				n := min(split, len(b))
				c.scan(b[:n])
				b = b[n:]
			}
			if got := c.mixed.Load(); got != tt.want {
				t.Errorf("%s, read %d bytes at a time: mixed = %v, want %v", tt.name, split, got, tt.want)
				break
			}
		}
	}
}

// TestRouteIdleBounds: a route may set its own idle bounds. A stream that
// pauses 1s between events is cut by the listener's 600ms write bound, and
// runs to its end on a route whose write_idle is 3s (issue 9: idle
// timeouts per route where it matters).
func TestRouteIdleBounds(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 2 {
			if i > 0 {
				select {
				case <-time.After(time.Second):
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			_ = rc.Flush()
		}
	}))
	t.Cleanup(up.Close)
	cfg := streamConfig(up.URL)
	cfg.Routes = append(cfg.Routes, Route{Name: "slow", PathPrefix: "/slow", Upstream: "app", WriteIdle: 3 * time.Second})
	gw := startGateway(t, cfg, Options{})
	events := func(path string) int {
		resp, err := client.Get(gw.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n := 0
		for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
			if strings.HasPrefix(sc.Text(), "data: ") {
				n++
			}
		}
		return n
	}
	if n := events("/slow/events"); n != 2 {
		t.Errorf("route with write_idle 3s: got %d of 2 events, want the whole stream", n)
	}
	if n := events("/events"); n != 1 {
		t.Errorf("route with the listener's 600ms bound: got %d events, want the stream cut after the first", n)
	}

	bad := streamConfig(up.URL)
	bad.Routes = append(bad.Routes, Route{Name: "slow", PathPrefix: "/slow", Upstream: "app", WriteIdle: 100 * time.Millisecond})
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "routes[1].write_idle") {
		t.Errorf("write_idle below the upstream's timeout: Validate = %v, want an error naming routes[1].write_idle", err)
	}
}

// TestMalformedChunkedNotCharged: a chunked body that turns out malformed
// within its first prefetchBytes is refused (400, the connection closed)
// before the request is decided: the upstream never sees its head and the
// caller's key is not charged (only its address's auth failure bucket, as
// for every refusal before a decision). A well-formed one goes upstream
// whole. Before, the head was forwarded and the key charged,
// then the 400 came.
func TestMalformedChunkedNotCharged(t *testing.T) {
	var heads atomic.Int64
	var mu sync.Mutex
	var bodies []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		heads.Add(1)
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	t.Cleanup(up.Close)
	const key = "chunked-key"
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 5, Period: time.Minute}}}}
		cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha(key), Plan: "free"}}
	})
	head := "POST /x HTTP/1.1\r\nHost: gw\r\nX-API-Key: " + key + "\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
	tests := []struct {
		name, body string
	}{
		{"chunk longer than said", "3\r\nabcdef\r\n0\r\n\r\n"},
		{"bad chunk size", "zz\r\nabc\r\n0\r\n\r\n"},
		{"bad size after a good chunk", "3\r\nabc\r\nq\r\nabc\r\n0\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rejected := counter(t, gw.m.rejected.WithLabelValues("malformed_body"))
			_, br := rawConn(t, gw.URL, head+"\r\n"+tt.body)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("malformed chunked body = %d %s, want 400 problem+json", resp.StatusCode, b)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Errorf("connection still open after a framing error")
			}
			if n := counter(t, gw.m.rejected.WithLabelValues("malformed_body")) - rejected; n != 1 {
				t.Errorf("rejected_total{reason=\"malformed_body\"} rose by %v, want 1", n)
			}
		})
	}
	// The key's bucket is untouched: its first charged request leaves 4
	// of 5, and it is the first request the upstream sees.
	r := rawDo(t, gw.URL, head+"Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
	if r.status != http.StatusOK {
		t.Fatalf("well-formed chunked body = %d %s, want 200", r.status, r.body)
	}
	if got := r.header.Get(hRemaining); got != "4" {
		t.Errorf("after %d malformed chunked bodies the key has %s of 5 left, want 4: they were charged", len(tests), got)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := heads.Load(); n != 1 || len(bodies) != 1 || bodies[0] != "abcde" {
		t.Errorf("the upstream saw %d heads and bodies %q, want one, \"abcde\"", n, bodies)
	}
}
