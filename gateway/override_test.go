package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/edgelimit/edgelimit/limiter"
	"github.com/klauspost/compress/zstd"
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

// TestBodyScan: where the gateway reads a body (a POST where some method
// is another route's, for _method; any charged request with a form,
// multipart or JSON body, for an API key) it reads it as the upstream
// would, to its end, or refuses it, after the decision, with the
// rate-limit headers and a rejected_total reason. Before, br, zstd and
// stacked codings were read undecoded, a gzip body was read only up to
// max_body_bytes, a malformed multipart part ended the reading, and no
// body was read for API keys: each went upstream whole, run as DELETE or
// served as a key the request was not charged to.
func TestBodyScan(t *testing.T) {
	up := newPathUpstream(t)
	const key, other = "body-scan-key-1", "body-scan-key-2"
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000, Period: time.Minute}}}}
		cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha(key), Plan: "free"}, {ID: "other", SHA256: sha(other), Plan: "free"}}
		cfg.MaxBodyBytes = 1 << 20
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Routes = []Route{
			{Name: "all", PathPrefix: "/", Upstream: "app"},
			{Name: "health", PathPrefix: "/health", Upstream: "app", Exempt: true},
			{Name: "delete", PathPrefix: "/v1/items", Methods: []string{"DELETE"}, Upstream: "app", Cost: 10},
		}
	})
	const form, multi = "application/x-www-form-urlencoded", "multipart/form-data; boundary=B"
	part := func(name, value string) string {
		return "--B\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n"
	}
	padding := strings.Repeat("x", 2<<20) // decoded past max_body_bytes
	tests := []struct {
		name        string
		method      string
		target      string
		contentType string
		encoding    []string // Content-Encoding fields
		header      string   // another header line
		body        string
		wantStatus  int
		wantReason  string // rejected_total's
	}{
		// Codings the upstream decodes.
		{"br", "POST", "/v1/items/7", form, []string{"br"}, "", encode("_method=DELETE", "br"), 400, "method_override"},
		{"zstd", "POST", "/v1/items/7", form, []string{"zstd"}, "", encode("_method=DELETE", "zstd"), 400, "method_override"},
		{"gzip twice", "POST", "/v1/items/7", form, []string{"gzip, gzip"}, "", encode("_method=DELETE", "gzip", "gzip"), 400, "method_override"},
		{"gzip then br in two fields", "POST", "/v1/items/7", form, []string{"gzip", "br"}, "", encode("_method=DELETE", "gzip", "br"), 400, "method_override"},
		{"deflate then zstd", "POST", "/v1/items/7", form, []string{"deflate,zstd"}, "", encode("a=1&_method=DELETE", "zlib", "zstd"), 400, "method_override"},
		{"br without override", "POST", "/v1/items/7", form, []string{"br"}, "", encode("a=1&b=2", "br"), 200, ""},
		{"zstd then gzip without override", "POST", "/v1/items/7", form, []string{"zstd, gzip"}, "", encode("a=1", "zstd", "gzip"), 200, ""},
		{"unknown coding", "POST", "/v1/items/7", form, []string{"compress"}, "", "_method=DELETE", 415, "unsupported_encoding"},
		{"unknown coding under a known one", "POST", "/v1/items/7", form, []string{"x-compress, gzip"}, "", encode("_method=DELETE", "gzip"), 415, "unsupported_encoding"},
		{"five codings", "POST", "/v1/items/7", form, []string{"gzip,gzip,gzip,gzip,gzip"}, "", encode("a=1", "gzip", "gzip", "gzip", "gzip", "gzip"), 415, "unsupported_encoding"},
		{"brotli window of 16 MiB", "POST", "/v1/items/7", form, []string{"br"}, "", encode("_method=DELETE", "br24"), 415, "unsupported_encoding"},
		{"unknown coding, body not read", "POST", "/v1/items/7", "application/octet-stream", []string{"compress"}, "", "_method=DELETE", 200, ""},
		{"unknown coding, exempt route", "POST", "/health", "application/octet-stream", []string{"compress"}, "", "api_key=" + other, 200, ""},
		{"corrupt gzip", "POST", "/v1/items/7", form, []string{"gzip"}, "", encode("a=1&b=2", "gzip")[:15], 400, "malformed_body"},
		// Decoded past max_body_bytes.
		{"gzip padding before _method", "POST", "/v1/items/7", form, []string{"gzip"}, "", encode("a="+padding+"&_method=DELETE", "gzip"), 413, "body_too_large"},
		{"zstd padding", "POST", "/v1/items/7", form, []string{"zstd"}, "", encode("a="+padding, "zstd"), 413, "body_too_large"},
		{"gzip padding before a body key", "POST", "/v1/other", form, []string{"gzip"}, "", encode("a="+padding+"&api_key="+other, "gzip"), 413, "body_too_large"},
		{"gzip of a gzip spending megabytes on nothing", "POST", "/v1/other", form, []string{"gzip, gzip"}, "", encode(emptyBlocks("a=1", 2<<20), "gzip"), 413, "body_too_large"},
		// Multipart the gateway cannot read to its end.
		{"multipart malformed part before _method", "POST", "/v1/items/7", multi, nil, "",
			part("a", "1") + "--B\r\nnot a header\r\n\r\nx\r\n" + part("_method", "DELETE") + "--B--\r\n", 400, "malformed_body"},
		{"multipart without its closing delimiter", "POST", "/v1/items/7", multi, nil, "", part("a", "1"), 400, "malformed_body"},
		{"multipart without any delimiter", "POST", "/v1/items/7", multi, nil, "", "_method=DELETE", 400, "malformed_body"},
		{"multipart malformed part before a body key", "POST", "/v1/other", multi, nil, "",
			part("a", "1") + "--B\r\nnot a header\r\n\r\nx\r\n" + part("api_key", other) + "--B--\r\n", 400, "malformed_body"},
		{"multipart part after the closing delimiter (php reads on)", "POST", "/v1/items/7", multi, nil, "",
			part("a", "1") + "--B--\r\n" + part("_method", "DELETE") + "--B--\r\n", 400, "malformed_body"},
		{"multipart parts after a closing delimiter first", "POST", "/v1/items/7", multi, nil, "", "--B--\r\n" + part("_method", "DELETE") + "--B--\r\n", 400, "malformed_body"},
		{"multipart LF delimiter in a CRLF body (php)", "POST", "/v1/items/7", multi, nil, "",
			part("a", "1\n--B\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE") + "--B--\r\n", 400, "malformed_body"},
		{"multipart boundary mid-line (django)", "POST", "/v1/other", multi, nil, "",
			part("a", "x--B\r\nContent-Disposition: form-data; name=\"api_key\"\r\n\r\n"+key) + "--B--\r\n", 400, "malformed_body"},
		{"multipart name as rack 2 reads it", "POST", "/v1/items/7", multi, nil, "",
			"--B\r\nContent-Disposition: form-data; name=\"a\" name=_method\r\n\r\nDELETE\r\n--B--\r\n", 400, "method_override"},
		{"multipart name as rack 3 reads it", "POST", "/v1/items/7", multi, nil, "",
			"--B\r\nContent-Disposition: form-data; name=_method\"x\r\n\r\nDELETE\r\n--B--\r\n", 400, "method_override"},
		{"multipart name in another header (rack 2)", "POST", "/v1/other", multi, nil, "",
			"--B\r\nX-Note: Content-Disposition: form-data; name=api_key\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n" + key + "\r\n--B--\r\n", 400, "ambiguous_key"},
		{"multipart part head of a megabyte", "POST", "/v1/other", multi, nil, "",
			"--B\r\nContent-Disposition: form-data; name=\"a\"\r\nX: " + strings.Repeat("h", 1<<20-100) + "\r\n\r\n1\r\n--B--\r\n", 400, "malformed_body"},
		{"multipart whole", "POST", "/v1/items/7", multi, nil, "", part("a", "1") + part("b", "2") + "--B--\r\n", 200, ""},
		// API keys in the body.
		{"form key, charged to the address", "POST", "/v1/other", form, nil, "", "a=1&api_key=" + key, 400, "ambiguous_key"},
		{"form key beside another", "POST", "/v1/other", form, nil, "X-API-Key: " + key, "api_key=" + other, 400, "ambiguous_key"},
		{"form key as decided", "POST", "/v1/other", form, nil, "X-API-Key: " + key, "api_key=" + key + "&a=1", 200, ""},
		{"form key twice, the second another", "POST", "/v1/other", form, nil, "X-API-Key: " + key, "api_key=" + key + "&api_key=" + other, 400, "ambiguous_key"},
		{"json key twice, the last another (php)", "POST", "/v1/other", "application/json", nil, "X-API-Key: " + key, `{"api_key":"` + key + `","api_key":"` + other + `"}`, 400, "ambiguous_key"},
		{"form key as the query's", "POST", "/v1/other?apikey=" + key, form, nil, "", "apikey=" + key, 200, ""},
		{"form key php spelling", "POST", "/v1/other", form, nil, "X-API-Key: " + key, "api%5Fkey[]=" + other, 400, "ambiguous_key"},
		{"form bearer token", "POST", "/v1/other", form, nil, "Authorization: Bearer " + key, "access_token=" + other, 400, "ambiguous_key"},
		{"form key on a PUT", "PUT", "/v1/other", form, nil, "", "apikey=" + key, 400, "ambiguous_key"},
		{"form empty key", "POST", "/v1/other", form, nil, "", "api_key=&a=1", 200, ""},
		{"json key", "POST", "/v1/other", "application/json", nil, "", `{"a":[1],"apikey":"` + key + `"}`, 400, "ambiguous_key"},
		{"json key upper-case", "PATCH", "/v1/other", "application/json", nil, "X-API-Key: " + key, `{"API_KEY":"` + other + `"}`, 400, "ambiguous_key"},
		{"json key as decided", "POST", "/v1/other", "application/json", nil, "X-API-Key: " + key, `{"api_key":"` + key + `"}`, 200, ""},
		{"json key not a string", "POST", "/v1/other", "application/json", nil, "X-API-Key: " + key, `{"api_key":["` + other + `"]}`, 400, "ambiguous_key"},
		{"json key a number", "POST", "/v1/other", "application/json", nil, "", `{"b":1,"access_token":0}`, 400, "ambiguous_key"},
		{"json key null", "POST", "/v1/other", "application/json", nil, "", `{"api_key":null,"b":[1]}`, 200, ""},
		{"json nested key", "POST", "/v1/other", "application/json", nil, "", `{"a":{"api_key":"` + key + `"}}`, 200, ""},
		{"multipart key", "POST", "/v1/other", multi, nil, "", part("a", "1") + part("api_key", key) + "--B--\r\n", 400, "ambiguous_key"},
		{"gzip form key", "POST", "/v1/other", form, []string{"gzip"}, "", encode("api_key="+key, "gzip"), 400, "ambiguous_key"},
		{"long key", "POST", "/v1/other", form, nil, "X-API-Key: " + key, "api_key=" + key + strings.Repeat("k", 2000), 400, "ambiguous_key"},
		// Content types an upstream reads otherwise.
		{"two content types", "POST", "/v1/items/7", "text/plain", nil, "Content-Type: " + form, "_method=DELETE", 400, "ambiguous_content_type"},
		{"two content types, a body key", "POST", "/v1/other", "text/plain", nil, "Content-Type: " + form, "api_key=" + key, 400, "ambiguous_content_type"},
		{"the same content type twice", "POST", "/v1/other", form, nil, "Content-Type: " + form, "a=1", 200, ""},
		{"utf-16be form (tomcat, asp.net core)", "POST", "/v1/items/7", form + "; charset=UTF-16BE", nil, "",
			"%00_%00m%00e%00t%00h%00o%00d=%00D%00E%00L%00E%00T%00E", 415, "unsupported_charset"},
		{"utf-7 form (django)", "POST", "/v1/other", form + `; charset="utf-7"`, nil, "", "+AGE-pi+AF8-key=" + key, 415, "unsupported_charset"},
		{"utf-16 json", "POST", "/v1/other", "application/json; charset=utf-16", nil, "", `{}`, 415, "unsupported_charset"},
		{"charset in a malformed type", "POST", "/v1/items/7", form + "; charset=ibm037; =", nil, "", "a=1", 415, "unsupported_charset"},
		{"latin-1 form", "POST", "/v1/items/7", form + "; charset=ISO-8859-1", nil, "", "a=1", 200, ""},
		{"utf-8 form", "POST", "/v1/items/7", form + "; charset=utf-8", nil, "", "_method=DELETE", 400, "method_override"},
		{"utf-16 text not read", "POST", "/v1/items/7", "text/plain; charset=utf-16", nil, "", "_method=DELETE", 200, ""},
		{"form after a utf-8 bom (body-parser)", "POST", "/v1/other", form, nil, "", "\xEF\xBB\xBFapi_key=" + key, 400, "ambiguous_key"},
		{"json after a utf-8 bom (body-parser)", "POST", "/v1/other", "application/json", nil, "", "\xEF\xBB\xBF{\"api_key\":\"" + key + "\"}", 400, "ambiguous_key"},
		{"json in utf-16 (jackson)", "POST", "/v1/other", "application/json", nil, "", "{\x00\"\x00}\x00", 415, "unsupported_charset"},
		{"json in utf-16 with its bom", "POST", "/v1/other", "application/json", nil, "", "\xFF\xFE{\x00}\x00", 415, "unsupported_charset"},
		{"text body not read", "POST", "/v1/other", "text/plain", nil, "", "api_key=" + key, 200, ""},
		{"exempt route not read", "POST", "/health", form, nil, "", "api_key=" + key, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.method + " " + tt.target + " HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Type: " + tt.contentType + "\r\n"
			for _, e := range tt.encoding {
				req += "Content-Encoding: " + e + "\r\n"
			}
			if tt.header != "" {
				req += tt.header + "\r\n"
			}
			req += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(tt.body), tt.body)
			up.takeRequests() // what an earlier case let through is not this one's
			var rejected float64
			if tt.wantReason != "" {
				rejected = counter(t, gw.m.rejected.WithLabelValues(tt.wantReason))
			}
			r := rawDo(t, gw.URL, req)
			if r.status != tt.wantStatus {
				t.Fatalf("%s %s (%q, %q) = %d, want %d (%s)", tt.method, tt.target, tt.contentType, tt.encoding, r.status, tt.wantStatus, r.body)
			}
			got := up.takeRequests()
			if tt.wantStatus == http.StatusOK {
				if len(got) != 1 || !bytes.Equal(got[0].body, []byte(tt.body)) {
					t.Errorf("the upstream received %d whole requests, want the one sent, byte for byte", len(got))
				}
				return
			}
			if len(got) != 0 {
				t.Errorf("the upstream received the request whole, want it cut short or not sent")
			}
			if r.header.Get(hLimit) == "" || r.header.Get(hPolicy) == "" {
				t.Errorf("refusal %d has no rate-limit headers (%v), want the decision's", r.status, r.header)
			}
			if n := counter(t, gw.m.rejected.WithLabelValues(tt.wantReason)) - rejected; n != 1 {
				t.Errorf("rejected_total{reason=%q} rose by %v, want 1", tt.wantReason, n)
			}
		})
	}
}

// TestBodyKeyStreamingUpstream: an upstream that acts on a body before
// its end (Go's json.Decoder and multipart reader, Jackson: they stop at
// the end of the value or the closing delimiter) never serves a body key
// other than the one charged. Before, the scanner held back only the
// body's last byte: a trailing newline after the JSON, a multipart
// epilogue or a gzip trailer, so such an upstream had the whole key and
// served it while the gateway refused.
func TestBodyKeyStreamingUpstream(t *testing.T) {
	var mu sync.Mutex
	var served []string
	handled := map[string]chan struct{}{} // by X-Case: closed once the upstream handled it
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		done := handled[r.Header.Get("X-Case")]
		mu.Unlock()
		if done != nil {
			defer close(done)
		}
		var key string
		switch {
		case strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/"):
			key = r.FormValue("api_key")
		default:
			var body io.Reader = r.Body
			if r.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(r.Body)
				if err != nil {
					return
				}
				body = zr
			}
			var v struct {
				APIKey string `json:"api_key"`
			}
			if json.NewDecoder(body).Decode(&v) != nil {
				return
			}
			key = v.APIKey
		}
		if key != "" {
			mu.Lock()
			served = append(served, key)
			mu.Unlock()
		}
		_, _ = io.WriteString(w, "served\n")
	}))
	t.Cleanup(up.Close)
	const key, other = "stream-key-1", "stream-key-2"
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000, Period: time.Minute}}}}
		cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha(key), Plan: "free"}, {ID: "other", SHA256: sha(other), Plan: "free"}}
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
	})
	tests := []struct {
		name, contentType, encoding, body string
		noKey                             bool // no X-API-Key: charged to the address
	}{
		{"json, the key charged", "application/json", "", `{"api_key":"` + key + `"}` + "\n", false},
		{"json, charged to the address", "application/json", "", `{"api_key":"` + other + `"}` + "\n", true},
		{"json and a newline", "application/json", "", `{"api_key":"` + other + `"}` + "\n", false},
		{"json and spaces", "application/json", "", `{"api_key":"` + other + `"}` + strings.Repeat(" ", 1000), false},
		{"gzip json", "application/json", "gzip", encode(`{"api_key":"`+other+`"}`, "gzip"), false},
		{"multipart epilogue", "multipart/form-data; boundary=B", "",
			"--B\r\nContent-Disposition: form-data; name=\"api_key\"\r\n\r\n" + other + "\r\n--B--\r\nepilogue", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan struct{})
			mu.Lock()
			handled[tt.name] = done
			mu.Unlock()
			req := "POST /v1/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nX-Case: " + tt.name + "\r\nContent-Type: " + tt.contentType + "\r\n"
			if !tt.noKey {
				req += "X-API-Key: " + key + "\r\n"
			}
			if tt.encoding != "" {
				req += "Content-Encoding: " + tt.encoding + "\r\n"
			}
			r := rawDo(t, gw.URL, req+fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(tt.body), tt.body))
			select {
			case <-done: // its head went upstream: await what the upstream made of it
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream did not finish the request in 5s")
			}
			mu.Lock()
			got := served
			served = nil
			mu.Unlock()
			if strings.Contains(tt.body, key) {
				if r.status != http.StatusOK || len(got) != 1 || got[0] != key {
					t.Errorf("charged to acme, body key acme: %d %s, the upstream served %q; want 200 served as acme", r.status, r.body, got)
				}
				return
			}
			if r.status != http.StatusBadRequest || len(got) != 0 {
				t.Errorf("body key other: %d %s, the upstream served %q; want 400 and nothing served", r.status, r.body, got)
			}
			want := "other than the one this request was charged to"
			if tt.noKey {
				want = "charged to its address"
			}
			if !bytes.Contains(r.body, []byte(probBodyKey)) || !bytes.Contains(r.body, []byte(want)) || bytes.Contains(r.body, []byte(other)) {
				t.Errorf("body key other: problem %s, want type %s saying %q, without the key", r.body, probBodyKey, want)
			}
		})
	}
}

// emptyBlocks is s gzipped, followed by at least size bytes of empty
// deflate blocks: a stream that spends its input on no output.
func emptyBlocks(s string, size int) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = io.WriteString(w, s)
	for b.Len() < size {
		_ = w.Flush() // an empty stored block
	}
	_ = w.Close()
	return b.String()
}

// encode applies codings to s in order: "gzip", "zlib", "flate", "br",
// "br24" (brotli with a 16 MiB window) or "zstd".
func encode(s string, codings ...string) string {
	for _, c := range codings {
		var b bytes.Buffer
		var w io.WriteCloser
		switch c {
		case "gzip":
			w = gzip.NewWriter(&b)
		case "zlib":
			w = zlib.NewWriter(&b)
		case "flate":
			w, _ = flate.NewWriter(&b, flate.DefaultCompression)
		case "br":
			w = brotli.NewWriter(&b)
		case "br24":
			w = brotli.NewWriterOptions(&b, brotli.WriterOptions{Quality: 5, LGWin: 24})
		case "zstd":
			w, _ = zstd.NewWriter(&b)
		default:
			panic("encode: unknown coding " + c)
		}
		_, _ = io.WriteString(w, s)
		_ = w.Close()
		s = b.String()
	}
	return s
}
