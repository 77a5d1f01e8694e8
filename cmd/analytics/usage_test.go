package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestUsageCommand: analytics usage prints a month's statement as CSV,
// JSON and a table that says whether it is complete and sums it; bad
// input is a usage error (exit 2) that says what is wrong, and a key that
// does not exist is one, not an empty statement.
func TestUsageCommand(t *testing.T) {
	conn, addr, db := database(t)
	at := time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC) // 1 December in Berlin
	mustInsert(t, conn, []event.Decision{
		{Time: at.Add(-time.Hour), GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Cost: 4, Allowed: true},
		{Time: at, GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Cost: 4, Allowed: true},
		{Time: at.AddDate(0, 0, 2), GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Allowed: true},
	})
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"usage"}, args...), getenv, &out)
		return out.String(), err
	}
	out, err := cli("-month", "2026-11", "-tz", "Europe/Berlin", "-key", "acme", "-by", "key,route", "-format", "csv")
	if want := "key_id,key_name,key_kind,route,requests,allowed,denied,allowed_cost,denied_cost,without_store\nk-acme,acme,api_key,/a,1,1,0,4,0,0\n"; err != nil || out != want {
		t.Errorf("usage -format csv = %q, %v; want %q (the 23:30 UTC decision is December's in Berlin)", out, err, want)
	}
	out, err = cli("-month", "2026-11", "-key", "acme", "-key", "k-acme")
	if err != nil || !strings.Contains(out, "complete: data through") || !strings.Contains(out, "total") ||
		!strings.Contains(out, "k-acme  acme      api_key   pro   /a     2         2") {
		t.Errorf("usage (table) = %v\n%s", err, out)
	}
	// Nothing after 2 December is stored: a period past it is not complete.
	if out, err = cli("-from", "2026-12-01", "-to", "2026-12-10"); err != nil || !strings.Contains(out, "INCOMPLETE: no decision at or after the period's end") {
		t.Errorf("usage of 1 to 10 December = %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-month", "2026-13"}, "2026-13"},
		{[]string{"-month", "2026-11", "-tz", "Nowhere/Zone"}, "time zone"},
		{[]string{"-from", "2026-11-02", "-to", "2026-11-01"}, "not before"},
		{[]string{"-month", "2026-11", "-by", "gateway"}, `by "gateway"`},
		{[]string{"-month", "2026-11", "-key", "nobody"}, `no key "nobody"`},
		{[]string{"-month", "2026-11", "-format", "xml"}, "-format"},
		{[]string{"-month", "2026-11", "-frm", "x"}, "-frm"},
	} {
		_, err := cli(tc.args...)
		if boot.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("usage %s = %v (exit %d), want exit 2 saying %q", strings.Join(tc.args, " "), err, boot.ExitCode(err), tc.says)
		}
	}
}

// decisions collects a gateway's decision events.
type decisions struct {
	mu sync.Mutex
	ds []event.Decision
}

func (d *decisions) Publish(e event.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ds = append(d.ds, e)
}

// TestUsageReconciles: analytics usage -period current puts beside the
// statement of an API key's current calendar window what the limiter
// counted in it, read from Redis: equal to the unit when every decision is
// stored, and short by exactly the cost of the decisions that are not.
func TestUsageReconciles(t *testing.T) {
	conn, addr, db := database(t)
	redisAddr := testenv.RedisAddr(t)
	prefix := fmt.Sprintf("usage%d", time.Now().UnixNano())
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	sum := sha256.Sum256([]byte("acme-secret-key"))
	cfgYAML := fmt.Sprintf(`
plans:
  pro:
    rules:
      - {name: minute, limit: 100000, period: 1m}
      - {name: month, limit: 1000, calendar: {every: month, zone: Europe/Berlin}}
api_keys:
  - {id: acme, sha256: %s, plan: pro}
upstreams:
  app: {url: %s}
routes:
  - {name: dear, path_prefix: /dear, upstream: app, cost: 5}
  - {name: cheap, path_prefix: /, upstream: app}
store_deadline: 1s
`, hex.EncodeToString(sum[:]), up.URL)
	rulesFile := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(rulesFile, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg gateway.Config
	if err := yaml.Unmarshal([]byte(cfgYAML), &cfg); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	pub := &decisions{}
	gw, err := gateway.New(cfg, gateway.Options{Store: lim, Publisher: pub, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	defer srv.Close()
	for i := range 40 {
		path := "/cheap"
		if i%4 == 0 {
			path = "/dear"
		}
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("X-API-Key", "acme-secret-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	// 30 at cost 1 and 10 at cost 5: 80 units. The last decision (cost 1)
	// is held back at first, as if its event were lost.
	stored := pub.ds[:len(pub.ds)-1]
	mustInsert(t, conn, stored)
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db,
		"EDGELIMIT_REDIS_ADDR": redisAddr, "EDGELIMIT_REDIS_PREFIX": prefix})
	reconcile := func() analytics.Reconciliation {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), []string{"usage", "-period", "current", "-rules", rulesFile, "-key", "acme", "-format", "json"}, getenv, &out); err != nil {
			t.Fatalf("usage -period current: %v\n%s", err, out.String())
		}
		var st analytics.UsageStatement
		if err := json.Unmarshal(out.Bytes(), &st); err != nil || len(st.Reconciled) != 1 {
			t.Fatalf("usage -period current -format json = %s (%v), want one reconciliation", out.String(), err)
		}
		berlin, _ := time.LoadLocation("Europe/Berlin")
		if r := st.Reconciled[0]; st.TZ != "Europe/Berlin" || !r.WindowStart.Equal(time.Date(r.At.In(berlin).Year(), r.At.In(berlin).Month(), 1, 0, 0, 0, 0, berlin)) {
			t.Errorf("the window %v, zone %s: want this month's in Europe/Berlin", r.WindowStart, st.TZ)
		}
		return st.Reconciled[0]
	}
	if r := reconcile(); r.LimiterCount != 80 || r.StatementCost != 79 || r.Difference != 1 || r.KeyName != "acme" || r.Rule != "month" {
		t.Errorf("one event missing: %+v, want the limiter's 80 beside the statement's 79, difference 1", r)
	}
	mustInsert(t, conn, pub.ds[len(pub.ds)-1:])
	if r := reconcile(); r.LimiterCount != 80 || r.StatementCost != 80 || r.Difference != 0 {
		t.Errorf("every event stored: %+v, want 80 beside 80, difference 0", r)
	}

	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-period", "current", "-key", "acme"}, "-rules"},
		{[]string{"-period", "current", "-rules", rulesFile, "-key", "nobody"}, `no api_keys entry with id "nobody"`},
		{[]string{"-period", "current", "-rules", rulesFile, "-key", "acme", "-month", "2026-11"}, "no -month"},
		{[]string{"-period", "last", "-key", "acme"}, `-period "last"`},
	} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"usage"}, tc.args...), getenv, &out)
		if boot.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("usage %s = %v, want exit 2 saying %q", strings.Join(tc.args, " "), err, tc.says)
		}
	}
}
