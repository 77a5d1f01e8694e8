package boot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.yaml.in/yaml/v3"
)

type testConfig struct {
	Name     string   `yaml:"name"`
	Password Secret   `yaml:"password"`
	Redis    Redis    `yaml:"redis"`
	Kafka    Kafka    `yaml:"kafka"`
	Count    int      `yaml:"count"`
	Tags     []string `yaml:"tags"`
}

// writeFile writes body to a new file and returns its path.
func writeFile(t *testing.T, body string) (path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// env is a getenv over m.
func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadYAMLStrict(t *testing.T) {
	var c testConfig
	err := LoadYAML(writeFile(t, "name: a\nredis:\n  adress: x:1\n"), &c)
	if err == nil || !strings.Contains(err.Error(), "adress") || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("LoadYAML with a misspelt field = %v, want an error naming it and its line", err)
	}
	if err := LoadYAML(writeFile(t, ""), &c); err != nil {
		t.Errorf("LoadYAML(empty file) = %v, want nil", err)
	}
	if err := LoadYAML("", &c); err != nil {
		t.Errorf("LoadYAML(no path) = %v, want nil", err)
	}
	if err := LoadYAML(filepath.Join(t.TempDir(), "nope.yaml"), &c); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadYAML(missing file) = %v, want ErrNotExist", err)
	}
	c = testConfig{}
	if err := LoadYAML(writeFile(t, "name: a\nredis: {addr: r:1, password: pw}\nkafka: {brokers: [k:1]}\n"), &c); err != nil {
		t.Fatal(err)
	}
	if c.Name != "a" || c.Redis.Addr != "r:1" || string(c.Redis.Password) != "pw" || len(c.Kafka.Brokers) != 1 {
		t.Errorf("LoadYAML = %+v", c)
	}
}

func TestEnvOverrides(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(secretFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testConfig{Name: "file", Count: 1, Redis: Redis{Addr: "file:1"}}
	e := NewEnv(env(map[string]string{
		"NAME":                          "env",
		"COUNT":                         "7",
		"TAGS":                          " a, b ,,c ",
		"PASSWORD_FILE":                 secretFile,
		"EDGELIMIT_REDIS_CLUSTER_ADDRS": "c1:1, c2:1",
		"EDGELIMIT_KAFKA_BROKERS":       "k1:1 ,k2:1",
	}))
	e.String(&c.Name, "NAME")
	e.Int(&c.Count, "COUNT")
	e.List(&c.Tags, "TAGS")
	e.Secret(&c.Password, "PASSWORD")
	c.Redis.ApplyEnv(e)
	c.Kafka.ApplyEnv(e)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("%s %d %q %s %q %q %q", c.Name, c.Count, c.Tags, c.Password.String(), c.Redis.Addr, c.Redis.ClusterAddrs, c.Kafka.Brokers)
	if want := `env 7 ["a" "b" "c"] [redacted] "" ["c1:1" "c2:1"] ["k1:1" "k2:1"]`; got != want || string(c.Password) != "from-file" {
		t.Errorf("after env: %s, want %s", got, want)
	}

	e = NewEnv(env(map[string]string{"COUNT": "x", "P": "a", "P_FILE": "/x", "EDGELIMIT_REDIS_ADDR": "a:1", "EDGELIMIT_REDIS_SENTINEL_ADDRS": "s:1"}))
	e.Int(&c.Count, "COUNT")
	e.Secret(&c.Password, "P")
	c.Redis.ApplyEnv(e)
	err := e.Err()
	for _, want := range []string{`COUNT="x"`, "P or P_FILE", "set one of EDGELIMIT_REDIS_ADDR"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Env.Err() = %v, want it to mention %q", err, want)
		}
	}
}

// TestEnvSecretFile: a secret read from a NAME_FILE is trimmed of the
// newline editors and kubectl leave; a file that cannot give a secret (empty,
// only whitespace, unreadable, far too large) is an error naming the
// variable and the file, never the content, not a secret silently unset.
func TestEnvSecretFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	huge := bytes.Repeat([]byte("hunter2-"), 10<<10) // 80 KiB
	for _, tt := range []struct {
		name string
		give string // the file
		want string // the secret, or "" for an error
		err  string
	}{
		{name: "trailing newline", give: file("nl", []byte("s3cret-value\n")), want: "s3cret-value"},
		{name: "CRLF and spaces", give: file("crlf", []byte("  s3cret-value\r\n")), want: "s3cret-value"},
		{name: "empty", give: file("empty", nil), err: "is empty"},
		{name: "only a newline", give: file("blank", []byte("\n \n")), err: "is empty"},
		{name: "missing", give: filepath.Join(dir, "none"), err: "no such file"},
		{name: "a directory", give: dir, err: "is a directory"},
		{name: "too large", give: file("huge", huge), err: "over 64 KiB"},
	} {
		var got Secret = "from-the-file-config"
		e := NewEnv(env(map[string]string{"EDGELIMIT_X_PASSWORD_FILE": tt.give}))
		e.Secret(&got, "EDGELIMIT_X_PASSWORD")
		err := e.Err()
		if tt.err == "" {
			if err != nil || string(got) != tt.want {
				t.Errorf("%s: Secret = %q, %v; want %q, nil", tt.name, string(got), err, tt.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "EDGELIMIT_X_PASSWORD_FILE: ") ||
			!strings.Contains(err.Error(), tt.give) || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: Secret = %.20q (%d bytes), err %v; want an error naming EDGELIMIT_X_PASSWORD_FILE, %s and %q", tt.name, string(got), len(got), err, tt.give, tt.err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the file's content: %.100s", tt.name, err)
		}
	}
}

func TestSecretRedacted(t *testing.T) {
	c := testConfig{Name: "n", Password: "hunter2", Redis: Redis{Password: "hunter3"}}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "password", c.Password, "config", c)
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	ys, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for format, out := range map[string]string{
		"%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", c), "%#v": fmt.Sprintf("%#v", c), "%s": fmt.Sprintf("%s", c.Password),
		"json": string(js), "yaml": string(ys), "slog": logs.String(),
	} {
		if strings.Contains(out, "hunter") || !strings.Contains(out, "[redacted]") {
			t.Errorf("%s shows the secret or no redaction: %s", format, out)
		}
	}
	if Secret("").String() != "" {
		t.Errorf("an unset secret prints %q, want empty", Secret("").String())
	}
}

func TestParseLevel(t *testing.T) {
	for _, tt := range []struct {
		give    string
		want    slog.Level
		wantErr bool
	}{
		{"", slog.LevelInfo, false},
		{"debug", slog.LevelDebug, false},
		{"WARN", slog.LevelWarn, false},
		{"error", slog.LevelError, false},
		{"loud", 0, true},
		{"info+", 0, true},
	} {
		got, err := ParseLevel(tt.give)
		if (err != nil) != tt.wantErr || (err == nil && got != tt.want) {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v, error %v", tt.give, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "log_level") {
			t.Errorf("ParseLevel(%q) error %q does not name log_level", tt.give, err)
		}
	}
	if _, err := NewLogger(&bytes.Buffer{}, "loud"); err == nil {
		t.Error("NewLogger(loud) = nil error")
	}
}

func TestVersionAndBuildInfo(t *testing.T) {
	old := Version
	Version = "v9.9.9-test"
	defer func() { Version = old }()
	if got := VersionLine("gateway"); !strings.HasPrefix(got, "gateway v9.9.9-test (revision ") || !strings.Contains(got, runtime.Version()) {
		t.Errorf("VersionLine = %q", got)
	}
	reg := NewRegistry()
	want := fmt.Sprintf(`
# HELP edgelimit_build_info Always 1; its labels say which build is running.
# TYPE edgelimit_build_info gauge
edgelimit_build_info{goversion=%q,revision=%q,version="v9.9.9-test"} 1
`, runtime.Version(), revision())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "edgelimit_build_info"); err != nil {
		t.Error(err)
	}
}

func TestRedisValidate(t *testing.T) {
	for _, tt := range []struct {
		give Redis
		want string
	}{
		{Redis{Addr: "a:1", ClusterAddrs: []string{"b:1"}}, "set one of"},
		{Redis{SentinelAddrs: []string{"s:1"}}, "go together"},
		{Redis{ClusterAddrs: []string{"b:1"}, DB: 2}, "database 0"},
	} {
		if err := tt.give.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v.Validate() = %v, want %q", tt.give, err, tt.want)
		}
	}
	if err := (Redis{Addr: "a:1"}).Validate(); err != nil {
		t.Errorf("standalone Validate = %v", err)
	}
}

func TestClickHouse(t *testing.T) {
	c := ClickHouse{Addr: "ch:9000", Password: "pw"}
	o, err := c.Options(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if o.Auth.Database != "default" || o.Auth.Username != "default" || o.Auth.Password != "pw" || o.Compression == nil || o.ReadTimeout != time.Second {
		t.Errorf("Options = %+v", o)
	}
	err = (ClickHouse{Compression: "zip"}).Validate()
	if err == nil || !strings.Contains(err.Error(), "clickhouse.addr") || !strings.Contains(err.Error(), "zip") {
		t.Errorf("Validate = %v, want both problems joined", err)
	}
}

// TestRunOrder: the stops run in the order given once ctx ends, and an
// actor that fails stops the rest.
func TestRunOrder(t *testing.T) {
	var order []string
	step := func(name string) Actor {
		return Actor{Name: name, Stop: func(context.Context) error { order = append(order, name); return nil }}
	}
	worker := Func("worker", func(ctx context.Context) error {
		<-ctx.Done()
		order = append(order, "worker done")
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	log := slog.New(slog.DiscardHandler)
	if err := Run(ctx, log, time.Second, step("http"), worker, step("flush")); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "http,worker done,flush" {
		t.Errorf("shutdown order %s, want http,worker done,flush", got)
	}

	boom := errors.New("boom")
	failing := Func("failing", func(context.Context) error { return boom })
	err := Run(context.Background(), log, time.Second, failing, Func("idle", func(ctx context.Context) error { <-ctx.Done(); return nil }))
	if !errors.Is(err, boom) {
		t.Errorf("Run with a failing actor = %v, want boom", err)
	}

	stuck := Actor{Name: "stuck", Run: func() error { select {} }}
	err = Run(ctx, log, 50*time.Millisecond, stuck)
	if err == nil || !strings.Contains(err.Error(), "still running") {
		t.Errorf("Run with an actor that ignores stop = %v, want a timeout", err)
	}
}

func TestAdmin(t *testing.T) {
	notReady := errors.New("warming up")
	ready := notReady
	h := Admin{Registry: NewRegistry(), Ready: func(context.Context) error { return ready }}.Handler()
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "warming up") {
		t.Errorf("/readyz not ready = %d %q", code, body)
	}
	ready = nil
	for path, want := range map[string]string{"/readyz": "ok", "/healthz": "ok", "/metrics": "edgelimit_build_info"} {
		if code, body := get(path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d %q, want 200 with %q", path, code, body, want)
		}
	}
	if code, _ := get("/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof without Pprof = %d, want 404", code)
	}
}

// TestImportsNoProductPackage keeps boot below the product: cmd/* wires
// boot and the packages together, boot knows none of them.
func TestImportsNoProductPackage(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if strings.HasSuffix(f, "_test.go") && p == "github.com/edgelimit/edgelimit/internal/testenv" {
				continue // where the real servers are: test wiring, not product
			}
			if strings.HasPrefix(p, "github.com/edgelimit/edgelimit/") {
				t.Errorf("%s imports %s; boot must not depend on the product's packages", f, p)
			}
		}
	}
}
