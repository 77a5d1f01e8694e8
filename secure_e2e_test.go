package edgelimit_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// These tests run the real gateway and consumer binaries, configured only
// through the environment as an operator would, against the test stack's
// servers that require TLS and credentials: Redis over TLS with an ACL
// user (and a client certificate), Kafka's SASL_SSL listener with
// SCRAM-SHA-512, ClickHouse's native TLS port with a password user. The
// passwords come from *_FILE variables, as Kubernetes secrets would.

// secureStack is what both tests need: the binaries and each link's
// environment.
type secureStack struct {
	bin           string
	redis, kafka  map[string]string
	clickhouse    map[string]string
	certs         testenv.Certs
	kafkaSecure   testenv.Secure
	chSecure      testenv.Secure
	secretsInFile []string // every password, which no output may show
}

func newSecureStack(t *testing.T) *secureStack {
	t.Helper()
	certs := testenv.TLSCerts(t)
	rs, ks, cs := testenv.SecureRedis(t), testenv.SecureKafka(t), testenv.SecureClickHouse(t)
	dir := t.TempDir()
	secret := func(name, value string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	s := &secureStack{
		bin: buildBinaries(t, "gateway", "consumer"), certs: certs, kafkaSecure: ks, chSecure: cs,
		secretsInFile: []string{rs.Password, ks.Password, cs.Password},
		redis: map[string]string{
			"EDGELIMIT_REDIS_ADDR":          rs.Addrs[0],
			"EDGELIMIT_REDIS_USERNAME":      rs.User,
			"EDGELIMIT_REDIS_PASSWORD_FILE": secret("redis-password", rs.Password),
			"EDGELIMIT_REDIS_TLS_CA_FILE":   certs.CA,
			"EDGELIMIT_REDIS_TLS_CERT_FILE": certs.Client,
			"EDGELIMIT_REDIS_TLS_KEY_FILE":  certs.ClientKey,
		},
		kafka: map[string]string{
			"EDGELIMIT_KAFKA_BROKERS":            strings.Join(ks.Addrs, ","),
			"EDGELIMIT_KAFKA_TLS_CA_FILE":        certs.CA,
			"EDGELIMIT_KAFKA_SASL_MECHANISM":     "SCRAM-SHA-512",
			"EDGELIMIT_KAFKA_SASL_USERNAME":      ks.User,
			"EDGELIMIT_KAFKA_SASL_PASSWORD_FILE": secret("kafka-password", ks.Password),
		},
		clickhouse: map[string]string{
			"EDGELIMIT_CLICKHOUSE_ADDR":          cs.Addrs[0],
			"EDGELIMIT_CLICKHOUSE_USER":          cs.User,
			"EDGELIMIT_CLICKHOUSE_PASSWORD_FILE": secret("clickhouse-password", cs.Password),
			"EDGELIMIT_CLICKHOUSE_TLS_CA_FILE":   certs.CA,
		},
	}
	return s
}

// buildBinaries builds cmd/NAME for each name into a temporary folder.
func buildBinaries(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-o", dir + "/"}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// merge joins environment maps; later ones win.
func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// command is bin/name with args and exactly vars as its environment (plus
// PATH and HOME): nothing of the test stack's plain servers leaks in.
func (s *secureStack) command(name string, vars map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// start runs a long-lived process, stopped with SIGTERM when the test
// ends; its output goes to out.
func (s *secureStack) start(t *testing.T, name string, vars map[string]string, out *testenv.LogBuffer, args ...string) {
	t.Helper()
	cmd := s.command(name, vars, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("%s did not stop within 30s of SIGTERM", name)
		}
	})
}

// waitReady polls url until it answers 200, or fails with the log.
func waitReady(t *testing.T, what, url string, out *testenv.LogBuffer) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready at %s after 90s; its log:\n%s", what, url, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

const secureGatewayConfig = `
plans:
  free:
    rules:
      - {name: minute, limit: 100, period: 1m}
anonymous_plan: free
store_deadline: 1s
upstreams:
  app: {url: %s}
routes:
  - {name: all, path_prefix: /, upstream: app}
`

// TestSecureLinks builds the binaries once for both halves.
func TestSecureLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway and the consumer")
	}
	t.Parallel()
	s := newSecureStack(t)
	t.Run("EndToEnd", func(t *testing.T) { secureEndToEnd(t, s) })
	t.Run("RefuseBadConfig", func(t *testing.T) { secureRefuseBadConfig(t, s) })
}

// secureEndToEnd: one request through the gateway (Redis over
// TLS + ACL, Kafka over SASL_SSL SCRAM-SHA-512) and the consumer (Kafka
// over SASL_SSL, ClickHouse over TLS + password) becomes one row, decided
// by Redis (store_status ok), read back over the secure ClickHouse link;
// a poison record reaches the dead-letter topic over the same link.
func secureEndToEnd(t *testing.T, s *secureStack) {
	suffix := fmt.Sprintf("%d_%d", time.Now().UnixNano(), rand.IntN(1000))
	topic, db, gwID := "secure-"+suffix, "edgelimit_secure_"+suffix, "gw-secure-"+suffix

	// Setup over the secure link too, as the password user.
	chLink := boot.ClickHouse{Addr: s.chSecure.Addrs[0], Username: s.chSecure.User, Password: boot.Secret(s.chSecure.Password), TLS: boot.TLS{CAFile: s.certs.CA}}
	ch, err := boot.OpenClickHouse(chLink, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ctx := context.Background()
	if err := ch.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })

	dir := t.TempDir()
	consumerYAML := filepath.Join(dir, "consumer.yaml")
	if err := os.WriteFile(consumerYAML, []byte("kafka:\n  create_topics: true\n  partitions: 2\nbatch:\n  wait: 200ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var consumerLog testenv.LogBuffer
	consumerAdmin := testenv.FreeAddr(t)
	s.start(t, "consumer", merge(s.kafka, s.clickhouse, map[string]string{
		"EDGELIMIT_CLICKHOUSE_DATABASE":     db,
		"EDGELIMIT_KAFKA_TOPIC":             topic,
		"EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC": topic + "-dlq",
		"EDGELIMIT_CONSUMER_GROUP":          "secure-" + suffix,
		"EDGELIMIT_CONSUMER_ADMIN_LISTEN":   consumerAdmin,
	}), &consumerLog, "-config", consumerYAML)
	waitReady(t, "consumer", "http://"+consumerAdmin+"/readyz", &consumerLog)

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello")) }))
	defer upstream.Close()
	gatewayYAML := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(gatewayYAML, fmt.Appendf(nil, secureGatewayConfig, upstream.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	var gatewayLog testenv.LogBuffer
	listen, admin := testenv.FreeAddr(t), testenv.FreeAddr(t)
	gwEnv := merge(s.redis, s.kafka, map[string]string{
		"EDGELIMIT_GATEWAY_ID":      gwID,
		"EDGELIMIT_LISTEN":          listen,
		"EDGELIMIT_ADMIN_LISTEN":    admin,
		"EDGELIMIT_KAFKA_TOPIC":     topic,
		"EDGELIMIT_KEY_HASH_SECRET": "e2e-key-hash-secret",
		"EDGELIMIT_REDIS_PREFIX":    "secure" + suffix,
	})

	// -check prints the effective configuration with every secret
	// redacted, passwords read from files included.
	check := s.command("gateway", gwEnv, "-config", gatewayYAML, "-check")
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("gateway -check: %v\n%s", err, out)
	}
	for _, want := range []string{"ca_file: " + s.certs.CA, "mechanism: SCRAM-SHA-512", "password: '[redacted]'"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("gateway -check output lacks %q:\n%s", want, out)
		}
	}

	s.start(t, "gateway", gwEnv, &gatewayLog, "-config", gatewayYAML)
	waitReady(t, "gateway", "http://"+admin+"/readyz", &gatewayLog)

	resp, err := http.Get("http://" + listen + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "99" {
		t.Fatalf("GET /hello = %s, X-RateLimit-Remaining %q; want 200 and 99 (decided by Redis); gateway log:\n%s",
			resp.Status, resp.Header.Get("X-RateLimit-Remaining"), gatewayLog.String())
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		var n uint64
		var status, mode string
		err := ch.QueryRow(ctx, "SELECT count(), any(store_status), any(mode) FROM "+db+".decisions WHERE gateway_id = ?", gwID).Scan(&n, &status, &mode)
		if err == nil && n == 1 {
			if status != "ok" || mode != "enforced" {
				t.Errorf("the row has store_status %q, mode %q; want ok, enforced", status, mode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows for %s = %d (err %v) after 60s, want 1\ngateway log:\n%s\nconsumer log:\n%s", gwID, n, err, gatewayLog.String(), consumerLog.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A poison record reaches the dead-letter topic: the consumer's
	// dead-letter producer uses the same SASL_SSL link.
	kafkaLink := boot.Kafka{Brokers: s.kafkaSecure.Addrs, TLS: boot.TLS{CAFile: s.certs.CA},
		SASL: boot.SASL{Mechanism: "SCRAM-SHA-256", Username: s.kafkaSecure.User, Password: boot.Secret(s.kafkaSecure.Password)}}
	opts, err := kafkaLink.Opts(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	kcl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic+"-dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer kcl.Close()
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := kcl.ProduceSync(pctx, &kgo.Record{Topic: topic, Value: []byte("not an event")}).FirstErr(); err != nil {
		t.Fatalf("produce over SASL_SSL: %v", err)
	}
	for got := false; !got; {
		fs := kcl.PollFetches(pctx)
		if err := pctx.Err(); err != nil {
			t.Fatalf("no dead letter after 60s: %v\nconsumer log:\n%s", err, consumerLog.String())
		}
		fs.EachRecord(func(r *kgo.Record) { got = got || string(r.Value) == "not an event" })
	}

	for name, logs := range map[string]string{"gateway -check": string(out), "gateway": gatewayLog.String(), "consumer": consumerLog.String()} {
		for _, pw := range s.secretsInFile {
			if strings.Contains(logs, pw) {
				t.Errorf("%s output shows a password", name)
			}
		}
	}
}

// secureRefuseBadConfig: each wrong setting stops the process at start
// with one line naming the link and the cause.
func secureRefuseBadConfig(t *testing.T, s *secureStack) {
	dir := t.TempDir()
	gatewayYAML := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(gatewayYAML, fmt.Appendf(nil, secureGatewayConfig, "http://127.0.0.1:1"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrongPW := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrongPW, []byte("not-the-password"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"EDGELIMIT_KEY_HASH_SECRET": "s", "EDGELIMIT_LISTEN": "127.0.0.1:0", "EDGELIMIT_ADMIN_LISTEN": "127.0.0.1:0",
		"EDGELIMIT_CONSUMER_ADMIN_LISTEN": "off"}
	redisAddr, brokers, chAddr := s.redis["EDGELIMIT_REDIS_ADDR"], s.kafka["EDGELIMIT_KAFKA_BROKERS"], s.clickhouse["EDGELIMIT_CLICKHOUSE_ADDR"]
	// The secure links as the check names them, before the cause.
	redisLink := "gateway: redis (" + redisAddr + ", tls): "
	kafkaLink := "gateway: kafka (" + brokers + ", tls, sasl SCRAM-SHA-512): "
	chLink := "consumer: clickhouse (" + chAddr + ", tls): "
	// Each command's links, as it is started with them.
	links := map[string]map[string]string{"gateway": merge(s.redis, s.kafka), "consumer": merge(s.clickhouse, s.kafka)}
	for _, tt := range []struct {
		name    string
		command string
		give    map[string]string // over the command's own links
		want    string
	}{
		{"redis wrong password", "gateway", map[string]string{"EDGELIMIT_REDIS_PASSWORD_FILE": wrongPW}, redisLink + "authentication failed: WRONGPASS"},
		{"redis untrusted certificate", "gateway", map[string]string{"EDGELIMIT_REDIS_TLS_CA_FILE": s.certs.UntrustedCA}, redisLink + "TLS handshake: x509: certificate signed by unknown authority"},
		{"redis without TLS", "gateway", map[string]string{"EDGELIMIT_REDIS_TLS_CA_FILE": "", "EDGELIMIT_REDIS_TLS_CERT_FILE": "", "EDGELIMIT_REDIS_TLS_KEY_FILE": ""},
			"gateway: redis (" + redisAddr + "): the server dropped the connection (does it require TLS, or SASL?)"},
		{"kafka wrong password", "gateway", map[string]string{"EDGELIMIT_KAFKA_SASL_PASSWORD_FILE": wrongPW}, kafkaLink + "authentication failed: SASL_AUTHENTICATION_FAILED"},
		{"kafka untrusted certificate", "gateway", map[string]string{"EDGELIMIT_KAFKA_TLS_CA_FILE": s.certs.UntrustedCA}, kafkaLink + "TLS handshake: x509: certificate signed by unknown authority"},
		{"kafka missing SASL", "consumer", map[string]string{"EDGELIMIT_KAFKA_SASL_MECHANISM": "", "EDGELIMIT_KAFKA_SASL_USERNAME": "", "EDGELIMIT_KAFKA_SASL_PASSWORD_FILE": ""},
			"consumer: kafka (" + brokers + ", tls): the server dropped the connection (does it require TLS, or SASL?)"},
		{"clickhouse wrong password", "consumer", map[string]string{"EDGELIMIT_CLICKHOUSE_PASSWORD_FILE": wrongPW}, chLink + "authentication failed: code: 193, message: Wrong password for user"},
		{"clickhouse untrusted certificate", "consumer", map[string]string{"EDGELIMIT_CLICKHOUSE_TLS_CA_FILE": s.certs.UntrustedCA}, chLink + "TLS handshake: x509: certificate signed by unknown authority"},
		{"clickhouse without TLS", "consumer", map[string]string{"EDGELIMIT_CLICKHOUSE_TLS_CA_FILE": ""},
			"consumer: clickhouse (" + chAddr + "): the server dropped the connection"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vars := merge(base, links[tt.command], tt.give)
			for k, v := range vars {
				if v == "" {
					delete(vars, k)
				}
			}
			args := []string{}
			if tt.command == "gateway" {
				args = []string{"-config", gatewayYAML}
			}
			cmd := s.command(tt.command, vars, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("%s started with %s; want it refused", tt.command, tt.name)
				}
			case <-time.After(2 * boot.CheckTimeout):
				cmd.Process.Kill()
				t.Fatalf("%s still running %v after start with %s; want it to stop at the check", tt.command, 2*boot.CheckTimeout, tt.name)
			}
			got := strings.TrimSpace(stderr.String())
			t.Logf("%s", got)
			if !strings.Contains(got, tt.want) {
				t.Errorf("stderr = %q, want it to contain %q", got, tt.want)
			}
			if strings.Contains(got, "not-the-password") || strings.Count(got, "\n") > 0 {
				t.Errorf("stderr shows the password or is not one line: %q", got)
			}
		})
	}
}
