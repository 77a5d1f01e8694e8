package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// bodyUpstream reads every body in full, as a framework does before it
// looks for _method, and keeps the bodies it received whole.
type bodyUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newBodyUpstream(t *testing.T) *bodyUpstream {
	u := &bodyUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // cut short: no framework runs it
		}
		u.mu.Lock()
		u.bodies = append(u.bodies, b)
		u.mu.Unlock()
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *bodyUpstream) take() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	b := u.bodies
	u.bodies = nil
	return b
}

// TestMethodOverrideInBody: a POST whose form, multipart form or JSON
// body names, as _method, a method limited on another route never reaches
// the upstream whole (Rails, Laravel, Spring and ASP.NET read the override
// from the body once it is all in) and gets 400; every other body goes
// upstream byte for byte, however large, in bounded memory. Before, such a
// POST was charged as a POST and run as the other method.
func TestMethodOverrideInBody(t *testing.T) {
	up := newBodyUpstream(t)
	gw := redisGateway(t, func(cfg *Config) {
		cfg.Plans["free"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000, Period: time.Minute}}}}
		cfg.Upstreams = map[string]Upstream{"app": {URL: up.URL}}
		cfg.Routes = []Route{
			{Name: "all", PathPrefix: "/", Upstream: "app"},
			{Name: "delete", PathPrefix: "/v1/items", Methods: []string{"DELETE"}, Upstream: "app", Cost: 10},
		}
	})
	big := strings.Repeat("x", 3<<20)
	multipartBody := func(dispType, name, value string) string {
		return "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n" + big + "\r\n" +
			"--B\r\nContent-Disposition: " + dispType + "; name=\"" + name + "\"\r\n\r\n" + value + "\r\n--B--\r\n"
	}
	tests := []struct {
		name        string
		path        string
		contentType string
		body        string
		chunked     bool
		wantStatus  int
	}{
		{"form", "/v1/items/7", "application/x-www-form-urlencoded", "a=1&_method=DELETE", false, 400},
		{"form after a large field", "/v1/items/7", "application/x-www-form-urlencoded", "a=" + big + "&_method=delete", false, 400},
		{"form chunked", "/v1/items/7", "application/x-www-form-urlencoded; charset=utf-8", "_method=DELETE&a=1", true, 400},
		{"form escaped name", "/v1/items/7", "application/x-www-form-urlencoded", "%5Fmethod=DELETE", false, 400},
		{"no content type", "/v1/items/7", "", "_method=DELETE", false, 400},
		{"multipart after a file", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody("form-data", "_method", "DELETE"), false, 400},
		{"multipart other disposition", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody("attachment", "_method", "DELETE"), true, 400},
		{"json", "/v1/items/7", "application/json", `{"a":[1,{"_method":"PUT"}],"_method":"DELETE"}`, false, 400},
		{"form same route", "/v1/items/7", "application/x-www-form-urlencoded", "_method=PUT&a=" + big, false, 200},
		{"form without override", "/v1/items/7", "application/x-www-form-urlencoded", "a=1&b=_method", false, 200},
		{"multipart without override", "/v1/items/7", "multipart/form-data; boundary=B", multipartBody("form-data", "note", "_method=DELETE"), true, 200},
		{"json nested only", "/v1/items/7", "application/json", `{"a":{"_method":"DELETE"},"b":"_method"}`, false, 200},
		{"text", "/v1/items/7", "text/plain", "_method=DELETE", false, 200},
		{"no other route here", "/v1/other", "application/x-www-form-urlencoded", "_method=DELETE", false, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := "POST " + tt.path + " HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
			if tt.contentType != "" {
				req += "Content-Type: " + tt.contentType + "\r\n"
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
				t.Errorf("POST %s (%s, %d bytes) = %d, want %d (%s)", tt.path, tt.contentType, len(tt.body), r.status, tt.wantStatus, r.body)
			}
			got := up.take()
			switch {
			case tt.wantStatus != 200 && len(got) != 0:
				t.Errorf("POST %s (%s): the upstream received the whole body, want it cut short", tt.path, tt.contentType)
			case tt.wantStatus == 200 && (len(got) != 1 || !bytes.Equal(got[0], []byte(tt.body))):
				t.Errorf("POST %s (%s): the upstream received %d whole bodies, want the one sent byte for byte", tt.path, tt.contentType, len(got))
			}
		})
	}
}
