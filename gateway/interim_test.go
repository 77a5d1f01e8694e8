package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestInterimResponses: an upstream's 103 Early Hints reaches the client
// with its own headers only, and the final status, headers, body and
// metrics are the upstream's final answer's.
func TestInterimResponses(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		final, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("X-Final", "yes")
		if final == http.StatusFound {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(final)
		_, _ = io.WriteString(w, "final body")
	}))
	t.Cleanup(up.Close)
	gw := startGateway(t, testConfig(up.URL), Options{})
	noRedirect := &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	for _, final := range []int{200, 404, 500, 302, 507} {
		t.Run(strconv.Itoa(final), func(t *testing.T) {
			var mu sync.Mutex
			var interim []int
			var interimHdr []textproto.MIMEHeader
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				mu.Lock()
				defer mu.Unlock()
				interim = append(interim, code)
				interimHdr = append(interimHdr, h)
				return nil
			}}
			req, _ := http.NewRequest("GET", gw.URL+"/"+strconv.Itoa(final), nil)
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != final || string(body) != "final body" {
				t.Errorf("GET /%d = %d %q, want %d %q", final, resp.StatusCode, body, final, "final body")
			}
			if resp.Header.Get("X-Final") != "yes" || resp.Header.Get("X-RateLimit-Limit") != "5" {
				t.Errorf("final headers %v: want X-Final and the gateway's X-RateLimit-Limit 5", resp.Header)
			}
			if final == 302 && resp.Header.Get("Location") != "/elsewhere" {
				t.Errorf("302 Location = %q", resp.Header.Get("Location"))
			}
			mu.Lock()
			defer mu.Unlock()
			if len(interim) != 1 || interim[0] != 103 || interimHdr[0].Get("Link") == "" {
				t.Fatalf("interim responses %v %v, want one 103 with Link", interim, interimHdr)
			}
			if interimHdr[0].Get("X-Ratelimit-Limit") != "" {
				t.Errorf("103 carries rate-limit headers: %v", interimHdr[0])
			}
			if n := counter(t, gw.m.requests.WithLabelValues("all", strconv.Itoa(final))); n != 1 {
				t.Errorf("requests_total{code=%d} = %v, want 1", final, n)
			}
			if n := counter(t, gw.m.requests.WithLabelValues("all", "103")); n != 0 {
				t.Errorf("requests_total{code=103} = %v, want 0", n)
			}
		})
	}
}

// TestExpectContinue: a client's Expect: 100-continue gets one 100 and
// then the upstream's final status, not 200.
func TestExpectContinue(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusInsufficientStorage)
		_, _ = io.WriteString(w, "stored "+strconv.Itoa(len(b)))
	}))
	t.Cleanup(up.Close)
	gw := startGateway(t, testConfig(up.URL), Options{})

	conn, br := rawConn(t, gw.URL, "PUT /upload HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("first response = %v, %v; want 100 Continue", resp, err)
	}
	_, _ = io.WriteString(conn, "hello")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInsufficientStorage || string(body) != "stored 5" {
		t.Fatalf("final response = %d %q, want 507 %q", resp.StatusCode, body, "stored 5")
	}
	if resp.Header.Get("X-RateLimit-Limit") == "" {
		t.Errorf("final response has no rate-limit headers: %v", resp.Header)
	}
	if n := counter(t, gw.m.requests.WithLabelValues("all", "507")); n != 1 {
		t.Errorf("requests_total{code=507} = %v, want 1", n)
	}
}

// TestUpstreamTrailers: an upstream's trailers reach the client, but
// never as rate-limit headers, declared or not: ReverseProxy passed them
// on after the body, and the client read the upstream's
// X-RateLimit-Remaining beside the gateway's.
func TestUpstreamTrailers(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-RateLimit-Remaining, RateLimit, X-Checksum")
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-RateLimit-Remaining", "999")
		w.Header().Set("RateLimit", `"minute";r=999;t=0`)
		w.Header().Set("X-Checksum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-RateLimit-Limit", "12345") // undeclared
	}))
	t.Cleanup(up.Close)
	gw := startGateway(t, testConfig(up.URL), Options{})
	resp, err := client.Get(gw.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "body" {
		t.Fatalf("body %q, %v", b, err)
	}
	for _, h := range rateHeaders {
		if v, ok := resp.Trailer[h]; ok {
			t.Errorf("trailer %s: %q, want none (the header says %q)", h, v, resp.Header.Get(h))
		}
	}
	if got := resp.Trailer.Get("X-Checksum"); got != "abc" {
		t.Errorf("trailer X-Checksum %q, want the upstream's abc", got)
	}
	if got := resp.Header.Get("X-RateLimit-Remaining"); got != "4" {
		t.Errorf("X-RateLimit-Remaining %q, want the gateway's 4", got)
	}
}
