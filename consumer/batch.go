package consumer

import (
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/internal/event"
)

// row is one decoded record, buffered until its batch is inserted.
type row struct {
	d         event.Decision
	topic     string
	partition int32
	offset    int64
}

// column is one column of the decisions table that the consumer writes.
type column struct {
	name string
	typ  string // as system.columns names it; Migrate checks it
	// values returns the column's values for every row of a batch, in
	// order, as the typed slice the driver appends in one call.
	values func(batch [][]row, n int) any
}

// col makes a column whose value in a row is value(row).
func col[T any](name, typ string, value func(*row) T) column {
	return column{name: name, typ: typ, values: func(batch [][]row, n int) any {
		vs := make([]T, 0, n)
		for _, rows := range batch {
			for i := range rows {
				vs = append(vs, value(&rows[i]))
			}
		}
		return vs
	}}
}

// decisionColumns is the one map from a decision event to the decisions
// table: the INSERT's column list, Migrate's check of the table and the
// batch's columns all come from it. Adding an event field adds a line here
// (and its migration); nothing else in the consumer changes.
var decisionColumns = []column{
	col("event_id", "FixedString(16)", func(r *row) string { return string(r.d.ID[:]) }),
	col("time", "DateTime", func(r *row) time.Time { return r.d.Time }),
	col("time_ms", "UInt16", func(r *row) uint16 { return uint16(r.d.Time.Nanosecond() / int(time.Millisecond)) }),
	col("gateway_id", "String", func(r *row) string { return r.d.GatewayID }),
	col("key_id", "String", func(r *row) string { return r.d.KeyID }),
	col("key_kind", "String", func(r *row) string { return r.d.KeyKind.String() }),
	col("client_ip", "String", func(r *row) string { return r.d.ClientIP }),
	col("user_agent_hash", "UInt64", func(r *row) uint64 { return r.d.UserAgentHash }),
	col("route", "String", func(r *row) string { return r.d.Route }),
	col("method", "String", func(r *row) string { return r.d.Method }),
	col("plan", "String", func(r *row) string { return r.d.Plan }),
	col("binding_rule", "String", func(r *row) string { return r.d.BindingRule }),
	col("allowed", "UInt8", func(r *row) uint8 { return b2u(r.d.Allowed) }),
	col("rule_limit", "Int64", func(r *row) int64 { return r.d.Limit }),
	col("remaining", "Int64", func(r *row) int64 { return r.d.Remaining }),
	col("cost", "Int64", func(r *row) int64 { return r.d.Cost }),
	col("store_status", "String", func(r *row) string { return r.d.StoreStatus.String() }),
	col("mode", "String", func(r *row) string { return r.d.Mode.String() }),
	col("check_latency_us", "UInt32", func(r *row) uint32 { return latencyMicros(r.d.CheckLatency) }),
	// Every row the consumer accepts passed event.CheckVersion.
	col("schema_version", "UInt8", func(*row) uint8 { return event.Version }),
	col("kafka_topic", "String", func(r *row) string { return r.topic }),
	col("kafka_partition", "Int32", func(r *row) int32 { return r.partition }),
	col("kafka_offset", "Int64", func(r *row) int64 { return r.offset }),
	col("key_name", "String", func(r *row) string { return r.d.KeyName }),
	col("admin_action", "String", func(r *row) string { return r.d.Admin.Action }),
	col("admin_actor", "String", func(r *row) string { return r.d.Admin.Actor }),
	col("acct_run_start", "Int64", func(r *row) int64 { return unixNano(r.d.Accounting.RunStart) }),
	col("acct_decisions", "Int64", func(r *row) int64 { return r.d.Accounting.Decisions }),
	col("acct_published", "Int64", func(r *row) int64 { return r.d.Accounting.Published }),
	col("acct_dropped_buffer_full", "Int64", func(r *row) int64 { return r.d.Accounting.DroppedBufferFull }),
	col("acct_dropped_broker_error", "Int64", func(r *row) int64 { return r.d.Accounting.DroppedBrokerError }),
	col("acct_dropped_encode_error", "Int64", func(r *row) int64 { return r.d.Accounting.DroppedEncodeError }),
	col("acct_dropped_closed", "Int64", func(r *row) int64 { return r.d.Accounting.DroppedClosed }),
	col("acct_final", "UInt8", func(r *row) uint8 { return b2u(r.d.Accounting.Final) }),
	col("seq", "Int64", func(r *row) int64 { return r.d.Seq }),
	col("seq_epoch", "Int64", func(r *row) int64 { return unixNano(r.d.SeqEpoch) }),
	col("nat_factor", "Float64", func(r *row) float64 { return r.d.NATFactor }),
	col("split_gateways", "Array(String)", func(r *row) []string {
		out := make([]string, len(r.d.Split))
		for i, s := range r.d.Split {
			out[i] = s.Gateway
		}
		return out
	}),
	col("split_shares", "Array(Float64)", func(r *row) []float64 {
		out := make([]float64, len(r.d.Split))
		for i, s := range r.d.Split {
			out[i] = s.Share
		}
		return out
	}),
	col("time_us", "UInt16", func(r *row) uint16 { return uint16(r.d.Time.Nanosecond() / int(time.Microsecond) % 1000) }),
	col("reserved", "Int64", func(r *row) int64 { return r.d.Reserved }),
	col("settled", "Int64", func(r *row) int64 { return r.d.Settled }),
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// qInsertRows inserts rows into table, naming its columns (ClickHouse
// 18.16's native protocol needs that) from decisionColumns, then batch_id,
// so the list and the values cannot drift apart. Only these constant names
// are joined into the SQL.
func qInsertRows(table string) string {
	return "INSERT INTO " + table + " (" + columnNames() + ", batch_id)"
}

func columnNames() string {
	names := make([]string, len(decisionColumns))
	for i, c := range decisionColumns {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// appendBatch adds every row of batch (n in all) to a prepared qInsertRows,
// each column built once and appended in one call, all of them tagged with
// the batch id id.
func appendBatch(b driver.Batch, batch [][]row, n int, id uint64) error {
	for i, c := range decisionColumns {
		if err := b.Column(i).Append(c.values(batch, n)); err != nil {
			return fmt.Errorf("append column %s: %w", c.name, err)
		}
	}
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = id
	}
	if err := b.Column(len(decisionColumns)).Append(ids); err != nil {
		return fmt.Errorf("append column batch_id: %w", err)
	}
	return nil
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// latencyMicros clamps a check latency into the UInt32 microseconds column.
func latencyMicros(d time.Duration) uint32 {
	us := d.Microseconds()
	switch {
	case us < 0:
		return 0
	case us > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(us)
}

// timeRange returns the earliest and latest event time of rows, which must
// not be empty.
func timeRange(rows []row) (lo, hi time.Time) {
	lo, hi = rows[0].d.Time, rows[0].d.Time
	for i := range rows {
		if t := rows[i].d.Time; t.Before(lo) {
			lo = t
		} else if t.After(hi) {
			hi = t
		}
	}
	return lo, hi
}
