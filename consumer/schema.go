package consumer

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
)

// Migrations are applied in file-name order; each file's number is its
// version. Every statement is idempotent (IF NOT EXISTS; an ADD COLUMN of a
// column already there counts as done, see isDuplicateColumn), so a
// migration interrupted halfway, or run by two consumers at once, is simply
// applied again.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// Queries, one per file, parameters bound by the driver.
//
//go:embed query/*.sql
var queryFS embed.FS

func mustQuery(name string) string {
	b, err := queryFS.ReadFile("query/" + name + ".sql")
	if err != nil {
		panic(err) // embedded at build time: a missing file is a build bug
	}
	// Comment lines go: the driver recognises an INSERT by its first word.
	return strings.TrimSpace(withoutComments(string(b)))
}

// withoutComments returns sql without its "--" comment lines.
func withoutComments(sql string) string {
	var lines []string
	for _, l := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

var (
	qCreateSchemaMigrations = mustQuery("create_schema_migrations")
	qAppliedMigrations      = mustQuery("applied_migrations")
	qSchemaVersion          = mustQuery("schema_version")
	qCreateDistributed      = mustQuery("create_distributed")
	qCreateUncommitted      = mustQuery("create_uncommitted")
	qInsertMigration        = mustQuery("insert_migration")
	qDecisionsColumns       = mustQuery("decisions_columns")
	qInsertLedger           = mustQuery("insert_ledger")
	qLedgerRows             = mustQuery("ledger_rows")
	qAbortedBatches         = mustQuery("aborted_batches")
	qInsertAbort            = mustQuery("insert_abort")
	qKillBatch              = mustQuery("kill_batch")
	qMutationsRunning       = mustQuery("mutations_running")
	qMaxFences              = mustQuery("max_fences")
	qInsertClaim            = mustQuery("insert_claim")
	// These name the consumer's staging table ({stage}, made by the
	// consumer from digits, see stageName) or a table of batchTables ({table}).
	qCreateStage   = mustQuery("create_stage")
	qTruncateStage = mustQuery("truncate_stage")
	qStageDays     = mustQuery("stage_days")
	qMaxPartitions = mustQuery("max_partitions")
	qDropStage     = mustQuery("drop_stage")
	qStageTables   = mustQuery("stage_tables")
	qInsertRaw     = strings.ReplaceAll(mustQuery("insert_raw"), "{columns}", columnNames())
	qDeleteBatch   = mustQuery("delete_batch")
	qBatchDays     = mustQuery("batch_days")
	qRollups       = []string{mustQuery("insert_key_1m"), mustQuery("insert_ip_1m"), mustQuery("insert_gateway_1m"), mustQuery("insert_key_history_1m"),
		mustQuery("insert_accounting"), mustQuery("insert_seq_1m")}
	qTablePartitions = mustQuery("table_partitions")
	qTableEngine     = mustQuery("table_engine")
	// The two ALTERs name a table, which cannot be a bound parameter; the
	// {table} and {column} placeholders are filled only from retainedTables.
	qDropPartition = mustQuery("drop_partition")
	qModifyTTL     = mustQuery("modify_ttl")
)

// Retention says how long data is kept. Zero keeps data forever.
type Retention struct {
	// RawDays is how many days of the raw decisions table to keep.
	RawDays int
	// RollupDays is how many days of the per-minute rollups to keep.
	RollupDays int
}

// retainedTable is a table that retention applies to.
type retainedTable struct {
	name   string
	column string // its DateTime column
	raw    bool   // kept RawDays, else RollupDays
}

// retainedTables lists every day-partitioned table. decisions_offsets is not
// here: it is tiny and must outlive the raw rows.
var retainedTables = []retainedTable{
	{name: "decisions", column: "time", raw: true},
	{name: "decisions_by_key_1m", column: "minute"},
	{name: "decisions_by_ip_1m", column: "minute"},
	{name: "decisions_by_gateway_1m", column: "minute"},
	{name: "decisions_key_history_1m", column: "minute"},
	{name: "decisions_accounting", column: "time"},
	{name: "decisions_seq_1m", column: "minute"},
	{name: "decisions_ledger", column: "written_at", raw: true},
	// The rollups as they were before migration 003.
	{name: "decisions_by_key_1m_v1", column: "minute"},
	{name: "decisions_by_ip_1m_v1", column: "minute"},
	{name: "decisions_by_gateway_1m_v1", column: "minute"},
}

// batchTables are the tables a batch writes, each row tagged with its
// batch_id: an aborted batch's rows are deleted from each. After the raw
// table, the rollups in the order of qRollups.
var batchTables = []string{"decisions", "decisions_by_key_1m", "decisions_by_ip_1m", "decisions_by_gateway_1m", "decisions_key_history_1m",
	"decisions_accounting", "decisions_seq_1m"}

func (r Retention) days(t retainedTable) int {
	if t.raw {
		return r.RawDays
	}
	return r.RollupDays
}

type migration struct {
	version uint32
	name    string
	stmts   []string
}

func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var ms []migration
	for _, n := range names {
		base := path.Base(n)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.ParseUint(num, 10, 32)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number and '_'", base)
		}
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: uint32(v), name: base, stmts: splitStatements(string(b))})
	}
	return ms, nil
}

// splitStatements splits a migration file on semicolons after dropping "--"
// comment lines. The migrations contain no semicolons inside literals.
func splitStatements(sql string) []string {
	var stmts []string
	for _, s := range strings.Split(withoutComments(sql), ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

// Migrate creates or updates the ClickHouse schema in conn's database:
// every embedded migration not yet recorded in schema_migrations, then the
// retention TTLs where the server supports TTL (19.6 and later). On older
// servers retention is DropExpired's job. Migrate is safe to run at every
// start and from several consumers at once.
func Migrate(ctx context.Context, conn driver.Conn, r Retention) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	if err := conn.Exec(ctx, qCreateSchemaMigrations); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	applied, err := appliedMigrations(ctx, conn)
	if err != nil {
		return err
	}
	if err := newerSchema(slices.Collect(maps.Keys(applied)), ms[len(ms)-1].version); err != nil {
		return err
	}
	limited, err := partitionLimited(ctx, conn)
	if err != nil {
		return err
	}
	mctx := ctx
	if limited {
		mctx = clickhouse.Context(ctx, clickhouse.WithSettings(migrationSettings))
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		if err := applyMigration(mctx, conn, m); err != nil {
			return err
		}
		b, err := conn.PrepareBatch(ctx, qInsertMigration)
		if err != nil {
			return fmt.Errorf("record migration %s: %w", m.name, err)
		}
		if err := b.Append(m.version, m.name, time.Now()); err != nil {
			return fmt.Errorf("record migration %s: %w", m.name, err)
		}
		if err := b.Send(); err != nil {
			return fmt.Errorf("record migration %s: %w", m.name, err)
		}
	}
	if err := checkColumns(ctx, conn, decisionColumns); err != nil {
		return err
	}
	ttl, err := SupportsTTL(conn)
	if err != nil || !ttl {
		return err
	}
	return applyTTL(ctx, conn, r)
}

// migrationSettings are what migrations run with on a server that limits
// the partitions one INSERT writes (max_partitions_per_insert_block;
// current servers refuse an INSERT over it whole): migrations 003 and 006
// copy a rollup's whole history in one statement, one day partition each,
// 400 of them with the default retention, so the upgrade would fail at
// every start, 003 with its rollup renamed away. The copies make one part
// per partition, as many as there were.
var migrationSettings = clickhouse.Settings{"max_partitions_per_insert_block": 0}

// partitionLimited reports a server that has max_partitions_per_insert_block
// (ClickHouse 18.16 has not, and refuses a setting it does not know).
func partitionLimited(ctx context.Context, conn driver.Conn) (bool, error) {
	found := false
	err := eachRow(ctx, conn, "read max_partitions_per_insert_block", qMaxPartitions, nil, func(driver.Rows) error {
		found = true
		return nil
	})
	return found, err
}

// applyMigration runs m's statements, each of which may have run before (a
// migration interrupted before it was recorded runs again).
func applyMigration(ctx context.Context, conn driver.Conn, m migration) error {
	for i, s := range m.stmts {
		if err := conn.Exec(ctx, s); err != nil && !isDuplicateColumn(err) && !isRenamed(s, err) {
			return fmt.Errorf("migration %s statement %d: %w", m.name, i+1, err)
		}
	}
	return nil
}

// ErrSchemaNewer means the database holds a migration this consumer does
// not know: a newer consumer migrated it. An older consumer must not write
// a newer schema (it could miss a table the newer one fills, or resume by
// rules the newer one no longer keeps, and count rows twice), so it stops.
var ErrSchemaNewer = errors.New("consumer: the ClickHouse schema is newer than this consumer")

// SchemaVersion is the newest migration this consumer carries: the schema
// version it writes.
func SchemaVersion() uint32 {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		panic(fmt.Sprintf("embedded migrations: %v", err)) // a build bug
	}
	return ms[len(ms)-1].version
}

// newerSchema returns ErrSchemaNewer, saying what to do, if any of applied
// is above known.
func newerSchema(applied []uint32, known uint32) error {
	if len(applied) == 0 || slices.Max(applied) <= known {
		return nil
	}
	return fmt.Errorf("%w: schema version %d, this consumer writes version %d: stop it and run the newer consumer (see the README, Upgrading)",
		ErrSchemaNewer, slices.Max(applied), known)
}

// checkSchema returns ErrSchemaNewer when conn's database was migrated past
// SchemaVersion, or an error if it cannot tell.
func checkSchema(ctx context.Context, conn driver.Conn) error {
	var v uint32
	if err := conn.QueryRow(ctx, qSchemaVersion).Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	return newerSchema([]uint32{v}, SchemaVersion())
}

// distributedTables are the tables a consumer on a cluster writes through
// Distributed tables: every batch table, and the ledger, aborts and claims,
// so that every consumer sees one of each; and decisions_open, which each
// shard's ledger fills, for readers.
var distributedTables = append(slices.Clone(batchTables), "decisions_ledger", "decisions_aborts", "decisions_claims", "decisions_open")

// identifier matches the cluster and database names CreateDistributed
// writes into its SQL (names cannot be bound parameters).
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ErrIdentifier means a cluster or database name is not a plain identifier.
var ErrIdentifier = errors.New("consumer: not a plain identifier (letters, digits, _)")

// CheckIdentifier returns ErrIdentifier, naming what, unless name is a plain
// identifier.
func CheckIdentifier(what, name string) error {
	if !identifier.MatchString(name) {
		return fmt.Errorf("%w: %s %q", ErrIdentifier, what, name)
	}
	return nil
}

// CreateDistributed creates, in conn's database, a Distributed table in
// front of each of the consumer's tables in database local on every shard
// of cluster (as the servers' remote_servers name it), unless there is one.
// local must be migrated (Migrate) on every shard, conn's server included,
// whose local tables give the Distributed ones their columns. The consumer
// and analytics then use conn's database; the consumer also needs a
// connection to each shard's local database (Config.Shards). The view
// decisions_uncommitted, which readers filter by, is created there too,
// over the Distributed tables.
func CreateDistributed(ctx context.Context, conn driver.Conn, cluster, local string) error {
	if err := errors.Join(CheckIdentifier("cluster", cluster), CheckIdentifier("local database", local)); err != nil {
		return err
	}
	for _, t := range distributedTables {
		q := strings.NewReplacer("{table}", t, "{local}", local, "{cluster}", cluster).Replace(qCreateDistributed)
		if err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("create distributed %s over %s.%s: %w", t, cluster, local, err)
		}
	}
	if err := conn.Exec(ctx, qCreateUncommitted); err != nil {
		return fmt.Errorf("create decisions_uncommitted over %s.%s: %w", cluster, local, err)
	}
	return nil
}

// isDuplicateColumn reports ClickHouse refusing an ADD COLUMN of a column
// the table has: "column with this name already exists", ILLEGAL_COLUMN (44)
// on 18.16, DUPLICATE_COLUMN (15) on later servers. ClickHouse 18.16 has no
// ADD COLUMN IF NOT EXISTS, so a migration that adds a column and stopped
// before it was recorded finds the column there when it runs again: that
// statement is done. checkColumns still catches a column of the wrong type.
func isDuplicateColumn(err error) bool {
	var ex *proto.Exception
	return errors.As(err, &ex) && (ex.Code == 44 || ex.Code == 15) && strings.Contains(ex.Message, "already exists")
}

// isRenamed reports a RENAME that an earlier, interrupted run of its
// migration already made: the source is gone (UNKNOWN_TABLE, 60) or the
// target exists (TABLE_ALREADY_EXISTS, 57).
func isRenamed(stmt string, err error) bool {
	var ex *proto.Exception
	return strings.HasPrefix(stmt, "RENAME TABLE") && errors.As(err, &ex) && (ex.Code == 60 || ex.Code == 57)
}

// ErrSchema means the decisions table lacks a column the consumer writes, or
// has it with another type: a migration is missing.
var ErrSchema = errors.New("consumer: decisions table does not match the insert")

// checkColumns checks the decisions table against cols (decisionColumns),
// so a field added to the insert without its migration fails at start,
// naming the column, rather than at the first insert.
func checkColumns(ctx context.Context, conn driver.Conn, cols []column) error {
	have := map[string]string{}
	err := eachRow(ctx, conn, "read decisions columns", qDecisionsColumns, nil, func(rows driver.Rows) error {
		var name, typ string
		err := rows.Scan(&name, &typ)
		have[name] = typ
		return err
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range cols {
		switch typ, ok := have[c.name]; {
		case !ok:
			errs = append(errs, fmt.Errorf("%w: no column %s %s", ErrSchema, c.name, c.typ))
		case typ != c.typ:
			errs = append(errs, fmt.Errorf("%w: column %s is %s, want %s", ErrSchema, c.name, typ, c.typ))
		}
	}
	return errors.Join(errs...)
}

// eachRow runs query with args and calls scan on each row it returns; what
// says what the query reads, in errors. It is the loop of every read the
// consumer makes, so a caller is left with its columns and where they go.
func eachRow(ctx context.Context, conn driver.Conn, what, query string, args []any, scan func(driver.Rows) error) error {
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func appliedMigrations(ctx context.Context, conn driver.Conn) (map[uint32]bool, error) {
	applied := map[uint32]bool{}
	err := eachRow(ctx, conn, "read schema_migrations", qAppliedMigrations, nil, func(rows driver.Rows) error {
		var v uint32
		err := rows.Scan(&v)
		applied[v] = true
		return err
	})
	return applied, err
}

// SupportsTTL reports whether the server has table TTLs (ClickHouse 19.6
// and later).
func SupportsTTL(conn driver.Conn) (bool, error) {
	v, err := conn.ServerVersion()
	if err != nil {
		return false, fmt.Errorf("clickhouse server version: %w", err)
	}
	return ttlVersion(int(v.Version.Major), int(v.Version.Minor)), nil
}

func ttlVersion(major, minor int) bool {
	return major > 19 || major == 19 && minor >= 6
}

// applyTTL sets each table's TTL unless it already has the wanted one:
// changing a TTL rewrites data, so it is not repeated at every start.
func applyTTL(ctx context.Context, conn driver.Conn, r Retention) error {
	for _, t := range retainedTables {
		days := r.days(t)
		if days <= 0 {
			continue
		}
		var engine string
		if err := conn.QueryRow(ctx, qTableEngine, t.name).Scan(&engine); err != nil {
			return fmt.Errorf("read %s engine: %w", t.name, err)
		}
		if strings.Contains(engine, "toIntervalDay("+strconv.Itoa(days)+")") {
			continue
		}
		q := strings.NewReplacer("{table}", t.name, "{column}", t.column).Replace(qModifyTTL)
		if err := conn.Exec(ctx, q, days); err != nil {
			return fmt.Errorf("set %s TTL to %d days: %w", t.name, days, err)
		}
	}
	return nil
}

// DropExpired drops the day partitions older than the retention, for
// servers without TTL. It returns the partitions dropped as table/yyyymmdd.
// A partition is dropped once its whole day is older than the retention,
// counted in days from now's UTC date.
func DropExpired(ctx context.Context, conn driver.Conn, r Retention, now time.Time) ([]string, error) {
	var dropped []string
	for _, t := range retainedTables {
		days := r.days(t)
		if days <= 0 {
			continue
		}
		parts, err := tablePartitions(ctx, conn, t.name)
		if err != nil {
			return dropped, err
		}
		cutoff := expiryCutoff(now, days)
		for _, p := range parts {
			if p >= cutoff {
				continue
			}
			q := strings.NewReplacer("{table}", t.name).Replace(qDropPartition)
			if err := conn.Exec(ctx, q, p); err != nil {
				return dropped, fmt.Errorf("drop %s partition %d: %w", t.name, p, err)
			}
			dropped = append(dropped, fmt.Sprintf("%s/%d", t.name, p))
		}
	}
	return dropped, nil
}

// expiryCutoff returns the oldest day, as yyyymmdd, kept with days of
// retention: today and the days-1 before it.
func expiryCutoff(now time.Time, days int) uint32 {
	d := now.UTC().AddDate(0, 0, -(days - 1))
	return uint32(d.Year()*10000 + int(d.Month())*100 + d.Day())
}

func tablePartitions(ctx context.Context, conn driver.Conn, table string) ([]uint32, error) {
	var parts []uint32
	err := eachRow(ctx, conn, "list "+table+" partitions", qTablePartitions, []any{table}, func(rows driver.Rows) error {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		p, err := strconv.ParseUint(strings.Trim(s, "'"), 10, 32)
		if err != nil {
			return fmt.Errorf("partition %q is not yyyymmdd: %w", s, err)
		}
		parts = append(parts, uint32(p))
		return nil
	})
	return parts, err
}
