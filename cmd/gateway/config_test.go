package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
	"github.com/prometheus/client_golang/prometheus"
)

// TestRedisPreviousLayout: redis.previous_layout reaches the limiter the
// gateway opens, off by default, and is refused without a Redis. The
// limiter's Keys shows it: with the previous layout a check also names
// each rule's old key.
func TestRedisPreviousLayout(t *testing.T) {
	rules := []limiter.Rule{
		{Name: "minute", Limit: 10, Period: time.Minute},
		{Name: "hour", Limit: 100, Period: time.Hour},
	}
	// Nothing listens there: a Redis that is down does not stop the
	// gateway from opening its store.
	addr := testenv.FreeAddr(t)
	tests := []struct {
		name     string
		give     string
		wantKeys int
		wantErr  string
	}{
		{name: "default off", give: "redis: {addr: " + addr + "}", wantKeys: 1},
		{name: "on", give: "redis: {addr: " + addr + ", previous_layout: true}", wantKeys: 1 + len(rules)},
		{name: "off", give: "redis: {addr: " + addr + ", previous_layout: false}", wantKeys: 1},
		{name: "no redis", give: "redis: {previous_layout: true}", wantErr: "redis.previous_layout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "gw.yaml")
			body := strings.Replace(configTmpl, "kafka:", tt.give+"\nkafka:", 1)
			// configTmpl's placeholders: limit, upstream, kafka disabled.
			body = strings.NewReplacer("%d", "10", "%s", "http://127.0.0.1:1", "%v", "true").Replace(body)
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			fc, err := loadConfig(path, env(nil))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("loadConfig(%s) = %v, want an error naming %s", tt.give, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadConfig(%s): %v", tt.give, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := openStore(ctx, fc, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(io.Discard, nil)))
			if err != nil {
				t.Fatalf("openStore(%s): %v", tt.give, err)
			}
			defer st.close()
			if st.lim == nil {
				t.Fatalf("openStore(%s) opened no Redis limiter", tt.give)
			}
			if got := st.lim.Keys("k", rules); len(got) != tt.wantKeys {
				t.Errorf("with %s, Keys = %q, want %d keys", tt.give, got, tt.wantKeys)
			}
		})
	}
}
