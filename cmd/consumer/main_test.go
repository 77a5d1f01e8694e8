package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/envdoc"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestEnvDocumented: docs/configuration.md's environment table lists
// exactly the variables the consumer reads.
func TestEnvDocumented(t *testing.T) {
	names, secrets := testenv.ConfigEnv(env(nil), loadConfig)
	envdoc.CheckEnv(t, "consumer", names, secrets)
}

func TestCheckRedactsAndDefaults(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"-check"}, env(map[string]string{
		"EDGELIMIT_CLICKHOUSE_ADDR":     "ch:9000",
		"EDGELIMIT_CLICKHOUSE_PASSWORD": "hunter2",
		"EDGELIMIT_KAFKA_BROKERS":       "k1:9092,k2:9092",
		"EDGELIMIT_RETENTION_RAW_DAYS":  "7",
	}), &out)
	if err != nil {
		t.Fatalf("run -check: %v", err)
	}
	s := out.String()
	if strings.Contains(s, "hunter2") || !strings.Contains(s, "[redacted]") {
		t.Errorf("-check output shows the password or no redaction:\n%s", s)
	}
	for _, want := range []string{"- k1:9092", "- k2:9092", "raw_days: 7", "rollup_days: 400", "migrate: true", "addr: ch:9000"} {
		if !strings.Contains(s, want) {
			t.Errorf("-check output lacks %q:\n%s", want, s)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("clickhouse:\n  adress: x:9000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ok := map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k:9092"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "no clickhouse", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_KAFKA_BROKERS": "k:9092"}, want: "clickhouse.addr"},
		{name: "no brokers", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000"}, want: "no brokers"},
		{name: "misspelt field", args: []string{"-config", typo, "-check"}, env: ok, want: "adress"},
		{name: "missing file", args: []string{"-config", filepath.Join(dir, "nope.yaml")}, env: ok, want: "no such file"},
		{name: "bad days", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k", "EDGELIMIT_RETENTION_RAW_DAYS": "x"}, want: "EDGELIMIT_RETENTION_RAW_DAYS"},
		{name: "bad level", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k", "EDGELIMIT_LOG_LEVEL": "loud"}, want: "log_level"},
		{name: "bad topic", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k", "EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC": "dead letters"}, want: `dead-letter topic: event: not a Kafka topic name: "dead letters"`},
		{name: "bad flag", args: []string{"-nope"}, env: ok, want: "not defined"},
		{name: "shards without a cluster name", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k",
			"EDGELIMIT_CLICKHOUSE_SHARDS": "ch-1:9000,ch-2:9000", "EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE": "local"}, want: "cluster.name"},
		{name: "shards on the front database", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k",
			"EDGELIMIT_CLICKHOUSE_SHARDS": "ch-1:9000", "EDGELIMIT_CLICKHOUSE_CLUSTER": "c", "EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE": "default"}, want: "cluster.local_database \"default\" is clickhouse.database"},
		{name: "cluster name not an identifier", args: []string{"-check"}, env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k",
			"EDGELIMIT_CLICKHOUSE_SHARDS": "ch-1:9000", "EDGELIMIT_CLICKHOUSE_CLUSTER": "c; DROP", "EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE": "l"}, want: "not a plain identifier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, env(tt.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%v) = %v, want an error mentioning %q", tt.args, err, tt.want)
			}
		})
	}
	if err := run(context.Background(), []string{"-config", empty, "-check"}, env(ok), io.Discard); err != nil {
		t.Errorf("run with an empty config file = %v, want nil", err)
	}
}

// TestCredentialsInAddressesRefused: a password inside a broker or
// ClickHouse address (user:password@host, a URL) is refused at start with a
// message naming the setting, and is neither repeated nor printed by
// -check, which would otherwise show it and every log line naming the
// server would carry it.
func TestCredentialsInAddressesRefused(t *testing.T) {
	base := map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "ch:9000", "EDGELIMIT_KAFKA_BROKERS": "k:9092"}
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "broker user info", env: map[string]string{"EDGELIMIT_KAFKA_BROKERS": "k:9092,user:hunter2@k2:9092"}, want: "broker 2 of 2"},
		{name: "broker url", env: map[string]string{"EDGELIMIT_KAFKA_BROKERS": "kafka://user:hunter2@k:9092"}, want: "broker 1 of 1"},
		{name: "clickhouse url", env: map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": "clickhouse://default:hunter2@ch:9000"}, want: "clickhouse.addr"},
		{name: "shard user info", env: map[string]string{"EDGELIMIT_CLICKHOUSE_SHARDS": "ch-1:9000,default:hunter2@ch-2:9000",
			"EDGELIMIT_CLICKHOUSE_CLUSTER": "c", "EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE": "l"}, want: "cluster.shards[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := maps.Clone(base)
			maps.Copy(e, tt.env)
			var out strings.Builder
			err := run(context.Background(), []string{"-check"}, env(e), &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(-check) = %v, want an error naming %q", err, tt.want)
			}
			if strings.Contains(fmt.Sprint(err)+out.String(), "hunter2") {
				t.Errorf("the password is repeated: error %v, output %q", err, out.String())
			}
		})
	}
}

// TestRunConsumesAndStops runs the command against the real ClickHouse and
// an embedded Kafka: it migrates, consumes every event, serves metrics,
// and stops cleanly when its context ends, logging JSON.
func TestRunConsumesAndStops(t *testing.T) {
	addr := testenv.ClickHouseAddr(t)
	root, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Protocol: clickhouse.Native})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	db := fmt.Sprintf("edgelimit_cmd_test_%d", time.Now().UnixNano())
	if err := root.Exec(context.Background(), "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })

	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := strings.Join(kc.ListenAddrs(), ",")
	admin := testenv.FreeAddr(t)

	// The file asks for the topics to be created: none exist yet.
	cfgPath := filepath.Join(t.TempDir(), "consumer.yaml")
	if err := os.WriteFile(cfgPath, []byte("kafka:\n  create_topics: true\n  partitions: 3\nbatch:\n  wait: 200ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out testenv.LogBuffer
	stop := testenv.Run(t, func(ctx context.Context) error {
		return run(ctx, []string{"-config", cfgPath}, env(map[string]string{
			"EDGELIMIT_CLICKHOUSE_ADDR":       addr,
			"EDGELIMIT_CLICKHOUSE_DATABASE":   db,
			"EDGELIMIT_KAFKA_BROKERS":         brokers,
			"EDGELIMIT_CONSUMER_ADMIN_LISTEN": admin,
			"EDGELIMIT_CONSUMER_GROUP":        "cmd-test",
		}), &out)
	})
	const n = 500
	produceEvents(t, kc.ListenAddrs(), 3, n)
	waitRows(t, root, db+".decisions", n, &out)
	// The metric follows the INSERT's return, a moment after the rows show.
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ok",
		"/metrics": fmt.Sprintf("edgelimit_consumer_rows_inserted_total %d", n),
	} {
		var last string
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(last, want) && time.Now().Before(deadline) {
			resp, err := http.Get("http://" + admin + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
			if resp.StatusCode != 200 {
				last = ""
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(last, want) {
			t.Errorf("GET %s never answered 200 containing %q", path, want)
		}
	}

	if err := stop(); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	lines := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("log line is not JSON: %q", sc.Text())
		}
		lines++
	}
	if !strings.Contains(out.String(), `"msg":"consumer stopped"`) || lines < 3 {
		t.Errorf("log lacks the shutdown line or is short (%d lines):\n%s", lines, out.String())
	}
	if _, err := net.Dial("tcp", admin); err == nil {
		t.Errorf("admin listener %s still accepts after run returned", admin)
	}
}

// TestRunWaitsForMissingTopics: with create_topics off, a decisions or
// dead-letter topic that does not exist (a typo, or not yet created) is
// named in the log, repeatedly, and the consumer waits for it; once both
// exist it consumes. It used to start, report ready and sit idle, saying
// nothing.
func TestRunWaitsForMissingTopics(t *testing.T) {
	addr := testenv.ClickHouseAddr(t)
	conn, db := testenv.NewDatabase(t, addr, "edgelimit_cmd_test")
	brokers := testenv.KafkaBrokers(t)
	suffix := fmt.Sprint(time.Now().UnixNano())
	topic, dead := "typo-"+suffix, "typo-dead-"+suffix
	var out testenv.LogBuffer
	stop := testenv.Run(t, func(ctx context.Context) error {
		return run(ctx, nil, env(map[string]string{
			"EDGELIMIT_CLICKHOUSE_ADDR":         addr,
			"EDGELIMIT_CLICKHOUSE_DATABASE":     db,
			"EDGELIMIT_KAFKA_BROKERS":           strings.Join(brokers, ","),
			"EDGELIMIT_KAFKA_TOPIC":             topic,
			"EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC": dead,
			"EDGELIMIT_CONSUMER_ADMIN_LISTEN":   "off",
			"EDGELIMIT_CONSUMER_GROUP":          "cmd-missing-" + suffix,
		}), &out)
	})
	for _, name := range []string{topic, dead} {
		testenv.WaitFor(t, 30*time.Second, "a log line naming the missing topic "+name, func() bool {
			return strings.Contains(out.String(), `kafka topic \"`+name+`\" does not exist`)
		})
		testenv.CreateTopics(t, brokers, 1, name)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const n = 50
	var recs []*kgo.Record
	now := time.Now()
	for range n {
		b, err := event.Encode(event.Decision{ID: event.NewID(now), Time: now, GatewayID: "gw", Allowed: true})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Value: b, Headers: []kgo.RecordHeader{{Key: event.Header, Value: event.HeaderValue()}}})
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	waitRows(t, conn, "decisions", n, &out)
	if err := stop(); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
}

// produceEvents waits for the decisions topic to have its partitions, then
// produces n decision events to it.
func produceEvents(t *testing.T, brokers []string, partitions, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("decisions"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitTopic(t, cl, "decisions", partitions)
	var recs []*kgo.Record
	now := time.Now()
	for i := range n {
		b, err := event.Encode(event.Decision{ID: event.NewID(now), Time: now, GatewayID: "gw", KeyID: fmt.Sprint(i % 5), Allowed: true})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Value: b, Headers: []kgo.RecordHeader{{Key: event.Header, Value: event.HeaderValue()}}})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// waitRows waits (60s at most) for table, read through conn, to hold n
// rows; out is the command's log, shown on failure.
func waitRows(t *testing.T, conn driver.Conn, table string, n uint64, out *testenv.LogBuffer) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("%d rows in %s", n, table), func() bool {
		var c uint64
		_ = conn.QueryRow(context.Background(), "SELECT count() FROM "+table).Scan(&c)
		if c > n {
			t.Fatalf("rows in %s = %d, want %d; log:\n%s", table, c, n, out.String())
		}
		return c == n
	})
}

// TestRunOnCluster runs the command against a two-shard ClickHouse 18.16
// cluster named in its environment: it migrates each shard's local
// database, puts Distributed tables in front of them, and stores every
// event once through them, spread over the shards.
func TestRunOnCluster(t *testing.T) {
	srv := testenv.Private(t, "clickhouse-cluster")
	suffix := fmt.Sprint(time.Now().UnixNano())
	local, front := "local_"+suffix, "front_"+suffix
	shards := testenv.ClusterShards(t, srv, local, front)
	addr1, addr2 := srv.Get(t, "EDGELIMIT_CLICKHOUSE_SHARD1"), srv.Get(t, "EDGELIMIT_CLICKHOUSE_SHARD2")
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "decisions", "decisions-dead-letter"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	var out testenv.LogBuffer
	stop := testenv.Run(t, func(ctx context.Context) error {
		return run(ctx, nil, env(map[string]string{
			"EDGELIMIT_CLICKHOUSE_ADDR":           addr1,
			"EDGELIMIT_CLICKHOUSE_DATABASE":       front,
			"EDGELIMIT_CLICKHOUSE_SHARDS":         addr1 + "," + addr2,
			"EDGELIMIT_CLICKHOUSE_CLUSTER":        srv.Get(t, "EDGELIMIT_CLICKHOUSE_CLUSTER"),
			"EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE": local,
			"EDGELIMIT_KAFKA_BROKERS":             strings.Join(kc.ListenAddrs(), ","),
			"EDGELIMIT_CONSUMER_ADMIN_LISTEN":     "off",
			"EDGELIMIT_CONSUMER_GROUP":            "cmd-cluster-test",
		}), &out)
	})
	const n = 600
	produceEvents(t, kc.ListenAddrs(), 2, n)
	frontConn := testenv.OpenClickHouse(t, addr1, front)
	waitRows(t, frontConn, "decisions", n, &out)
	for _, table := range []string{"decisions", "decisions_ledger", "decisions_claims"} {
		var engine string
		if err := frontConn.QueryRow(t.Context(), "SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = ?", table).Scan(&engine); err != nil || engine != "Distributed" {
			t.Errorf("%s.%s engine = %q (%v), want Distributed", front, table, engine, err)
		}
	}
	for i, sh := range shards {
		var c uint64
		if err := sh.QueryRow(t.Context(), "SELECT count() FROM "+local+".decisions").Scan(&c); err != nil || c == 0 || c == n {
			t.Errorf("shard %d holds %d of %d rows (%v), want a share", i+1, c, n, err)
		}
	}
	if err := stop(); err != nil {
		t.Errorf("run after cancel = %v, want nil; log:\n%s", err, out.String())
	}
}

// waitTopic waits until topic exists with the given partitions.
func waitTopic(t *testing.T, cl *kgo.Client, topic string, partitions int) {
	t.Helper()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := adm.Metadata(context.Background(), topic)
		if err == nil {
			if td, ok := md.Topics[topic]; ok && td.Err == nil && len(td.Partitions) == partitions {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s with %d partitions did not appear: %v", topic, partitions, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-version"}, env(nil), &out); err != nil || !strings.HasPrefix(out.String(), "consumer dev (revision ") {
		t.Errorf("run -version = %v, %q; want \"consumer dev (revision ...\"", err, out.String())
	}
}

// TestRunStopsWhenCredentialsRefusedLater: a ClickHouse that is down at
// start is waited for, but once it answers and refuses the password, the
// consumer stops with the start check's line naming the link; it used to
// retry the migration forever, logging the refusal every 10s.
func TestRunStopsWhenCredentialsRefusedLater(t *testing.T) {
	target, user := testenv.ClickHouseAddr(t), testenv.SecureClickHouse(t).User
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	addr := testenv.FreeAddr(t) // nothing there yet: ClickHouse is "down"
	var out testenv.LogBuffer
	errc := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		errc <- run(ctx, nil, env(map[string]string{
			"EDGELIMIT_CLICKHOUSE_ADDR":       addr,
			"EDGELIMIT_CLICKHOUSE_USER":       user,
			"EDGELIMIT_CLICKHOUSE_PASSWORD":   "not-the-password",
			"EDGELIMIT_KAFKA_BROKERS":         strings.Join(kc.ListenAddrs(), ","),
			"EDGELIMIT_CONSUMER_ADMIN_LISTEN": testenv.FreeAddr(t),
		}), &out)
	}()
	testenv.WaitFor(t, time.Minute, "the consumer retries the migration", func() bool {
		return strings.Contains(out.String(), `"msg":"migrate failed; retrying"`)
	})
	if !strings.Contains(out.String(), `"msg":"ClickHouse not reachable at start; the consumer keeps trying"`) {
		t.Errorf("no warning that ClickHouse was not reachable at start:\n%s", out.String())
	}
	// ClickHouse comes up: the port now leads to the real server.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go io.Copy(s, c)
				io.Copy(c, s)
			}()
		}
	}()
	select {
	case err := <-errc:
		want := "clickhouse (" + addr + "): authentication failed: "
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run = %v, want an error with %q", err, want)
		}
		if err != nil && strings.Contains(err.Error()+out.String(), "not-the-password") {
			t.Errorf("the password was shown: %v\n%s", err, out.String())
		}
	case <-ctx.Done():
		t.Fatalf("run still retrying after ClickHouse refused the password:\n%s", out.String())
	}
}
