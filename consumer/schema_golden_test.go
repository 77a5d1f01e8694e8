package consumer

import (
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata/schema.golden from a fresh database")

// schemaGolden is every table's SHOW CREATE TABLE after all migrations, on
// the ClickHouse the tests run (18.16), written from the migrations as they
// were before 002 lost its materialized views: an edit of a migration that
// databases have already applied must leave their end schema as it was.
const schemaGolden = "testdata/schema.golden"

// TestSchemaGolden: a new database and one migrated from version 2 (as the
// consumers of 002 left it, views and rollup rows included) end with the
// schema of schemaGolden, and 003 copies the old rollup rows once.
func TestSchemaGolden(t *testing.T) {
	t.Parallel()
	addr := testenv.ClickHouseAddr(t)
	ctx := context.Background()

	fresh, db := newDatabase(t, addr)
	got := showSchema(t, fresh, db)
	if *update {
		if err := os.WriteFile(schemaGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(schemaGolden)
	if err != nil {
		t.Fatalf("read golden (go test -run TestSchemaGolden -update writes it): %v", err)
	}
	want := string(b)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("new database's schema differs from %s (-want +got):\n%s", schemaGolden, diff)
	}

	old, db := testenv.NewDatabase(t, addr, "edgelimit_test")
	migrateTo(t, old, 2)
	// 002's consumers filled the rollups through materialized views, which
	// 003 drops; a view per rollup stands in for them unless 002 made it.
	for _, r := range []string{"decisions_by_key_1m", "decisions_by_ip_1m", "decisions_by_gateway_1m"} {
		view := "CREATE MATERIALIZED VIEW IF NOT EXISTS " + r + "_mv TO " + r + " AS SELECT toStartOfMinute(time) AS minute FROM decisions GROUP BY minute"
		if err := old.Exec(ctx, view); err != nil {
			t.Fatalf("%s: %v", view, err)
		}
	}
	insert(t, old, "INSERT INTO decisions_by_key_1m (minute, key_id, gateway_id, requests)",
		time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), "old-key", "gw-1", uint64(3))
	for _, q := range []string{
		"INSERT INTO decisions_by_ip_1m (minute, client_ip, requests) SELECT toDateTime(1740830400), '10.0.0.1', countState()",
		"INSERT INTO decisions_by_gateway_1m (minute, gateway_id, requests) SELECT toDateTime(1740830400), 'gw-1', countState()",
	} {
		if err := old.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := Migrate(ctx, old, Retention{}); err != nil {
		t.Fatalf("Migrate from version 2: %v", err)
	}
	if diff := cmp.Diff(want, showSchema(t, old, db)); diff != "" {
		t.Errorf("schema migrated from version 2 differs from %s (-want +got):\n%s", schemaGolden, diff)
	}
	// 003 again, as after a crash before it was recorded: nothing is
	// copied twice.
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if err := applyMigration(ctx, old, ms[2]); err != nil {
		t.Fatalf("003 again: %v", err)
	}
	for _, c := range []struct {
		query string
		want  uint64
	}{
		{"SELECT sum(requests) FROM decisions_by_key_1m WHERE batch_id = 0 AND key_id = 'old-key'", 3},
		{"SELECT sum(requests) FROM decisions_by_key_1m_v1 WHERE key_id = 'old-key'", 3},
		{"SELECT toUInt64(countMerge(requests)) FROM decisions_by_ip_1m WHERE batch_id = 0", 1},
		{"SELECT toUInt64(countMerge(requests)) FROM decisions_by_gateway_1m WHERE batch_id = 0", 1},
	} {
		if n := count(t, old, c.query); n != c.want {
			t.Errorf("%s = %d, want %d (the rows rolled up before 003, once)", c.query, n, c.want)
		}
	}
}

// migrateTo applies the migrations up to version v, recording each, as a
// consumer that carried no later one left the database.
func migrateTo(t *testing.T, conn driver.Conn, v uint32) {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(context.Background(), qCreateSchemaMigrations); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:v] {
		for _, s := range m.stmts {
			if err := conn.Exec(context.Background(), s); err != nil {
				t.Fatalf("%s: %v", m.name, err)
			}
		}
		insert(t, conn, qInsertMigration, m.version, m.name, time.Now())
	}
}

// showSchema returns SHOW CREATE TABLE of every table of database db, by
// name, with db written as {db}.
func showSchema(t *testing.T, conn driver.Conn, db string) string {
	t.Helper()
	var out strings.Builder
	err := eachRow(context.Background(), conn, "list tables", "SELECT name FROM system.tables WHERE database = currentDatabase() ORDER BY name", nil, func(rows driver.Rows) error {
		var name string
		if err := rows.Scan(&name); err != nil {
			return err
		}
		var create string
		if err := conn.QueryRow(context.Background(), "SHOW CREATE TABLE "+name).Scan(&create); err != nil {
			return err
		}
		out.WriteString(strings.ReplaceAll(create, db+".", "{db}.") + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}
