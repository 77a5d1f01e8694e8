package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t)) // migrated once
	ctx := context.Background()
	for range 2 {
		if err := Migrate(ctx, ch, Retention{RawDays: 7, RollupDays: 90}); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}
	var tables []string
	rows, err := ch.Query(ctx, "SELECT name FROM system.tables WHERE database = currentDatabase() ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	want := []string{
		"decisions", "decisions_aborts", "decisions_accounting", "decisions_by_gateway_1m", "decisions_by_gateway_1m_v1",
		"decisions_by_ip_1m", "decisions_by_ip_1m_v1", "decisions_by_key_1m", "decisions_by_key_1m_v1",
		"decisions_claims", "decisions_key_history_1m", "decisions_ledger", "decisions_offsets", "decisions_open",
		"decisions_open_mv", "decisions_seq_1m", "decisions_uncommitted", "schema_migrations",
	}
	if !slices.Equal(tables, want) {
		t.Errorf("tables = %v, want %v", tables, want)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if got := count(t, ch, "SELECT count() FROM schema_migrations"); got != uint64(len(ms)) {
		t.Errorf("schema_migrations rows = %d, want %d (one per migration, applied once)", got, len(ms))
	}
}

// TestCheckColumns: a column the insert writes but no migration created, or
// created with another type, stops Migrate with the column's name.
func TestCheckColumns(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t)) // Migrate checked decisionColumns
	ctx := context.Background()
	cols := slices.Clone(decisionColumns)
	cols = append(cols, col("region", "String", func(*row) string { return "" }))
	for i := range cols {
		if cols[i].name == "cost" {
			cols[i].typ = "Int32"
		}
	}
	err := checkColumns(ctx, ch, cols)
	if !errors.Is(err, ErrSchema) {
		t.Fatalf("checkColumns(+region, cost Int32) = %v, want %v", err, ErrSchema)
	}
	for _, want := range []string{"no column region String", "column cost is Int64, want Int32"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("checkColumns error %q does not say %q", err, want)
		}
	}
}

// TestAddColumnTwice: ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS, so
// a migration adding a column must survive running again after a crash.
func TestAddColumnTwice(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	ctx := context.Background()
	const add = "ALTER TABLE decisions ADD COLUMN added_twice String DEFAULT ''"
	if err := ch.Exec(ctx, add); err != nil {
		t.Fatal(err)
	}
	err := ch.Exec(ctx, add)
	if !isDuplicateColumn(err) {
		t.Errorf("adding added_twice again: isDuplicateColumn(%v) = false, want true", err)
	}
	if err := ch.Exec(ctx, "ALTER TABLE no_such_table ADD COLUMN x String"); isDuplicateColumn(err) {
		t.Errorf("isDuplicateColumn(%v) = true for another error", err)
	}
}

func TestMigrationsParse(t *testing.T) {
	t.Parallel()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 2 {
		t.Fatalf("migrations() = %d files, want at least 2", len(ms))
	}
	for i, m := range ms {
		if m.version != uint32(i+1) {
			t.Errorf("migration %s has version %d, want %d (no gaps)", m.name, m.version, i+1)
		}
		for _, s := range m.stmts {
			if s == "" || s[0] == '-' {
				t.Errorf("migration %s has an empty or comment statement %q", m.name, s)
			}
		}
	}
	if got := splitStatements("-- a; comment\nSELECT 1;\n\n  SELECT 2 ;\n-- end"); !slices.Equal(got, []string{"SELECT 1", "SELECT 2"}) {
		t.Errorf("splitStatements = %q", got)
	}
}

func TestTTLVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		major, minor int
		want         bool
	}{
		{18, 16, false}, {19, 5, false}, {19, 6, true}, {20, 1, true}, {24, 8, true},
	}
	for _, tt := range tests {
		if got := ttlVersion(tt.major, tt.minor); got != tt.want {
			t.Errorf("ttlVersion(%d, %d) = %v, want %v", tt.major, tt.minor, got, tt.want)
		}
	}
}

func TestExpiryCutoff(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 23, 0, 0, 0, time.UTC)
	tests := []struct {
		days int
		want uint32
	}{
		{1, 20250301}, {2, 20250228}, {30, 20250131},
	}
	for _, tt := range tests {
		if got := expiryCutoff(now, tt.days); got != tt.want {
			t.Errorf("expiryCutoff(%v, %d) = %d, want %d", now, tt.days, got, tt.want)
		}
	}
}

func TestDropExpired(t *testing.T) {
	t.Parallel()
	ch, _ := newDatabase(t, testenv.ClickHouseAddr(t))
	ctx := context.Background()
	ttl, err := SupportsTTL(ch)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	var rows []row
	for i, age := range []int{10, 4, 0} {
		d := decisions(1)[0]
		d.Time = now.AddDate(0, 0, -age)
		rows = append(rows, row{d: d, topic: "decisions", offset: int64(i)})
	}
	// Written the way the consumer writes a batch: staged, then raw and
	// rollups from the stage.
	c := &Consumer{ch: ch, stage: "decisions_stage_test", batch: 1}
	if err := c.fillStage(ctx, []*partition{{rows: rows}}, len(rows)); err != nil {
		t.Fatal(err)
	}
	if err := c.insertFromStage(ctx); err != nil {
		t.Fatal(err)
	}

	dropped, err := DropExpired(ctx, ch, Retention{RawDays: 3, RollupDays: 5}, now)
	if err != nil {
		t.Fatalf("DropExpired: %v", err)
	}
	day := func(age int) string { return now.AddDate(0, 0, -age).Format("20060102") }
	want := []string{
		"decisions/" + day(10), "decisions/" + day(4),
		"decisions_by_key_1m/" + day(10), "decisions_by_ip_1m/" + day(10), "decisions_by_gateway_1m/" + day(10),
		"decisions_key_history_1m/" + day(10), "decisions_seq_1m/" + day(10),
	}
	slices.Sort(dropped)
	slices.Sort(want)
	if !slices.Equal(dropped, want) {
		t.Errorf("DropExpired dropped %v, want %v", dropped, want)
	}
	if got := count(t, ch, "SELECT count() FROM decisions"); got != 1 {
		t.Errorf("raw rows left = %d, want 1 (today's)", got)
	}
	if got := count(t, ch, "SELECT toUInt64(sum(requests)) FROM decisions_by_key_1m"); got != 2 {
		t.Errorf("rollup requests left = %d, want 2", got)
	}
	if ttl {
		t.Log("server supports TTL; partition drops are the fallback being tested here")
	}
}

// TestUncommittedViewOneText: the decisions_uncommitted that
// CreateDistributed makes over Distributed tables is migration 008's, so
// readers of a cluster filter by the same rule as readers of one server.
func TestUncommittedViewOneText(t *testing.T) {
	t.Parallel()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.version != 8 {
			continue
		}
		if !slices.Contains(m.stmts, qCreateUncommitted) {
			t.Errorf("migration %s has no statement %q", m.name, qCreateUncommitted)
		}
		return
	}
	t.Fatal("no migration 008")
}
