package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// TestMethodOverride: a POST whose query, form, multipart form or JSON
// body names, as _method, a method limited on another route is refused
// with 400, and never reaches the upstream whole: Laravel, Express and
// Spring read the override from the query, Rails, Laravel, Spring and
// ASP.NET from the body once it is all in. Every other request goes
// upstream as sent, its body byte for byte however large. Before, such a
// POST was charged as a POST and run as the other method.
func TestMethodOverride(t *testing.T) {
	up := newPathUpstream(t)
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000, Period: time.Minute}}}}
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Routes = []Route{
			{Name: "all", PathPrefix: "/", Upstream: "app"},
			{Name: "delete", PathPrefix: "/v1/items", Methods: []string{"DELETE", "OPTIONS"}, Upstream: "app", Cost: 10},
		}
	})
	const form = "application/x-www-form-urlencoded"
	big := strings.Repeat("x", 3<<20)
	multipartBody := func(dispType, name, value string) string {
		return "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n" + big + "\r\n" +
			"--B\r\nContent-Disposition: " + dispType + "; name=\"" + name + "\"\r\n\r\n" + value + "\r\n--B--\r\n"
	}
	tests := []struct {
		name        string
		method      string
		target      string
		contentType string
		body        string
		chunked     bool
		wantStatus  int
		encoding    string // Content-Encoding
	}{
		{"query", "POST", "/v1/items/7?_method=DELETE", "", "", false, 400, ""},
		{"query lower-case value", "POST", "/v1/items/7?_method=delete", "", "", false, 400, ""},
		{"query escaped name", "POST", "/v1/items/7?%5Fmethod=DELETE", "", "", false, 400, ""},
		{"query after a semicolon", "POST", "/v1/items/7?a=1;_method=DELETE", "", "", false, 400, ""},
		{"query upper-case name", "POST", "/v1/items/7?_METHOD=DELETE", "", "", false, 400, ""},
		{"query one of two", "POST", "/v1/items/7?_method=PUT&_method=DELETE", "", "", false, 400, ""},
		{"query lower-case post", "post", "/v1/items/7?_method=DELETE", "", "", false, 400, ""},
		{"query php leading spaces", "POST", "/v1/items/7?+%20_method=DELETE", "", "", false, 400, ""},
		{"query php nul", "POST", "/v1/items/7?_method%00x=DELETE", "", "", false, 400, ""},
		{"query asp.net field", "POST", "/v1/items/7?X-HTTP-Method-Override=DELETE", "", "", false, 400, ""},
		{"query asp.net %u escapes", "POST", "/v1/items/7?X%u002DHTTP-Method-Override=%u0044ELETE", "", "", false, 400, ""},
		{"query value upper-cased as ruby and js do", "POST", "/v1/items/7?_method=opt%C4%B1ons", "", "", false, 400, ""},
		{"query same route", "POST", "/v1/items/7?_method=PUT", "", "", false, 200, ""},
		{"query elsewhere", "POST", "/v1/other?_method=DELETE", "", "", false, 200, ""},
		{"query not a POST", "GET", "/v1/items/7?_method=DELETE", "", "", false, 200, ""},
		{"query empty", "POST", "/v1/items/7?_method=", "", "", false, 200, ""},
		{"query another parameter", "POST", "/v1/items/7?method=DELETE", "", "", false, 200, ""},
		{"form", "POST", "/v1/items/7", form, "a=1&_method=DELETE", false, 400, ""},
		{"form after a large field", "POST", "/v1/items/7", form, "a=" + big + "&_method=delete", false, 400, ""},
		{"form chunked", "POST", "/v1/items/7", form + "; charset=utf-8", "_method=DELETE&a=1", true, 400, ""},
		{"form escaped name", "POST", "/v1/items/7", form, "%5Fmethod=DELETE", false, 400, ""},
		{"no content type", "POST", "/v1/items/7", "", "_method=DELETE", false, 400, ""},
		{"multipart after a file", "POST", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody("form-data", "_method", "DELETE"), false, 400, ""},
		{"multipart other disposition", "POST", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody("attachment", "_method", "DELETE"), true, 400, ""},
		{"json", "POST", "/v1/items/7", "application/json", `{"a":[1,{"_method":"PUT"}],"_method":"DELETE"}`, false, 400, ""},
		{"form php leading spaces", "POST", "/v1/items/7", form, "a=1&" + strings.Repeat("+%20", 40) + "_method=DELETE", false, 400, ""},
		{"form php nul before a long tail", "POST", "/v1/items/7", form, "_method%00" + strings.Repeat("x", 100) + "=DELETE", false, 400, ""},
		{"form rack 2 brackets", "POST", "/v1/items/7", form, "a=1&[_method]=DELETE", false, 400, ""},
		{"form rack 2 brackets however many", "POST", "/v1/items/7", form, strings.Repeat("[", 200) + "_method" + strings.Repeat("]", 200) + "=DELETE", false, 400, ""},
		{"form rack 2 escaped brackets however many", "POST", "/v1/items/7", form, strings.Repeat("%5b", 100) + "_method" + strings.Repeat("%5D", 100) + "=DELETE", false, 400, ""},
		{"form asp.net field", "POST", "/v1/items/7", form, "X-HTTP-Method-Override=DELETE", false, 400, ""},
		{"form asp.net field escaped", "POST", "/v1/items/7", form, escapeAll("X-HTTP-Method-Override") + "=DELETE", false, 400, ""},
		{"multipart mixed (rack)", "POST", "/v1/items/7", "multipart/mixed; boundary=B", multipartBody("form-data", "_method", "DELETE"), false, 400, ""},
		{"multipart comma before the boundary (php, rack)", "POST", "/v1/items/7", "multipart/form-data, boundary=B", multipartBody("form-data", "_method", "DELETE"), false, 400, ""},
		{"multipart second boundary (rack reads the last)", "POST", "/v1/items/7", "multipart/form-data; boundary=A; x-boundary=B", multipartBody("form-data", "_method", "DELETE"), false, 400, ""},
		{"multipart part named twice (php reads the last)", "POST", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody(`form-data; name="note"`, "_method", "DELETE"), false, 400, ""},
		{"form gzip (express inflates)", "POST", "/v1/items/7", form, encode("a=1&_method=DELETE", "gzip"), false, 400, "gzip"},
		{"form x-gzip", "POST", "/v1/items/7", form, encode("_method=DELETE", "gzip"), true, 400, "x-gzip"},
		{"form deflate (express: zlib)", "POST", "/v1/items/7", form, encode("_method=DELETE", "zlib"), false, 400, "deflate"},
		{"form raw deflate (asp.net core)", "POST", "/v1/items/7", form, encode("_method=DELETE", "flate"), false, 400, "Deflate"},
		{"form gzip without override", "POST", "/v1/items/7", form, encode("a=1&b="+big, "gzip"), false, 200, "gzip"},
		{"form same route", "POST", "/v1/items/7", form, "_method=PUT&a=" + big, false, 200, ""},
		{"form without override", "POST", "/v1/items/7", form, "a=1&b=_method", false, 200, ""},
		{"multipart without override", "POST", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody("form-data", "note", "_method=DELETE"), true, 200, ""},
		{"multipart two boundaries without override", "POST", "/v1/items/7", "multipart/related; boundary=A; x-boundary=B", multipartBody("form-data", "note", "DELETE"), true, 200, ""},
		{"json by laravel's reading of the type", "POST", "/v1/items/7", "text/json", `{"_method":"DELETE"}`, false, 400, ""},
		{"json escaped key after a large value", "POST", "/v1/items/7", "application/json", `{"a":"` + big + `","b":[1,{"c":"]\"}"}],"\u005fmethod":"DELETE"}`, true, 400, ""},
		{"json large without override", "POST", "/v1/items/7", "application/json", `{"a":"` + big + `","b":[1,{"_method":"DELETE"}],"c":-1.5e3}`, true, 200, ""},
		{"json nested only", "POST", "/v1/items/7", "application/json", `{"a":{"_method":"DELETE"},"b":"_method"}`, false, 200, ""},
		{"text", "POST", "/v1/items/7", "text/plain", "_method=DELETE", false, 200, ""},
		{"body elsewhere", "POST", "/v1/other", form, "_method=DELETE", false, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.method + " " + tt.target + " HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
			if tt.contentType != "" {
				req += "Content-Type: " + tt.contentType + "\r\n"
			}
			if tt.encoding != "" {
				req += "Content-Encoding: " + tt.encoding + "\r\n"
			}
			if tt.chunked {
				req += "Transfer-Encoding: chunked\r\n\r\n"
				for rest := tt.body; rest != ""; {
					n := min(len(rest), 64<<10)
					req += fmt.Sprintf("%x\r\n%s\r\n", n, rest[:n])
					rest = rest[n:]
				}
				req += "0\r\n\r\n"
			} else {
				req += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(tt.body), tt.body)
			}
			r := rawDo(t, gw.URL, req)
			if r.status != tt.wantStatus {
				t.Errorf("%s %s (%q, %d bytes) = %d, want %d (%s)", tt.method, tt.target, tt.contentType, len(tt.body), r.status, tt.wantStatus, r.body)
			}
			got := up.takeRequests()
			switch {
			case tt.wantStatus != 200 && len(got) != 0:
				t.Errorf("%s %s (%q): the upstream received the request whole, want it cut short or not sent", tt.method, tt.target, tt.contentType)
			case tt.wantStatus == 200 && (len(got) != 1 || !bytes.Equal(got[0].body, []byte(tt.body))):
				t.Errorf("%s %s (%q): the upstream received %d whole requests, want the one sent, byte for byte", tt.method, tt.target, tt.contentType, len(got))
			}
		})
	}
}

// escapeAll percent-escapes every byte of s, the longest spelling of a
// form field's name.
func escapeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// TestMethodOverrideUnrouted: where the only route at a path lists its
// methods, a body naming another method is refused as the query is: the
// upstream would run a method the gateway routes nowhere there. Before,
// bodies were scanned only where a second route covered the path.
func TestMethodOverrideUnrouted(t *testing.T) {
	up := newPathUpstream(t)
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Routes = []Route{{Name: "orders", PathPrefix: "/v1/orders", Methods: []string{"POST"}, Upstream: "app"}}
	})
	for _, tt := range []struct {
		body       string
		wantStatus int
	}{
		{"_method=DELETE", 400},
		{"_method=post&a=1", 200},
	} {
		r := rawDo(t, gw.URL, fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: gw\r\nContent-Type: application/x-www-form-urlencoded\r\n"+
			"Content-Length: %d\r\nConnection: close\r\n\r\n%s", len(tt.body), tt.body))
		if got := up.takeRequests(); r.status != tt.wantStatus || (tt.wantStatus == 400) != (len(got) == 0) {
			t.Errorf("POST /v1/orders %q = %d, upstream got %d whole requests; want %d", tt.body, r.status, len(got), tt.wantStatus)
		}
	}
}

// TestOverrideScanMemory: scanning a JSON body for _method holds no more
// than a few buffers, whatever the size of its values. Before, the
// decoder held each whole top-level value (a 32 MiB string: 32 MiB and a
// copy) for every request in flight.
func TestOverrideScanMemory(t *testing.T) {
	const size = 32 << 20
	body := io.MultiReader(strings.NewReader(`{"a":"`), io.LimitReader(repeatReader('x'), size), strings.NewReader(`","_method":"DELETE"}`))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := newBodyScanner(io.NopCloser(body), refuseField("_method", "DELETE", bodyParsers("application/json", overrideParams)))
	n, err := io.Copy(io.Discard, s)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errMethodOverride) {
		t.Fatalf("scanning %d bytes = %v, want errMethodOverride", n, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("scanning a %d MiB JSON value allocated %d KiB, want at most 4 MiB", size>>20, got>>10)
	}
}

// refuseField is a scan that refuses, as a method override, a body
// whose field name holds value.
func refuseField(name, value string, parsers []parser) func(io.Reader) error {
	return func(r io.Reader) error {
		var mu sync.Mutex
		var found bool
		err := parseEach(r, parsers, func(n, v string) {
			mu.Lock()
			defer mu.Unlock()
			found = found || n == name && v == value
		})
		if found {
			return errMethodOverride
		}
		return err
	}
}

// repeatReader reads as an endless run of one byte.
type repeatReader byte

func (c repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

// TestOverrideScanOneByteReads: the scanner passes a body through to a
// reader that asks for one byte at a time, as any io.Reader must. Before,
// a one-byte read returned nothing once a byte was held back, for ever.
func TestOverrideScanOneByteReads(t *testing.T) {
	body := "a=1&b=" + strings.Repeat("x", 100)
	s := newBodyScanner(io.NopCloser(strings.NewReader(body)), refuseField("_method", "DELETE", bodyParsers("application/x-www-form-urlencoded", overrideParams)))
	var got []byte
	var err error
	for range 2 * len(body) { // bounded: a reader that makes no progress fails
		var one [1]byte
		var n int
		n, err = s.Read(one[:])
		got = append(got, one[:n]...)
		if err != nil {
			break
		}
	}
	if string(got) != body || err != io.EOF {
		t.Errorf("one-byte reads got %d bytes, %v; want the %d-byte body and EOF", len(got), err, len(body))
	}
}
