package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

const configTmpl = `
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
plans:
  free:
    rules:
      - {name: minute, limit: %d, period: 1m}
anonymous_plan: free
# Generous: under -race a 25ms store call can fail open, and these tests
# read the store's headers.
store_deadline: 1s
upstreams:
  app: {url: %s}
routes:
  - {name: all, path_prefix: /, upstream: app}
kafka:
  disabled: %v
`

func writeConfig(t testing.TB, path string, limit int, upstream string, kafkaDisabled bool) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", fmt.Appendf(nil, configTmpl, limit, upstream, kafkaDisabled), 0o600); err != nil {
		t.Fatal(err)
	}
	// Atomic replace, as config management tools do: a reload never reads
	// half a file.
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// logBuffer collects run's JSON log lines.
type logBuffer struct {
	mu    sync.Mutex
	lines []map[string]any
	raw   strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.raw.Write(p)
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			l.lines = append(l.lines, m)
		}
	}
	return len(p), nil
}

// find returns the first log line whose msg contains msg.
func (l *logBuffer) find(msg string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.lines {
		if s, _ := m["msg"].(string); strings.Contains(s, msg) {
			return m
		}
	}
	return nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.raw.String()
}

type running struct {
	addr, admin string
	logs        *logBuffer
	cancel      context.CancelFunc
	done        chan error
}

// limit is the X-RateLimit-Limit the gateway answers GET / with: the
// running config's plan.
func (r *running) limit(t *testing.T) string {
	t.Helper()
	_, h, _ := httpGet(t, r.addr+"/")
	return h.Get("X-RateLimit-Limit")
}

// reloads is how many config reloads ended with result (ok or failed).
func (r *running) reloads(t *testing.T, result string) string {
	t.Helper()
	return metric(t, r.admin, `edgelimit_gateway_config_reloads_total{result="`+result+`"}`)
}

// start runs the gateway in-process until the test ends.
func start(t *testing.T, args []string, getenv func(string) string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{logs: &logBuffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(ctx, args, getenv, r.logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Errorf("run did not return after cancel")
		}
	})
	var line map[string]any
	testenv.WaitFor(t, 20*time.Second, "the gateway to listen", func() bool {
		select {
		case err := <-r.done:
			t.Fatalf("run returned early: %v\n%s", err, r.logs)
		default:
		}
		line = r.logs.find("gateway listening")
		return line != nil
	})
	r.addr, r.admin = "http://"+line["addr"].(string), "http://"+line["admin_addr"].(string)
	// A gateway listens before its store link is warm and says so on
	// /readyz; the tests, like an orchestrator, send traffic once ready.
	testenv.WaitFor(t, 60*time.Second, "/readyz to answer 200", func() bool {
		resp, err := http.Get(r.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

func httpGet(t testing.TB, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func metric(t testing.TB, admin, series string) string {
	t.Helper()
	_, _, body := httpGet(t, admin+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// embeddedAt is configTmpl with the embedded Kafka listening at listen.
func embeddedAt(listen string) string {
	return strings.Replace(fmt.Sprintf(configTmpl, 1, "http://x", false), "kafka:\n", "kafka:\n  embedded: true\n  embedded_listen: \""+listen+"\"\n", 1)
}

func TestInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"no flag", nil, nil, []string{"-config is required"}},
		{"missing file", []string{"-config", filepath.Join(dir, "nope.yaml")}, nil, []string{"no such file"}},
		{"not yaml", []string{"-config", write("a.yaml", "plans: [")}, nil, []string{"a.yaml", "yaml"}},
		{"unknown field", []string{"-config", write("b.yaml", "plans: {}\nlisten_addr: x\n")}, nil, []string{"b.yaml", "line 2", "listen_addr"}},
		{"invalid values", []string{"-config", write("c.yaml", "plans: {x: {rules: [{name: a, limit: -1, period: 1s}]}}\nroutes: [{path_prefix: /, upstream: nope}]\n")}, nil,
			[]string{"c.yaml", `plans.x.rules[0]: limiter: invalid rule "a": limit -1`, `routes[0].upstream: unknown upstream "nope"`}},
		{"both redis kinds", []string{"-config", write("d.yaml", fmt.Sprintf(configTmpl, 1, "http://x", true))},
			map[string]string{"EDGELIMIT_REDIS_ADDR": "a:1", "EDGELIMIT_REDIS_CLUSTER_ADDRS": "b:1"}, []string{"set one of"}},
		{"bad log level", []string{"-config", write("e.yaml", fmt.Sprintf(configTmpl, 1, "http://x", true)+"log_level: loud\n")}, nil, []string{"log_level"}},
		{"embedded kafka on another host", []string{"-check", "-config", write("g.yaml", embeddedAt("0.0.0.0:19092"))}, nil,
			[]string{"kafka.embedded_listen", "127.0.0.1 only"}},
		{"embedded kafka bad port", []string{"-check", "-config", write("h.yaml", embeddedAt("127.0.0.1:99999"))}, nil,
			[]string{"kafka.embedded_listen port"}},
		{"warm_conns out of range", []string{"-check", "-config", write("i.yaml", fmt.Sprintf(configTmpl, 1, "http://x", true)+"redis: {addr: 127.0.0.1:1, warm_conns: 1000}\n")}, nil,
			[]string{"redis.warm_conns: 1000", "1 to 256"}},
		{"gc_percent out of range", []string{"-check", "-config", write("j.yaml", fmt.Sprintf(configTmpl, 1, "http://x", true)+"gc_percent: 10\n")}, nil,
			[]string{"gc_percent: 10", "50 to 10000"}},
		{"short admin token", []string{"-config", write("f.yaml", fmt.Sprintf(configTmpl, 1, "http://x", true))},
			map[string]string{"EDGELIMIT_ADMIN_TOKEN": "short"}, []string{"admin_api.tokens.env", "16 characters"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			err := run(context.Background(), tt.args, env(tt.env), &out)
			if err == nil {
				t.Fatalf("run(%v) = nil, want an error", tt.args)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run(%v) = %v, want it to mention %q", tt.args, err, w)
				}
			}
		})
	}
}

// TestCheckRefusesCredentialsInBrokers: a broker address holding a
// password is refused by -check by name, and the password is not printed.
func TestCheckRefusesCredentialsInBrokers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 3, "http://127.0.0.1:1", true)
	for _, b := range []string{"user:hunter2@k:9092", "kafka://user:hunter2@k:9092"} {
		var out strings.Builder
		err := run(context.Background(), []string{"-config", path, "-check"}, env(map[string]string{"EDGELIMIT_KAFKA_BROKERS": "k1:9092," + b}), &out)
		if err == nil || !strings.Contains(err.Error(), "kafka.brokers[1]") || strings.Contains(fmt.Sprint(err)+out.String(), "hunter2") {
			t.Errorf("broker %q: run -check = %v (output %q), want an error naming kafka.brokers[1] without the password", b, err, out.String())
		}
	}
}

// TestCheckRefusesCredentialsInRedisAddresses: a Redis address holding a
// password (a redis:// URL, user:password@host) is refused by name, the
// password not printed: accepted, every failed dial logged it whole.
func TestCheckRefusesCredentialsInRedisAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 3, "http://127.0.0.1:1", false)
	for _, tt := range []struct{ env, value, field string }{
		{"EDGELIMIT_REDIS_ADDR", "redis://:hunter2@r:6379", "redis.addr"},
		{"EDGELIMIT_REDIS_ADDR", "default:hunter2@r:6379", "redis.addr"},
		{"EDGELIMIT_REDIS_CLUSTER_ADDRS", "r1:6379,rediss://u:hunter2@r2:6379", "redis.cluster_addrs[1]"},
		{"EDGELIMIT_REDIS_SENTINEL_ADDRS", "u:hunter2@s1:26379", "redis.sentinel_addrs[0]"},
	} {
		vars := map[string]string{tt.env: tt.value}
		if tt.env == "EDGELIMIT_REDIS_SENTINEL_ADDRS" {
			vars["EDGELIMIT_REDIS_SENTINEL_MASTER"] = "mymaster"
		}
		var out strings.Builder
		err := run(context.Background(), []string{"-config", path, "-check"}, env(vars), &out)
		if err == nil || !strings.Contains(err.Error(), tt.field) || strings.Contains(fmt.Sprint(err)+out.String(), "hunter2") {
			t.Errorf("%s=%q: run -check = %v (output %q), want an error naming %s without the password", tt.env, tt.value, err, out.String(), tt.field)
		}
	}
}

func TestCheckPrintsRedacted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 3, "http://127.0.0.1:1", true)
	var out strings.Builder
	getenv := env(map[string]string{"EDGELIMIT_KEY_HASH_SECRET": "top-secret", "EDGELIMIT_REDIS_PASSWORD": "pw-secret",
		"EDGELIMIT_UPSTREAM_APP": "http://upstream.internal:8081", "EDGELIMIT_ADMIN_TOKEN": "admin-token-secret-0123"})
	if err := run(context.Background(), []string{"-config", path, "-check"}, getenv, &out); err != nil {
		t.Fatalf("run -check: %v", err)
	}
	s := out.String()
	if strings.Contains(s, "top-secret") || strings.Contains(s, "pw-secret") || strings.Contains(s, "admin-token-secret") ||
		!strings.Contains(s, "env: '[redacted]'") {
		t.Errorf("-check output leaks or does not redact secrets:\n%s", s)
	}
	for _, want := range []string{"http://upstream.internal:8081", "retry_jitter: 3s", "store_deadline: 1s", "gc_percent: 400"} {
		if !strings.Contains(s, want) {
			t.Errorf("-check output lacks %q:\n%s", want, s)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 3, "http://127.0.0.1:1", false)
	fc, err := loadConfig(path, env(map[string]string{
		"EDGELIMIT_REDIS_CLUSTER_ADDRS": "10.0.0.1:6379, 10.0.0.2:6379",
		"EDGELIMIT_KAFKA_BROKERS":       "k1:9092,k2:9092",
		"EDGELIMIT_LISTEN":              ":9999",
		"EDGELIMIT_UPSTREAM":            "http://only:1",
		"EDGELIMIT_KEY_HASH_SECRET":     "s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintln(fc.Redis.ClusterAddrs, fc.Kafka.Brokers, fc.Listen, fc.Upstreams["app"].URL, string(fc.KeyHashSecret))
	if want := "[10.0.0.1:6379 10.0.0.2:6379] [k1:9092 k2:9092] :9999 http://only:1 s\n"; got != want {
		t.Errorf("overrides = %s, want %s", got, want)
	}
}

func TestInMemoryWhenNoRedis(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 1, up.URL, true)
	r := start(t, []string{"-config", path}, env(nil))
	if r.logs.find("no Redis configured: using the in-memory store") == nil {
		t.Errorf("no log line saying the in-memory store is used:\n%s", r.logs)
	}
	if code, _, _ := httpGet(t, r.addr+"/"); code != 200 {
		t.Errorf("first request: %d", code)
	}
	if code, _, _ := httpGet(t, r.addr+"/"); code != 429 {
		t.Errorf("second request: %d, want 429 from the in-memory store", code)
	}
}

// TestReloadAndShutdown runs the gateway on real Redis and the embedded
// Kafka, reloads it by SIGHUP under load (valid, then invalid), then stops
// it with a request in flight.
func TestReloadAndShutdown(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	defer close(release)

	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 1000, up.URL, false)
	// -watch 0: this test counts the reloads SIGHUP makes, and a poll
	// seeing the new file first would make one more.
	r := start(t, []string{"-config", path, "-watch", "0"}, env(map[string]string{
		"EDGELIMIT_REDIS_ADDR":      redisAddr,
		"EDGELIMIT_KEY_HASH_SECRET": "test-secret",
		// The embedded Kafka is opt-in (trial tooling), not the default.
		"EDGELIMIT_KAFKA_EMBEDDED": "true",
	}))
	if code, h, _ := httpGet(t, r.addr+"/"); code != 200 || h.Get("X-RateLimit-Limit") != "1000" {
		t.Fatalf("before reload: %d limit %q", code, h.Get("X-RateLimit-Limit"))
	}

	// Load throughout the reloads: every request must get an answer.
	var stop atomic.Bool
	var sent atomic.Int64
	failures := make(chan string, 100)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				resp, err := http.Get(r.addr + "/")
				sent.Add(1)
				if err != nil {
					failures <- err.Error()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 && resp.StatusCode != 429 {
					failures <- fmt.Sprint("status ", resp.StatusCode)
					return
				}
			}
		})
	}

	sighup := func() {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig(t, path, 2000, up.URL, false)
	sighup()
	testenv.WaitFor(t, 20*time.Second, "a successful reload", func() bool { return r.reloads(t, "ok") == "1" })
	if got := r.limit(t); got != "2000" {
		t.Errorf("after reload: limit %q, want 2000", got)
	}

	if err := os.WriteFile(path, []byte("plans: {broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	sighup()
	testenv.WaitFor(t, 20*time.Second, "a failed reload", func() bool { return r.reloads(t, "failed") == "1" })
	if got := r.limit(t); got != "2000" {
		t.Errorf("after a failed reload: limit %q, want the old 2000", got)
	}
	if line := r.logs.find("config reload failed"); line == nil || !strings.Contains(fmt.Sprint(line["error"]), "gw.yaml") {
		t.Errorf("no log line naming the broken file: %v", line)
	}
	stop.Store(true)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Errorf("a request failed during reloads: %s", f)
	}
	if sent.Load() < 10 {
		t.Errorf("only %d requests during the reloads", sent.Load())
	}

	// Decision events reach the embedded Kafka.
	testenv.WaitFor(t, 20*time.Second, "events published", func() bool {
		v := metric(t, r.admin, "edgelimit_events_published_total")
		return v != "" && v != "0"
	})
	if code, _, _ := httpGet(t, r.admin+"/readyz"); code != 200 {
		t.Errorf("readyz: %d", code)
	}

	// Graceful stop: a request in flight finishes; then run returns nil.
	slow := make(chan int, 1)
	go func() {
		resp, err := http.Get(r.addr + "/slow")
		if err != nil {
			slow <- -1
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	<-arrived
	r.cancel()
	testenv.WaitFor(t, 20*time.Second, "shutdown to begin", func() bool { return r.logs.find("shutting down") != nil })
	release <- struct{}{}
	if code := <-slow; code != 200 {
		t.Errorf("in-flight request during shutdown: %d, want 200", code)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("run after SIGTERM-equivalent cancel = %v, want nil", err)
		}
		r.done <- err // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return")
	}
	if r.logs.find("gateway stopped") == nil {
		t.Errorf("no stop log line")
	}
}

// configMap lays out a directory as the kubelet does for a mounted
// ConfigMap: name -> ..data/name, ..data -> ..<timestamp>/, and updates
// it the same way: a new timestamped directory, then ..data swapped onto
// it by an atomic rename of a new symlink, then the old directory removed.
type configMap struct {
	t    *testing.T
	dir  string
	name string
	n    int
}

func newConfigMap(t *testing.T, name, body string) *configMap {
	c := &configMap{t: t, dir: t.TempDir(), name: name}
	c.update(body)
	if err := os.Symlink(filepath.Join("..data", name), filepath.Join(c.dir, name)); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *configMap) path() string { return filepath.Join(c.dir, c.name) }

func (c *configMap) update(body string) {
	t := c.t
	t.Helper()
	c.n++
	ts := fmt.Sprintf("..2026_12_01_08_00_%02d.%09d", c.n, c.n)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, ts, c.name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(c.dir, "..data"))
	if err := os.Symlink(ts, filepath.Join(c.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(c.dir, "..data_tmp"), filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReloadOnConfigMapSwap: without any signal, the gateway picks up a
// config file updated the way Kubernetes updates a mounted ConfigMap,
// keeps the running config when the new file is invalid (counting that
// once, not once a poll), and takes the next valid one.
func TestReloadOnConfigMapSwap(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	body := func(limit int) string { return fmt.Sprintf(configTmpl, limit, up.URL, true) }
	cm := newConfigMap(t, "gateway.yaml", body(1000))
	r := start(t, []string{"-config", cm.path()}, env(nil)) // the default -watch
	if got := r.limit(t); got != "1000" {
		t.Fatalf("before the swap: limit %q, want 1000", got)
	}

	cm.update(body(2000))
	testenv.WaitFor(t, 20*time.Second, "the swapped ConfigMap to be loaded", func() bool { return r.limit(t) == "2000" })
	if got := r.reloads(t, "ok"); got != "1" {
		t.Errorf("reloads ok = %q after one swap, want 1", got)
	}
	if r.logs.find("config file changed; reloading") == nil {
		t.Errorf("no log line saying the file changed:\n%s", r.logs)
	}

	cm.update("plans: {broken")
	testenv.WaitFor(t, 20*time.Second, "the invalid ConfigMap to be refused", func() bool { return r.reloads(t, "failed") == "1" })
	if got := r.limit(t); got != "2000" {
		t.Errorf("after an invalid file: limit %q, want the old 2000", got)
	}

	cm.update(body(3000))
	testenv.WaitFor(t, 20*time.Second, "the next valid ConfigMap to be loaded", func() bool { return r.limit(t) == "3000" })
	if got, want := r.reloads(t, "ok")+" "+r.reloads(t, "failed"), "2 1"; got != want {
		t.Errorf("reloads ok, failed = %s, want %s (an invalid file counted once)", got, want)
	}
}

// TestEventsToKafka runs the gateway against the real Kafka broker and
// reads its decision events back.
func TestEventsToKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 2, up.URL, false)
	topic := newTopic(t, brokers)
	r := start(t, []string{"-config", path}, env(map[string]string{
		"EDGELIMIT_KAFKA_BROKERS":   strings.Join(brokers, ","),
		"EDGELIMIT_KAFKA_TOPIC":     topic,
		"EDGELIMIT_KEY_HASH_SECRET": "s",
		"EDGELIMIT_GATEWAY_ID":      "gw-kafka",
	}))
	for range 3 {
		httpGet(t, r.addr+"/x")
	}
	testenv.WaitFor(t, 20*time.Second, "3 events published", func() bool {
		return metric(t, r.admin, "edgelimit_events_published_total") == "3"
	})
	got := readEvents(t, brokers, topic, 3, nil)
	if len(got) != 3 {
		t.Fatalf("read %d events, want 3", len(got))
	}
	allowed := 0
	for _, d := range got {
		if d.GatewayID != "gw-kafka" || d.Route != "all" || d.KeyKind != event.KindIP || d.ClientIP != "127.0.0.1" || d.KeyID == "" {
			t.Errorf("event %+v", d)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("%d allowed events, want 2 (limit 2, 3 requests)", allowed)
	}
}

// newTopic creates a topic of its own on brokers. Topics are created by
// deployment, not by the first event (franz-go gives up on an unknown
// topic after a few retries).
func newTopic(t *testing.T, brokers []string) string {
	t.Helper()
	topic := fmt.Sprintf("gwtest-%d", time.Now().UnixNano())
	// Topics are created by deployment, not by the first event (franz-go
	// gives up on an unknown topic after a few retries).
	testenv.CreateTopics(t, brokers, 2, topic)
	return topic
}

// readEvents reads topic from the start until n events have come, each
// decoded; raw, if set, sees every record's value. The publisher's
// accounting records are left out.
func readEvents(t *testing.T, brokers []string, topic string, n int, raw func([]byte)) []event.Decision {
	t.Helper()
	var got []event.Decision
	decision := func(r *kgo.Record) bool {
		d, err := event.Decode(r.Value)
		return err != nil || d.Mode != event.ModeAccounting
	}
	for _, rec := range testenv.ConsumeWhere(t, brokers, topic, n, decision) {
		if raw != nil {
			raw(rec.Value)
		}
		d, err := event.Decode(rec.Value)
		if err != nil {
			t.Errorf("decode: %v", err)
			continue
		}
		got = append(got, d)
	}
	return got
}

// TestSentinel: a gateway configured with Redis Sentinel finds the master
// through it and enforces limits there.
func TestSentinel(t *testing.T) {
	master, addrs := testenv.RedisSentinel(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 2, up.URL, true)
	r := start(t, []string{"-config", path}, env(map[string]string{
		"EDGELIMIT_REDIS_SENTINEL_ADDRS":  strings.Join(addrs, ","),
		"EDGELIMIT_REDIS_SENTINEL_MASTER": master,
		"EDGELIMIT_REDIS_PREFIX":          "sentinel-test",
	}))
	if code, _, _ := httpGet(t, r.admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d, want 200 with Redis found through Sentinel", code)
	}
	var codes []int
	for range 3 {
		code, h, _ := httpGet(t, r.addr+"/")
		codes = append(codes, code)
		if h.Get("X-RateLimit-Limit") != "2" {
			t.Errorf("X-RateLimit-Limit = %q, want 2", h.Get("X-RateLimit-Limit"))
		}
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Errorf("statuses %v, want [200 200 429]", codes)
	}
}

// TestVersionAndBuildInfo: -version prints the build's version, and the
// admin listener exports it as edgelimit_build_info.
func TestVersionAndBuildInfo(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-version"}, env(nil), &out); err != nil || !strings.HasPrefix(out.String(), "gateway dev (revision ") {
		t.Errorf("run -version = %v, %q; want \"gateway dev (revision ...\"", err, out.String())
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 1, up.URL, false)
	r := start(t, []string{"-config", path}, env(nil))
	_, _, body := httpGet(t, r.admin+"/metrics")
	if !strings.Contains(body, `edgelimit_build_info{goversion="go`) || !strings.Contains(body, `version="dev"} 1`) {
		t.Errorf("/metrics lacks edgelimit_build_info:\n%.2000s", body)
	}
	// No brokers and no kafka.embedded: events are off, and said so.
	if line := r.logs.find("no Kafka brokers configured: decision events are OFF"); line == nil || line["level"] != "WARN" {
		t.Errorf("no warning that decision events are off: %v", line)
	}
	if r.logs.find("in-memory Kafka (kfake) inside this gateway") != nil {
		t.Errorf("an embedded Kafka started without kafka.embedded")
	}
}

// TestGRPCEnvOverrides: the gRPC listener and its rules directory come from
// the environment like the other addresses, so one file serves a fleet
// with and without Envoy.
func TestGRPCEnvOverrides(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gw.yaml")
	writeConfig(t, path, 3, "http://127.0.0.1:1", true)
	rules := filepath.Join(dir, "rules")
	if err := os.Mkdir(rules, 0o755); err != nil {
		t.Fatal(err)
	}
	body := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(rules, "edge.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := loadConfig(path, env(map[string]string{"EDGELIMIT_GRPC_LISTEN": "127.0.0.1:8081", "EDGELIMIT_GRPC_CONFIG_DIR": rules}))
	if err != nil {
		t.Fatal(err)
	}
	if !fc.GRPC.Enabled() || fc.GRPC.Listen != "127.0.0.1:8081" || fc.GRPC.ConfigDir != rules {
		t.Errorf("grpc = %+v, want listen 127.0.0.1:8081 and config_dir %s", fc.GRPC, rules)
	}
	// A listener without rules is refused, naming the missing setting.
	_, err = loadConfig(path, env(map[string]string{"EDGELIMIT_GRPC_LISTEN": "127.0.0.1:8081"}))
	if err == nil || !strings.Contains(err.Error(), "grpc.config_dir") {
		t.Errorf("EDGELIMIT_GRPC_LISTEN without a config dir: %v, want an error naming grpc.config_dir", err)
	}
}

// TestAdminCLI runs a gateway with EDGELIMIT_ADMIN_TOKEN on real Redis and
// drives its key admin API with "gateway admin key": a caller denied at
// its limit shows nothing remaining, is reset, and is admitted again; the
// reset is a log line naming the token's name, never the token.
func TestAdminCLI(t *testing.T) {
	const token = "cli-admin-token-0123456789"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 2, up.URL, false)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers)
	getenv := env(map[string]string{"EDGELIMIT_REDIS_ADDR": testenv.RedisAddr(t), "EDGELIMIT_ADMIN_TOKEN": token,
		"EDGELIMIT_REDIS_PREFIX":  "admincli" + fmt.Sprint(time.Now().UnixNano()),
		"EDGELIMIT_KAFKA_BROKERS": strings.Join(brokers, ","), "EDGELIMIT_KAFKA_TOPIC": topic})
	r := start(t, []string{"-config", path}, getenv)
	for range 2 {
		if code, _, _ := httpGet(t, r.addr+"/"); code != http.StatusOK {
			t.Fatalf("GET / = %d before the limit", code)
		}
	}
	if code, _, _ := httpGet(t, r.addr+"/"); code != http.StatusTooManyRequests {
		t.Fatalf("GET / = %d at the limit, want 429", code)
	}
	cli := func(getenv func(string) string, args ...string) (map[string]any, error) {
		t.Helper()
		var out strings.Builder
		err := run(context.Background(), append([]string{"admin", "key"}, args...), getenv, &out)
		if err != nil {
			return nil, err
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
			t.Fatalf("gateway admin key %v printed %q: %v", args, out.String(), err)
		}
		return v, nil
	}
	remaining := func(v map[string]any) float64 {
		t.Helper()
		rule := v["rule_sets"].([]any)[0].(map[string]any)["buckets"].([]any)[0].(map[string]any)["rules"].([]any)[0].(map[string]any)
		return rule["remaining"].(float64)
	}
	v, err := cli(getenv, "show", "-admin", r.admin, "-ip", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if got := remaining(v); got != 0 {
		t.Errorf("show after 2 of 2: remaining %v, want 0", got)
	}
	if v, err = cli(getenv, "reset", "-admin", r.admin, "-ip", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if got := remaining(v); got != 2 {
		t.Errorf("reset answered remaining %v, want 2", got)
	}
	if code, _, _ := httpGet(t, r.addr+"/"); code != http.StatusOK {
		t.Errorf("GET / = %d after reset, want 200", code)
	}
	line := r.logs.find("admin key reset")
	if line == nil || line["actor"] != "env" || line["kind"] != "ip" || line["key_id"] == "" {
		t.Errorf("audit log line %v, want actor env, kind ip, a key id", line)
	}
	if strings.Contains(r.logs.String(), token) {
		t.Error("the log holds the admin token")
	}
	// The decision stream has the audit record: 3 decisions, then the
	// reset of the address's plan and of its auth failure bucket.
	evs := readEvents(t, brokers, topic, 5, func(b []byte) {
		if strings.Contains(string(b), token) {
			t.Error("a record holds the admin token")
		}
	})
	var audits int
	for _, e := range evs {
		if e.Mode == event.ModeAdmin {
			audits++
			if e.Admin != (event.AdminAction{Action: "reset", Actor: "env"}) || e.KeyID != line["key_id"] || e.KeyKind != event.KindIP {
				t.Errorf("audit record %+v, want a reset by env of key %v", e, line["key_id"])
			}
		}
	}
	if audits != 2 {
		t.Errorf("%d audit records in %d events, want 2 (plan and auth-failure)", audits, len(evs))
	}

	// A fleet: a second gateway on the same Redis denies from its deny
	// cache until asked too; -admin lists both, and both admit again.
	r2 := start(t, []string{"-config", path}, getenv)
	denied := false
	for range 4 { // the shared bucket holds 2: spent by the third at most
		if code, _, _ := httpGet(t, r2.addr+"/"); code == http.StatusTooManyRequests {
			denied = true
			break
		}
	}
	if !denied {
		t.Fatal("the second gateway admitted 4 requests at 2 a minute")
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"admin", "key", "reset", "-admin", r.admin + "," + r2.admin, "-ip", "127.0.0.1"}, getenv, &out); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), `"action": "reset"`); n != 2 {
		t.Errorf("a reset of two gateways printed %d answers, want 2:\n%s", n, out.String())
	}
	for _, gw := range []*running{r, r2} {
		if code, _, _ := httpGet(t, gw.addr+"/"); code != http.StatusOK {
			t.Errorf("GET %s/ = %d after the fleet reset, want 200", gw.addr, code)
		}
	}

	// A wrong or missing token, bad input: clear errors, exit non-zero.
	if _, err := cli(env(map[string]string{"EDGELIMIT_ADMIN_TOKEN": "wrong-token-0123456789"}), "show", "-admin", r.admin, "-ip", "127.0.0.1"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v, want a 401", err)
	}
	if _, err := cli(env(nil), "show", "-admin", r.admin, "-ip", "127.0.0.1"); err == nil || !strings.Contains(err.Error(), "EDGELIMIT_ADMIN_TOKEN") {
		t.Errorf("no token: %v, want an error naming EDGELIMIT_ADMIN_TOKEN", err)
	}
	if _, err := cli(getenv, "show", "-admin", r.admin, "-api-key", "nobody"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown key id: %v, want a 404", err)
	}
	if _, err := cli(getenv, "frob", "-ip", "127.0.0.1"); err == nil {
		t.Error("an unknown action was taken")
	}
}
