package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestServeSecureLinks: analytics serve over ClickHouse TLS + password and
// Redis TLS + ACL, alerting to an HTTPS Alertmanager with basic auth and
// an HTTPS webhook with a bearer token; each wrong setting stops serve at
// start with the link and the cause.
func TestServeSecureLinks(t *testing.T) {
	_, _, db := database(t)
	certs := testenv.TLSCerts(t)
	rs, cs := testenv.SecureRedis(t), testenv.SecureClickHouse(t)
	cert, err := tls.LoadX509KeyPair(filepath.Join(filepath.Dir(certs.CA), "server.pem"), filepath.Join(filepath.Dir(certs.CA), "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 100)
	https := func(want string) *httptest.Server {
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Authorization")
			if r.Header.Get("Authorization") != want {
				http.Error(w, "who are you", http.StatusUnauthorized)
			}
		}))
		s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		// Quiet: the negative cases' refused handshakes are expected.
		s.Config.ErrorLog = log.New(io.Discard, "", 0)
		s.StartTLS()
		t.Cleanup(s.Close)
		return s
	}
	am, hook := https("Basic YW06YW0tcGFzcw=="), https("Bearer hook-token") // am:am-pass

	good := map[string]string{
		"EDGELIMIT_CLICKHOUSE_ADDR":               cs.Addrs[0],
		"EDGELIMIT_CLICKHOUSE_DATABASE":           db,
		"EDGELIMIT_CLICKHOUSE_USER":               cs.User,
		"EDGELIMIT_CLICKHOUSE_PASSWORD":           cs.Password,
		"EDGELIMIT_CLICKHOUSE_TLS_CA_FILE":        certs.CA,
		"EDGELIMIT_REDIS_ADDR":                    rs.Addrs[0],
		"EDGELIMIT_REDIS_USERNAME":                rs.User,
		"EDGELIMIT_REDIS_PASSWORD":                rs.Password,
		"EDGELIMIT_REDIS_TLS_CA_FILE":             certs.CA,
		"EDGELIMIT_ANALYTICS_TOKEN":               "secure-token-0123456789",
		"EDGELIMIT_ANALYTICS_LISTEN":              testenv.FreeAddr(t),
		"EDGELIMIT_ANALYTICS_ADMIN_LISTEN":        testenv.FreeAddr(t),
		"EDGELIMIT_ALERTMANAGER_URL":              am.URL,
		"EDGELIMIT_ALERTMANAGER_USERNAME":         "am",
		"EDGELIMIT_ALERTMANAGER_PASSWORD":         "am-pass",
		"EDGELIMIT_ALERTMANAGER_TLS_CA_FILE":      certs.CA,
		"EDGELIMIT_ALERT_WEBHOOK_URL":             hook.URL + "/hook/secret-path",
		"EDGELIMIT_ALERT_WEBHOOK_BEARER_TOKEN":    "hook-token",
		"EDGELIMIT_ALERT_WEBHOOK_TLS_CA_FILE":     certs.CA,
		"EDGELIMIT_ALERT_WEBHOOK_TLS_SERVER_NAME": "localhost",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}

	// The analyst commands take the same ClickHouse link.
	var out bytes.Buffer
	if err := runCmd(context.Background(), []string{"trends", "-from", "-1h", "-format", "json"}, env(good), &out); err != nil {
		t.Errorf("trends over TLS + password = %v", err)
	}

	// serve comes up and is ready over the secure links; the alert
	// destinations were checked with their own credentials.
	admin := good["EDGELIMIT_ANALYTICS_ADMIN_LISTEN"]
	ctx, stop := context.WithCancel(context.Background())
	var logs testenv.LogBuffer
	done := make(chan error, 1)
	go func() { done <- runCmd(ctx, []string{"serve"}, env(good), &logs) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended at start: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not ready after 30s\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("serve after stop = %v", err)
	}
	got := map[string]bool{}
	for len(seen) > 0 {
		got[<-seen] = true
	}
	for _, want := range []string{"GET /api/v2/status Basic YW06YW0tcGFzcw==", "HEAD /hook/secret-path Bearer hook-token"} {
		if !got[want] {
			t.Errorf("the alert destinations saw %v, want %q", got, want)
		}
	}
	if s := logs.String(); strings.Contains(s, cs.Password) || strings.Contains(s, rs.Password) || strings.Contains(s, "am-pass") || strings.Contains(s, "hook-token") {
		t.Errorf("serve's log shows a secret:\n%s", s)
	}

	for _, tt := range []struct {
		name string
		give map[string]string
		want string
	}{
		{"clickhouse wrong password", with("EDGELIMIT_CLICKHOUSE_PASSWORD", "nope"),
			fmt.Sprintf("clickhouse (%s, tls): authentication failed: code: 193", cs.Addrs[0])},
		{"clickhouse untrusted", with("EDGELIMIT_CLICKHOUSE_TLS_CA_FILE", certs.UntrustedCA),
			fmt.Sprintf("clickhouse (%s, tls): TLS handshake: x509: certificate signed by unknown authority", cs.Addrs[0])},
		{"redis wrong password", with("EDGELIMIT_REDIS_PASSWORD", "nope"),
			fmt.Sprintf("redis (%s, tls): authentication failed: WRONGPASS", rs.Addrs[0])},
		{"alertmanager wrong password", with("EDGELIMIT_ALERTMANAGER_PASSWORD", "nope"),
			fmt.Sprintf("alertmanager (%s): authentication failed: 401 Unauthorized", am.URL)},
		{"alertmanager untrusted", with("EDGELIMIT_ALERTMANAGER_TLS_CA_FILE", certs.UntrustedCA),
			fmt.Sprintf("alertmanager (%s): TLS handshake: x509: certificate signed by unknown authority", am.URL)},
		{"webhook missing token", with("EDGELIMIT_ALERT_WEBHOOK_BEARER_TOKEN", ""),
			fmt.Sprintf("alert webhook (%s): authentication failed: 401 Unauthorized", hook.URL)},
	} {
		err := runCmd(context.Background(), []string{"serve"}, env(tt.give), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: serve = %v, want %q", tt.name, err, tt.want)
		}
		if err != nil && (strings.Contains(err.Error(), "nope") || strings.Contains(err.Error(), "secret-path")) {
			t.Errorf("%s: the error shows a secret: %v", tt.name, err)
		}
	}
}
