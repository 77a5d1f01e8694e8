package consumer

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
)

// stagePrefix starts the name of every staging table of group's consumers;
// stageName(group, member) is the one of the group member member. Named
// after the member so that a table whose member is no longer in the group
// (a consumer killed, whose Run never dropped it) can be told apart from
// one in use, and dropped (sweepStages). Only digits are joined into the
// name.
func stagePrefix(group string) string {
	return "decisions_stage_" + strconv.FormatUint(hash64(group), 10) + "_"
}

func stageName(group, member string) string {
	return stagePrefix(group) + strconv.FormatUint(hash64(member), 10)
}

func hash64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// useStage names the staging table after the member this consumer is now
// (a lost session rejoins as another), dropping the one it used before.
// Callers hold mu.
func (c *Consumer) useStage(ctx context.Context) {
	member, _ := c.cl.GroupMetadata()
	name := stageName(c.cfg.Group, member)
	if name == c.stage {
		return
	}
	if c.stage == "" {
		c.stage = name
		return
	}
	if err := c.ch.Exec(ctx, c.stageSQL(qDropStage)); err != nil {
		c.log.Warn("drop staging table", "table", c.stage, "error", err)
	}
	c.stage = name
}

// sweepStages drops the staging tables of the group's consumers that are no
// longer members of it: killed ones, whose Run never dropped its table (a
// fleet of restarts left a table per restart). The tables are listed
// before the group is described, and only a Stable group's members are
// trusted to be all of them: a table listed was made by a member that had
// joined by then, so if it is live it is among them. Another group's
// tables are left alone. A member dropped by mistake (its session lost
// mid-batch, when its partitions are another's anyway) fails its batch,
// which is aborted and written again, never counted twice.
func (c *Consumer) sweepStages(ctx context.Context, adm *kadm.Client) (dropped int, err error) {
	prefix := stagePrefix(c.cfg.Group)
	var names []string
	err = eachRow(ctx, c.ch, "list staging tables", qStageTables, nil, func(rows driver.Rows) error {
		var name string
		if err := rows.Scan(&name); err != nil {
			return err
		}
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			if _, err := strconv.ParseUint(rest, 10, 64); err == nil {
				names = append(names, name)
			}
		}
		return nil
	})
	if err != nil || len(names) == 0 {
		return 0, err
	}
	groups, err := adm.DescribeGroups(ctx, c.cfg.Group)
	if err != nil {
		return 0, fmt.Errorf("describe group: %w", err)
	}
	g, ok := groups[c.cfg.Group]
	if !ok || g.Err != nil {
		return 0, fmt.Errorf("describe group: %v", g.Err)
	}
	if g.State != "Stable" {
		return 0, nil // members joining or leaving: the next assignment sweeps
	}
	live := map[string]bool{}
	for _, m := range g.Members {
		live[stageName(c.cfg.Group, m.MemberID)] = true
	}
	for _, name := range names {
		if live[name] {
			continue
		}
		if err := c.ch.Exec(ctx, strings.ReplaceAll(qDropStage, "{stage}", name)); err != nil {
			return dropped, fmt.Errorf("drop staging table %s: %w", name, err)
		}
		dropped++
	}
	return dropped, nil
}

// fillStage sends the batch's rows into the staging table. Nothing outside
// the staging table changes, so a failure here needs no abort.
func (c *Consumer) fillStage(ctx context.Context, batch []*partition, rows int) error {
	if err := c.ch.Exec(ctx, c.stageSQL(qCreateStage)); err != nil {
		return fmt.Errorf("create staging table: %w", err)
	}
	if err := c.ch.Exec(ctx, c.stageSQL(qTruncateStage)); err != nil {
		return fmt.Errorf("truncate staging table: %w", err)
	}
	b, err := c.ch.PrepareBatch(ctx, qInsertRows(c.stage))
	if err != nil {
		return fmt.Errorf("prepare staging insert: %w", err)
	}
	defer b.Abort()
	parts := make([][]row, len(batch))
	for i, p := range batch {
		parts[i] = p.rows
	}
	if err := appendBatch(b, parts, rows, c.batch); err != nil {
		return fmt.Errorf("stage %d rows: %w", rows, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("stage %d rows: %w", rows, err)
	}
	return nil
}

// insertFromStage writes the raw rows and each rollup from the staging
// table. Each statement has a query id of the batch, so an abort can end it.
// A batch whose rows fall in more day partitions than one INSERT may write
// is written in slices of whole days: current ClickHouse refuses such an
// INSERT whole, again at every retry, a poison batch that would stop the
// pipeline. Every statement of every slice is tagged with the batch and
// sits between its intent and commit like the rest, so the batch still
// counts once: a failure anywhere aborts (deletes) all of it.
func (c *Consumer) insertFromStage(ctx context.Context) error {
	srcs, err := c.stageSlices(ctx)
	if err != nil {
		return err
	}
	for i, q := range append([]string{qInsertRaw}, qRollups...) {
		for j, src := range srcs {
			qctx := clickhouse.Context(ctx, clickhouse.WithQueryID(fmt.Sprintf("%s%d-%d", batchQueryPrefix(c.batch), i, j)),
				// Into a Distributed table, return only once every shard
				// holds its rows: the commit row must not run ahead of them.
				// No effect on other tables.
				clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
			if err := c.ch.Exec(qctx, strings.ReplaceAll(q, "{stage}", src), c.batch); err != nil {
				return fmt.Errorf("insert into %s: %w", batchTables[i], err)
			}
		}
	}
	return nil
}

// defaultMaxPartitions is ClickHouse's default max_partitions_per_insert_block,
// assumed where the server has no such setting (18.16, which has no limit
// either, so slicing there is merely harmless).
const defaultMaxPartitions = 100

// stageSlices returns what the batch's statements read: the staging table
// when its rows fall in few enough day partitions for one INSERT, else
// subqueries of it of at most that many consecutive days each. Every table
// a batch writes is partitioned by the day of its time (the rollups by the
// day of its minute, the same day).
func (c *Consumer) stageSlices(ctx context.Context) ([]string, error) {
	if c.maxParts == 0 {
		limit, err := maxPartitions(ctx, c.ch)
		if err != nil {
			return nil, err
		}
		c.maxParts = limit
	}
	days, err := readDays(ctx, c.ch, c.stageSQL(qStageDays))
	if err != nil {
		return nil, err
	}
	return daySlices(c.stage, "", days, c.maxParts), nil
}

// readDays runs query, which answers days as yyyymmdd in order.
func readDays(ctx context.Context, conn driver.Conn, query string, args ...any) ([]uint32, error) {
	var days []uint32
	err := eachRow(ctx, conn, "read the batch's days", query, args, func(rows driver.Rows) error {
		var d uint32
		err := rows.Scan(&d)
		days = append(days, d)
		return err
	})
	return days, err
}

// daySlices returns table itself when days (in order) are at most limit,
// else subqueries of its rows (where is a condition of digits and column
// names, or "") of at most limit consecutive days each.
func daySlices(table, where string, days []uint32, limit int) []string {
	if len(days) <= limit {
		if where == "" {
			return []string{table}
		}
		return []string{"(SELECT * FROM " + table + " WHERE " + where + ")"}
	}
	var srcs []string
	for len(days) > 0 {
		n := min(limit, len(days))
		srcs = append(srcs, daySlice(table, where, days[0], days[n-1]))
		days = days[n:]
	}
	return srcs
}

// stageSlice is the rows of stage from day lo to hi (yyyymmdd), as the
// source of a batch's statements.
func stageSlice(stage string, lo, hi uint32) string { return daySlice(stage, "", lo, hi) }

// daySlice is the rows of table (where where holds, if not "") from day lo
// to hi. Only digits, column names and the table's name (a staging table's
// is made of digits) are joined into the SQL.
func daySlice(table, where string, lo, hi uint32) string {
	if where != "" {
		where += " AND "
	}
	return fmt.Sprintf("(SELECT * FROM %s WHERE %stoYYYYMMDD(time) BETWEEN %d AND %d)", table, where, lo, hi)
}

// maxPartitions reads conn's max_partitions_per_insert_block (math.MaxInt
// for none; defaultMaxPartitions where the server has no such setting).
func maxPartitions(ctx context.Context, conn driver.Conn) (int, error) {
	limit := defaultMaxPartitions
	err := eachRow(ctx, conn, "read max_partitions_per_insert_block", qMaxPartitions, nil, func(rows driver.Rows) error {
		var v string
		if err := rows.Scan(&v); err != nil {
			return err
		}
		n, err := strconv.ParseUint(v, 10, 63)
		switch {
		case err != nil:
			return fmt.Errorf("max_partitions_per_insert_block %q: %w", v, err)
		case n == 0 || n > math.MaxInt32:
			limit = math.MaxInt
		default:
			limit = int(n)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return limit, nil
}

func (c *Consumer) stageSQL(q string) string {
	return strings.ReplaceAll(q, "{stage}", c.stage)
}
