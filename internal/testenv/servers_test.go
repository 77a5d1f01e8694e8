package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// These tests prove that the servers deploy/local/testenv.sh starts really
// serve, with the clients the product uses.

func testContext(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// uniqueName is a table or topic name no other test run uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// insertRows inserts n rows into table, naming the columns: the only INSERT
// form that clickhouse-go v2 gets right against ClickHouse 18.16.
func insertRows(tb testing.TB, ctx context.Context, conn driver.Conn, table string, n int) {
	tb.Helper()
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+table+" (id, name)")
	if err != nil {
		tb.Fatalf("PrepareBatch: %v", err)
	}
	for i := range n {
		if err := batch.Append(uint64(i), fmt.Sprintf("row-%d", i)); err != nil {
			tb.Fatalf("Append: %v", err)
		}
	}
	if err := batch.Send(); err != nil {
		tb.Fatalf("Send: %v", err)
	}
}

func countRows(tb testing.TB, ctx context.Context, conn driver.Conn, table string) uint64 {
	tb.Helper()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+table).Scan(&n); err != nil {
		tb.Fatalf("SELECT count() FROM %s: %v", table, err)
	}
	return n
}

func createTable(tb testing.TB, ctx context.Context, conn driver.Conn) string {
	tb.Helper()
	table := uniqueName("testenv")
	if err := conn.Exec(ctx, "CREATE TABLE "+table+" (id UInt64, name String) ENGINE = MergeTree ORDER BY id"); err != nil {
		tb.Fatalf("CREATE TABLE: %v", err)
	}
	return table
}

func TestClickHouse(t *testing.T) {
	t.Parallel()
	addr := testenv.ClickHouseAddr(t)
	ctx := testContext(t, 30*time.Second)
	conn := testenv.OpenClickHouse(t, addr, "default")

	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		t.Fatalf("SELECT version(): %v", err)
	}
	t.Logf("ClickHouse %s at %s", version, addr)

	table := createTable(t, ctx, conn)
	t.Cleanup(func() { conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	insertRows(t, ctx, conn, table, 3)
	if got := countRows(t, ctx, conn, table); got != 3 {
		t.Errorf("count() = %d, want 3", got)
	}

	// The HTTP port answers too (plain HTTP; clickhouse-go's HTTP
	// protocol does not work with 18.16).
	resp, err := http.Get("http://" + testenv.ClickHouseHTTPAddr(t) + "/?query=" + "SELECT%20count()%20FROM%20" + table)
	if err != nil {
		t.Fatalf("ClickHouse HTTP: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if got := strings.TrimSpace(string(body)); resp.StatusCode != http.StatusOK || got != "3" {
		t.Errorf("HTTP count() = %d %q, want 200 \"3\"", resp.StatusCode, got)
	}
}

func TestPrivateClickHouseHaltResume(t *testing.T) {
	t.Parallel()
	s := testenv.Private(t, "clickhouse")
	addr := s.Get(t, "EDGELIMIT_CLICKHOUSE_ADDR")
	ctx := testContext(t, 60*time.Second)
	conn := testenv.OpenClickHouse(t, addr, "default")
	table := createTable(t, ctx, conn)
	insertRows(t, ctx, conn, table, 2)

	s.Halt(t)
	if err := conn.Ping(ctx); err == nil {
		t.Fatalf("Ping() after Halt = nil, want an error")
	}
	s.Resume(t)
	// A new connection: the old ones died with the server.
	conn = testenv.OpenClickHouse(t, addr, "default")
	if got := countRows(t, ctx, conn, table); got != 2 {
		t.Errorf("count() after Resume = %d, want 2 (data kept)", got)
	}
}

func newKafkaClient(tb testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	tb.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		tb.Fatalf("kgo.NewClient: %v", err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

// produceAndConsume creates topic, writes one record and reads it back.
func produceAndConsume(tb testing.TB, ctx context.Context, brokers []string, topic, value string) {
	tb.Helper()
	adm := kadm.NewClient(newKafkaClient(tb, brokers))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		tb.Fatalf("CreateTopic(%s): %v", topic, err)
	}
	produceOne(tb, ctx, brokers, topic, value)
	if got := consumeOne(tb, ctx, brokers, topic); got != value {
		tb.Errorf("consumed %q, want %q", got, value)
	}
}

func produceOne(tb testing.TB, ctx context.Context, brokers []string, topic, value string) {
	tb.Helper()
	cl := newKafkaClient(tb, brokers)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(value)}).FirstErr(); err != nil {
		tb.Fatalf("ProduceSync(%s): %v", topic, err)
	}
}

func consumeOne(tb testing.TB, ctx context.Context, brokers []string, topic string) string {
	tb.Helper()
	cl := newKafkaClient(tb, brokers,
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			tb.Fatalf("PollFetches(%s): no record before %v", topic, err)
		}
		fs.EachError(func(t string, p int32, err error) {
			tb.Logf("fetch %s/%d: %v", t, p, err)
		})
		if recs := fs.Records(); len(recs) > 0 {
			return string(recs[0].Value)
		}
	}
}

func TestKafka(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	ctx := testContext(t, 60*time.Second)

	adm := kadm.NewClient(newKafkaClient(t, brokers))
	meta, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatalf("BrokerMetadata: %v", err)
	}
	if len(meta.Brokers) != 1 {
		t.Errorf("brokers = %v, want one", meta.Brokers)
	}
	produceAndConsume(t, ctx, brokers, uniqueName("testenv"), "hello")
}

func TestPrivateKafkaHaltResume(t *testing.T) {
	t.Parallel()
	s := testenv.Private(t, "kafka")
	brokers := s.Brokers(t)
	ctx := testContext(t, 2*time.Minute)
	topic := uniqueName("testenv")
	produceAndConsume(t, ctx, brokers, topic, "before")

	s.Halt(t)
	s.Resume(t)
	// The record written before the halt is still there: same data.
	if got := consumeOne(t, ctx, brokers, topic); got != "before" {
		t.Errorf("consumed after Resume %q, want %q", got, "before")
	}
}

func TestPrometheus(t *testing.T) {
	t.Parallel()
	for _, url := range []string{testenv.PrometheusURL(t), testenv.AlertmanagerURL(t)} {
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			t.Fatalf("GET %s/-/ready: %v", url, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s/-/ready = %d, want 200", url, resp.StatusCode)
		}
	}

	// A rule file dropped into the rules folder loads on /-/reload.
	group := uniqueName("testenv")
	rule := "groups:\n  - name: " + group + "\n    rules:\n      - record: " + group + ":one\n        expr: vector(1)\n"
	testenv.PrometheusFile(t, "rules", group, []byte(rule))
	resp, err := http.Get(testenv.PrometheusURL(t) + "/api/v1/rules")
	if err != nil {
		t.Fatalf("GET /api/v1/rules: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"name":"`+group+`"`) {
		t.Errorf("GET /api/v1/rules = %s, want group %s", body, group)
	}
}

func TestPrivateRedisHaltResume(t *testing.T) {
	t.Parallel()
	s := testenv.Private(t, "redis")
	addr := s.Get(t, "EDGELIMIT_REDIS_ADDR")
	if _, ok := s.Env["EDGELIMIT_REDIS_CLUSTER_ADDRS"]; ok {
		t.Errorf("private redis started a cluster: %v", s.Env)
	}
	ctx := testContext(t, 30*time.Second)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Halt(t)
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatalf("PING after Halt = nil, want an error")
	}
	s.Resume(t)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
	// It saves nothing, so it comes back empty.
	if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET k after Resume = %v, want redis.Nil", err)
	}
}

func TestChromium(t *testing.T) {
	t.Parallel()
	bin := testenv.Chromium(t)
	ctx := testContext(t, 60*time.Second)
	out, err := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu",
		"--user-data-dir="+t.TempDir(), "--dump-dom", "data:text/html,<p id=x>edgelimit</p>").Output()
	if err != nil {
		t.Fatalf("%s --dump-dom: %v", bin, err)
	}
	if !strings.Contains(string(out), "<p id=\"x\">edgelimit</p>") {
		t.Errorf("--dump-dom = %q, want the page's paragraph", out)
	}
}
