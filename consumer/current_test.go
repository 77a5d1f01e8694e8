package consumer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCurrentClickHouse runs the schema, every migration's DDL (TTLs
// included), inserts shaped like the consumer's and every analytics query,
// parameters bound as the driver binds them (client side, into the text), on
// current ClickHouse: PyPI's chdb-core, in process (deploy/local/chdb.sh
// installs it into a cache CI keeps). ClickHouse 18.16 runs the real-server
// tests; this catches SQL that only 18.16 accepts.
func TestCurrentClickHouse(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("../deploy/local/chdb.sh").Output()
	if err != nil {
		if os.Getenv("EDGELIMIT_REQUIRE_SERVERS") != "" {
			t.Fatalf("deploy/local/chdb.sh: %v", err)
		}
		t.Skipf("no chdb: %v", err)
	}
	python := strings.TrimSpace(string(out))

	type step struct {
		Name string `json:"name"`
		SQL  string `json:"sql"`
	}
	var steps []step
	add := func(name, sql string, args ...any) {
		steps = append(steps, step{name, bindPositional(t, sql, args...)})
	}
	// addBound adds SQL whose values are already literals (they may hold ?).
	addBound := func(name, sql string) { steps = append(steps, step{name, sql}) }
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	add("max partitions", qMaxPartitions)
	// The consumer's ALTERs return before their mutations end (it polls
	// system.mutations for its deletes); chdb's session waits for each,
	// and a TTL modified over the 150 seeded parts below is materialized
	// part by part: ~200 s of the suite for SQL that is checked, not run.
	addBound("session: mutations in the background", "SET mutations_sync = 0")
	addBound("session: TTLs checked, not materialized", "SET materialize_ttl_after_modify = 0")
	for k, v := range migrationSettings {
		addBound("migration setting "+k, fmt.Sprintf("SET %s = %v", k, v))
	}
	for _, m := range ms {
		for i, s := range m.stmts {
			add(fmt.Sprintf("%s #%d", m.name, i+1), s)
		}
		if m.version == 2 {
			// A key rollup of 150 days before migration 003, which copies
			// it whole (and 006 copies it again), a day an INSERT.
			for d := range 150 {
				add(fmt.Sprintf("seed key rollup day %d", d), "INSERT INTO decisions_by_key_1m (minute, key_id, requests) VALUES (?, 'seeded', 1)",
					testStart.AddDate(0, 0, -d))
			}
		}
	}
	add("count seeded key rollup", "SELECT sum(requests) FROM decisions_by_key_1m WHERE key_id = 'seeded'")
	add("count seeded key history", "SELECT sum(requests) FROM decisions_key_history_1m WHERE key_id = 'seeded'")
	for _, rt := range retainedTables {
		// Longer than the batch below spans, which it would drop.
		add("ttl "+rt.name, strings.NewReplacer("{table}", rt.name, "{column}", rt.column).Replace(qModifyTTL), 400)
	}
	add("columns", qDecisionsColumns)
	add("engine", qTableEngine, "decisions")

	// A batch as the consumer writes it.
	const n = 100
	ds := decisions(n)
	// Over more days (one a row) than one INSERT may write (current
	// ClickHouse's max_partitions_per_insert_block, 100 by default, set
	// to 50 below): the raw table and the rollups are written in slices of
	// days, as stageSlices makes them.
	rows := make([]row, n)
	for i, d := range ds {
		d.Time = d.Time.AddDate(0, 0, -i*3/2)
		rows[i] = row{d: d, topic: "decisions", partition: int32(i % 2), offset: int64(i / 2)}
	}
	first, last := yyyymmdd(rows[n-1].d.Time), yyyymmdd(rows[0].d.Time)
	mid := yyyymmdd(rows[n/2-1].d.Time) // rows are newest first: slices of 50 days
	slices := []string{stageSlice("decisions_stage_1", first, mid-1), stageSlice("decisions_stage_1", mid, last)}
	c := &Consumer{stage: "decisions_stage_1", batch: 7}
	add("create stage", c.stageSQL(qCreateStage))
	add("truncate stage", c.stageSQL(qTruncateStage))
	addBound("stage rows", qInsertRows(c.stage)+" VALUES "+valuesSQL(t, rows, c.batch))
	addBound("ledger intent", qInsertLedger+" VALUES "+literalTuple(t, c.batch, "decisions", "00ff", int32(0), int64(0), int64(49), int32(1), uint32(1), stateIntent, uint32(50), testStart, testStart))
	add("set max partitions", "SET max_partitions_per_insert_block = 50")
	add("unsliced raw is refused", c.stageSQL(qInsertRaw), c.batch)
	for j, src := range slices {
		add(fmt.Sprintf("raw slice %d", j), strings.ReplaceAll(qInsertRaw, "{stage}", src), c.batch)
		for i, q := range qRollups {
			add(fmt.Sprintf("rollup %s slice %d", batchTables[i+1], j), strings.ReplaceAll(q, "{stage}", src), c.batch)
		}
	}
	addBound("ledger commit", qInsertLedger+" VALUES "+literalTuple(t, c.batch, "decisions", "00ff", int32(0), int64(0), int64(49), int32(1), uint32(1), stateCommitted, uint32(50), testStart, testStart))
	add("count raw", "SELECT count() FROM decisions")
	add("count key rollup", "SELECT sum(requests) FROM decisions_by_key_1m WHERE key_id != 'seeded'")
	add("count ip rollup", "SELECT countMerge(requests) FROM decisions_by_ip_1m")
	add("count gateway rollup", "SELECT countMerge(requests) FROM decisions_by_gateway_1m")
	add("ledger rows", qLedgerRows, "decisions", int32(0), int64(-1))
	addBound("claim", qInsertClaim+" VALUES "+literalTuple(t, "decisions", int32(0), uint32(1), int32(1), "m"))
	add("fences", qMaxFences, "decisions")
	add("aborted", qAbortedBatches, "decisions")
	addBound("abort", qInsertAbort+" VALUES "+literalTuple(t, uint64(8), "decisions"))
	add("kill", qKillBatch, batchQueryPrefix(8)+"%")
	for _, tb := range batchTables {
		add("delete from "+tb, strings.ReplaceAll(qDeleteBatch, "{table}", tb), uint64(8))
		add("mutations of "+tb, qMutationsRunning, tb)
	}
	add("drop stage", c.stageSQL(qDropStage))

	// Every analytics query, its @parameters bound.
	files, err := filepath.Glob("../analytics/sql/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("analytics queries: %v (%d files)", err, len(files))
	}
	filters, err := os.ReadFile("../analytics/sql/part/key_filters.sql")
	if err != nil {
		t.Fatal(err)
	}
	clientNet, err := os.ReadFile("../analytics/sql/part/client_net.sql")
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../analytics/sql/part/committed.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// As analytics' mustSQL runs it: its parts spliced in.
		q := strings.NewReplacer("{key_filters}", strings.TrimSpace(string(filters)),
			"{client_net}", strings.TrimSpace(string(clientNet)), "{committed}", strings.TrimSpace(string(committed))).Replace(string(b))
		steps = append(steps, step{"analytics " + filepath.Base(f), bindNamed(t, q)})
	}

	in, err := json.Marshal(steps)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "testdata/chdb_run.py")
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = testWriter{t}
	res, err := cmd.Output()
	if err != nil {
		t.Fatalf("chdb_run.py: %v", err)
	}
	var results []struct{ Name, Error, Result string }
	if err := json.Unmarshal(res, &results); err != nil {
		t.Fatalf("chdb_run.py output: %v\n%s", err, res)
	}
	if len(results) != len(steps) {
		t.Fatalf("%d results for %d steps", len(results), len(steps))
	}
	for i, r := range results {
		switch r.Name {
		case "max partitions":
			if r.Result != `"100"` {
				t.Errorf("max_partitions_per_insert_block = %s, want \"100\" (the consumer's default)", r.Result)
			}
		case "unsliced raw is refused":
			if !strings.Contains(r.Error, "TOO_MANY_PARTS") {
				t.Errorf("an INSERT over %d days: error %q, want TOO_MANY_PARTS (else the test does not test slicing)", n, r.Error)
			}
			continue
		}
		if r.Error != "" {
			t.Errorf("%s on current ClickHouse: %s\nSQL: %s", r.Name, r.Error, steps[i].SQL)
		}
		if strings.HasPrefix(r.Name, "count seeded ") {
			if r.Result != "150" {
				t.Errorf("%s = %q, want 150 (the days seeded before migration 003)", r.Name, r.Result)
			}
		} else if strings.HasPrefix(r.Name, "count ") && r.Result != strconv.Itoa(n) {
			t.Errorf("%s = %q, want %d", r.Name, r.Result, n)
		}
	}
}

func yyyymmdd(t time.Time) uint32 {
	t = t.UTC()
	return uint32(t.Year()*10000 + int(t.Month())*100 + t.Day())
}

// literal formats v as the driver's client-side binding does.
func literal(t *testing.T, v any) string {
	t.Helper()
	switch x := v.(type) {
	case string:
		var b strings.Builder
		b.WriteByte('\'')
		for _, c := range []byte(x) {
			switch {
			case c == '\'' || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c < 0x20 || c >= 0x7f:
				fmt.Fprintf(&b, "\\x%02X", c)
			default:
				b.WriteByte(c)
			}
		}
		b.WriteByte('\'')
		return b.String()
	case time.Time:
		return "toDateTime('" + x.UTC().Format("2006-01-02 15:04:05") + "', 'UTC')"
	case int, int32, int64, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case []float64:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = literal(t, e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case []string:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = literal(t, e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	t.Fatalf("literal of %T", v)
	return ""
}

func literalTuple(t *testing.T, vs ...any) string {
	t.Helper()
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = literal(t, v)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// valuesSQL is rows as VALUES tuples in decisionColumns' order, then batch.
func valuesSQL(t *testing.T, rows []row, batch uint64) string {
	t.Helper()
	cols := make([][]any, len(decisionColumns))
	for i, c := range decisionColumns {
		vs := c.values([][]row{rows}, len(rows))
		// Each column's values are a slice of its own Go type; literal
		// says which element types it can write.
		s := reflect.ValueOf(vs)
		if s.Kind() != reflect.Slice {
			t.Fatalf("column %s: values of %T", c.name, vs)
		}
		for j := range s.Len() {
			cols[i] = append(cols[i], s.Index(j).Interface())
		}
	}
	tuples := make([]string, len(rows))
	for r := range rows {
		vs := make([]any, 0, len(cols)+1)
		for i := range cols {
			vs = append(vs, cols[i][r])
		}
		tuples[r] = literalTuple(t, append(vs, batch)...)
	}
	return strings.Join(tuples, ", ")
}

// bindPositional fills each ? with the next argument.
func bindPositional(t *testing.T, sql string, args ...any) string {
	t.Helper()
	parts := strings.Split(sql, "?")
	if len(parts)-1 != len(args) {
		t.Fatalf("%d placeholders, %d arguments in %s", len(parts)-1, len(args), sql)
	}
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(p)
		if i < len(args) {
			b.WriteString(literal(t, args[i]))
		}
	}
	return b.String()
}

// namedArgs are plausible values of every analytics parameter.
var namedArgs = map[string]any{
	"from": testStart.Add(-time.Hour), "to": testStart.Add(time.Hour), "recent": testStart, "warm_from": testStart.Add(-2 * time.Hour),
	"bucket": "15m", "by": "key", "top": 5, "top_limit": 6, "limit": 10,
	"min_requests": 1, "min_keys": 1, "min_user_agents": 1,
	"key": "key-1", "ip": "10.0.0.1", "rule": "", "route": "", "plan": "", "gateway": "",
	"kind": "api_key", "method": "GET", "tz": "Asia/Kathmandu",
	"lo": "", "hi": "~", "plans": []string{"free"}, "routes": []string{" none", "/v1/orders"},
	"by_key": 1, "by_plan": 0, "by_route": 1, "by_day": 1, "all_keys": 0, "keys": []string{"key-1", "acme"}, "key_names": []string{" none", "acme"},
}

// bindNamed fills each @name (after dropping comment lines, as the driver
// sees the query).
func bindNamed(t *testing.T, sql string) string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	return regexp.MustCompile(`@[a-z_]+`).ReplaceAllStringFunc(strings.Join(lines, "\n"), func(m string) string {
		v, ok := namedArgs[m[1:]]
		if !ok {
			t.Fatalf("no test value for parameter %s", m)
		}
		return literal(t, v)
	})
}
