package gateway

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkBodyScan measures what the proxy path spends on a request's
// body before and while it streams upstream: a body no framework reads a
// form from (unscanned), and a small form (read for an API key, and on a
// route listing its methods for _method too).
func BenchmarkBodyScan(b *testing.B) {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Routes = []Route{
		{Name: "all", PathPrefix: "/", Upstream: "app"},
		{Name: "delete", PathPrefix: "/v1/items", Methods: []string{"DELETE"}, Upstream: "app"},
	}
	gw := startGateway(b, cfg, Options{})
	st := gw.st.Load()
	body := "a=1&b=" + strings.Repeat("x", 1000)
	for _, bc := range []struct{ name, path, contentType string }{
		{"unscanned", "/v1/other", "application/octet-stream"},
		{"form", "/v1/other", "application/x-www-form-urlencoded"},
		{"form/override", "/v1/items/7", "application/x-www-form-urlencoded"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rt := st.match("POST", bc.path)
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest("POST", bc.path, strings.NewReader(body))
				r.Header.Set("Content-Type", bc.contentType)
				rc, err := st.scanBody(r, r.Body, bc.path, rt)
				if err != nil {
					b.Fatal(err)
				}
				if n, err := io.Copy(io.Discard, rc); err != nil || n != int64(len(body)) {
					b.Fatalf("read %d bytes, %v; want %d", n, err, len(body))
				}
				_ = rc.Close()
			}
		})
	}
}
