package analytics_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// holdConn holds a batch of the consumer open: once armed, the last of the
// batch's INSERTs (the key history rollup) writes its rows and then waits
// for release before it returns, so every table holds the batch's rows
// and its commit row is not written yet.
type holdConn struct {
	driver.Conn
	armed   chan struct{} // closed: hold the next batch
	held    chan struct{} // closed once a batch is held
	release chan struct{} // closed: let it go
}

func (c *holdConn) Exec(ctx context.Context, query string, args ...any) error {
	if !strings.HasPrefix(query, "INSERT INTO decisions_key_history_1m ") {
		return c.Conn.Exec(ctx, query, args...)
	}
	select {
	case <-c.armed:
	default:
		return c.Conn.Exec(ctx, query, args...)
	}
	if err := c.Conn.Exec(ctx, query, args...); err != nil {
		return err
	}
	select {
	case <-c.held:
	default:
		close(c.held)
	}
	select {
	case <-c.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readings is what the readers answer for one key: the detector's two
// queries, the key page's history, totals and rejections.
type readings struct {
	Total   int64
	Hot     []analytics.KeyTraffic
	Recent  []analytics.KeyTraffic
	History []analytics.KeyPoint
	Top     []analytics.KeyRejections
}

func read(tb testing.TB, r *analytics.Reader, key string, from, to time.Time) readings {
	tb.Helper()
	ctx := context.Background()
	var (
		got readings
		err error
	)
	rg := analytics.Range{From: from, To: to, KeyID: key}
	if got.Total, err = r.TotalRequests(ctx, from, to); err != nil {
		tb.Fatal(err)
	}
	if got.Hot, err = r.KeyTraffic(ctx, from, to, 1, 10); err != nil {
		tb.Fatal(err)
	}
	if got.Recent, err = r.RecentKeyTraffic(ctx, from, to, from, 1, 10); err != nil {
		tb.Fatal(err)
	}
	if got.History, err = r.KeyHistory(ctx, rg, analytics.BucketHour); err != nil {
		tb.Fatal(err)
	}
	if got.Top, err = r.TopKeys(ctx, analytics.Range{From: from, To: to}, 10); err != nil {
		tb.Fatal(err)
	}
	return got
}

// TestUncommittedRowsUnread: a batch of the real consumer (real Kafka, real
// ClickHouse) has written its raw rows and every rollup but not its commit
// row. The detectors read it anyway: hot_keys_recent read the raw table
// with no committed-batch filter, so hot keys and splits could be driven
// by rows about to be aborted or written again. Every reader must answer
// as before the batch until it commits, and count it once it has.
func TestUncommittedRowsUnread(t *testing.T) {
	ch := mustDatabase(t)
	brokers := testenv.KafkaBrokers(t)
	suffix := fmt.Sprint(time.Now().UnixNano())
	topic, dlq := "decisions-"+suffix, "dead-letter-"+suffix
	testenv.CreateTopics(t, brokers, 1, topic, dlq)

	hold := &holdConn{Conn: ch, armed: make(chan struct{}), held: make(chan struct{}), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, DeadLetterTopic: dlq, Group: "test-" + topic,
		BatchWait: 100 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond,
		// Longer than the test reads while the batch is held.
		InsertTimeout: 30 * time.Second,
	}, hold, reg, slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	stop := testenv.Run(t, c.Run)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	now := time.Now().UTC().Truncate(time.Second)
	from, to := now.Add(-10*time.Minute), now.Add(time.Minute)
	events := func(n int) []*kgo.Record {
		var recs []*kgo.Record
		for i := range n {
			at := now.Add(-time.Duration(i) * time.Second)
			b, err := event.Encode(event.Decision{
				ID: event.NewID(at), Time: at, GatewayID: "gw-a", KeyID: "hot", KeyKind: event.KindAPIKey,
				Route: "/v1/x", Method: "GET", Plan: "free", BindingRule: "minute",
				Allowed: i%5 != 0, Limit: 100, Cost: 1, StoreStatus: event.StoreOK, Mode: event.ModeEnforced,
			})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Topic: topic, Value: b, Headers: []kgo.RecordHeader{{Key: event.Header, Value: event.HeaderValue()}}})
		}
		return recs
	}
	produce := func(recs []*kgo.Record) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	inserted := func() float64 { return rowsInserted(t, reg) }
	r := analytics.NewReader(ch)

	produce(events(40))
	testenv.WaitFor(t, 30*time.Second, "the first batch committed", func() bool { return inserted() == 40 })
	before := read(t, r, "hot", from, to)
	if before.Total != 40 {
		t.Fatalf("TotalRequests after the first batch = %d, want 40", before.Total)
	}

	close(hold.armed)
	produce(events(60))
	select {
	case <-hold.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the second batch was never held")
	}
	var raw uint64
	if err := ch.QueryRow(context.Background(), "SELECT count() FROM decisions").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if raw != 100 {
		t.Fatalf("raw rows while the second batch is held = %d, want 100 (the test shows nothing)", raw)
	}
	if diff := cmp.Diff(before, read(t, r, "hot", from, to)); diff != "" {
		t.Errorf("readers see a batch that has not committed (-committed +read):\n%s", diff)
	}

	close(hold.release)
	testenv.WaitFor(t, 30*time.Second, "the second batch committed", func() bool { return inserted() == 100 })
	if after := read(t, r, "hot", from, to); after.Total != 100 {
		t.Errorf("TotalRequests after the second batch committed = %d, want 100", after.Total)
	}
}

// rowsInserted reads the consumer's rows_inserted counter from reg.
func rowsInserted(tb testing.TB, reg *prometheus.Registry) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "edgelimit_consumer_rows_inserted_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// fromTable matches what a query reads, after FROM or JOIN: a table or a
// subquery.
var fromTable = regexp.MustCompile(`(?i)(^|[^@\w])(FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_.]*|\()`)

// uncommittedReads returns the tables that sql reads without {committed}
// in the WHERE clause of the same SELECT: a consumer table (its name
// starts with "decisions") read any other way counts rows of batches that
// have not committed. A table analytics does not know is reported too.
func uncommittedReads(sql string) []string {
	var lines []string
	for _, l := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	sql = strings.Join(lines, "\n")
	var bad []string
	for _, m := range fromTable.FindAllStringSubmatchIndex(sql, -1) {
		table := sql[m[6]:m[7]]
		if table == "(" {
			continue // a subquery: its own FROM is checked
		}
		if !strings.HasPrefix(table, "decisions") {
			bad = append(bad, table+" (not a consumer table this check knows)")
			continue
		}
		if !whereHasCommitted(sql[m[1]:]) {
			bad = append(bad, table)
		}
	}
	return bad
}

// clauseEnd and where start the clauses whereHasCommitted tells apart.
var (
	clauseEnd = regexp.MustCompile(`(?i)^(GROUP\s+BY|ORDER\s+BY|HAVING|LIMIT|UNION)\b`)
	where     = regexp.MustCompile(`(?i)^WHERE\b`)
)

// whereHasCommitted reports whether rest, the text after a FROM table,
// has a WHERE at its own level whose conditions include {committed} at that
// level, before the SELECT ends (its closing parenthesis, GROUP BY, ORDER
// BY, HAVING, LIMIT, UNION or the end).
func whereHasCommitted(rest string) bool {
	depth, inWhere := 0, false
	for i := 0; i < len(rest); i++ {
		switch rest[i] {
		case '(':
			depth++
			continue
		case ')':
			if depth--; depth < 0 {
				return false
			}
			continue
		}
		if depth > 0 || i > 0 && isWord(rest[i-1]) {
			continue
		}
		s := rest[i:]
		switch {
		case clauseEnd.MatchString(s):
			return false
		case where.MatchString(s):
			inWhere = true
		case inWhere && strings.HasPrefix(s, "{committed}"):
			return true
		}
	}
	return false
}

func isWord(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// TestQueriesReadCommittedOnly pins the rule of TestUncommittedRowsUnread
// for every query analytics has: each read of a consumer table filters by
// {committed} (sql/part/committed.sql) in its own WHERE, so a new query
// cannot forget it.
func TestQueriesReadCommittedOnly(t *testing.T) {
	files, err := filepath.Glob("sql/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("queries: %v (%d files)", err, len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bad := uncommittedReads(string(b)); len(bad) > 0 {
			t.Errorf("%s reads %v without {committed} in the WHERE of the same SELECT", f, bad)
		}
	}
	part, err := os.ReadFile("sql/part/committed.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(part), "decisions_uncommitted") {
		t.Errorf("sql/part/committed.sql does not read decisions_uncommitted, the consumer's rule:\n%s", part)
	}

	// The check itself.
	for _, tt := range []struct {
		name string
		give string
		want []string
	}{
		{name: "filtered", give: "SELECT 1 FROM decisions WHERE time > 0 AND {committed} GROUP BY x"},
		{name: "no where", give: "SELECT 1 FROM decisions GROUP BY x", want: []string{"decisions"}},
		{name: "filter after group by", give: "SELECT 1 FROM decisions WHERE a GROUP BY x HAVING {committed}", want: []string{"decisions"}},
		{name: "filter only in a subquery", give: "SELECT 1 FROM decisions_by_key_1m WHERE k IN (SELECT k FROM decisions WHERE {committed})",
			want: []string{"decisions_by_key_1m"}},
		{name: "subquery unfiltered", give: "SELECT 1 FROM decisions WHERE {committed} AND k IN (SELECT k FROM decisions_by_ip_1m WHERE a)",
			want: []string{"decisions_by_ip_1m"}},
		{name: "commented out", give: "SELECT 1 FROM decisions WHERE a\n-- AND {committed}\n", want: []string{"decisions"}},
		{name: "unknown table", give: "SELECT 1 FROM system.parts WHERE {committed}", want: []string{"system.parts (not a consumer table this check knows)"}},
	} {
		if got := uncommittedReads(tt.give); !cmp.Equal(got, tt.want) {
			t.Errorf("%s: uncommittedReads(%q) = %q, want %q", tt.name, tt.give, got, tt.want)
		}
	}
}
