package analytics_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/edgelimit/edgelimit/analytics"
)

// historyKeys × historyMinutes rows of each key rollup seed
// TestKeyHistoryReadsByKey: a busy half hour.
const historyKeys, historyMinutes = 20000, 30

// oldKeyHistory is key_history.sql as it was, on the key rollup ordered by
// minute first: one key's history read every key's minutes in the range.
// The test runs it only to show that the seeded table tells the two apart.
const oldKeyHistory = `SELECT minute, gateway_id, toInt64(sum(requests)), toInt64(sum(denied_requests))
FROM decisions_by_key_1m WHERE minute >= ? AND minute < ? AND key_id = ?
GROUP BY minute, gateway_id ORDER BY minute, gateway_id`

// TestKeyHistoryReadsByKey: a key's history reads a bounded number of rows
// (ClickHouse's own progress reports), however many other keys share its
// minutes: the key-history rollup is ordered by key first. The same
// question of the minute-first key rollup reads the whole range.
func TestKeyHistoryReadsByKey(t *testing.T) {
	conn := mustDatabase(t)
	t.Parallel()
	ctx := context.Background()
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(historyMinutes * time.Minute)
	for _, q := range []string{
		`INSERT INTO decisions_by_key_1m (minute, key_id, key_kind, gateway_id, batch_id, requests, denied_requests)
		SELECT toDateTime(?) + 60 * (number % ?), concat('key-', toString(intDiv(number, ?))), 'api_key',
			if(number % 3 = 0, 'gw-b', 'gw-a'), 1, 10, 2 FROM numbers(?)`,
		`INSERT INTO decisions_key_history_1m (minute, key_id, gateway_id, batch_id, requests, denied_requests)
		SELECT toDateTime(?) + 60 * (number % ?), concat('key-', toString(intDiv(number, ?))),
			if(number % 3 = 0, 'gw-b', 'gw-a'), 1, 10, 2 FROM numbers(?)`,
	} {
		if err := conn.Exec(ctx, q, from, historyMinutes, historyMinutes, historyKeys*historyMinutes); err != nil {
			t.Fatal(err)
		}
	}
	var read atomic.Uint64
	progress := clickhouse.Context(ctx, clickhouse.WithProgress(func(p *clickhouse.Progress) { read.Add(p.Rows) }))

	h, err := analytics.NewReader(conn).KeyHistory(progress, analytics.Range{From: from, To: to, KeyID: "key-777"}, analytics.BucketMinute)
	if err != nil {
		t.Fatal(err)
	}
	byKey := read.Swap(0)
	var requests, denied int64
	for _, p := range h {
		requests += p.Requests
		denied += p.Denied
	}
	if requests != 10*historyMinutes || denied != 2*historyMinutes {
		t.Errorf("KeyHistory(key-777) = %d requests, %d denied, want %d and %d", requests, denied, 10*historyMinutes, 2*historyMinutes)
	}

	rows, err := conn.Query(progress, oldKeyHistory, from, to, "key-777")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
	}
	rows.Close()
	byMinute := read.Load()
	// A granule (8,192 rows) or two of the one day partition.
	const bound = 2 * 8192
	t.Logf("key history of one key among %d over %d minutes: read %d rows by key (was %d by minute)",
		historyKeys, historyMinutes, byKey, byMinute)
	if byKey > bound {
		t.Errorf("key history read %d rows, want at most %d (the key's own granules)", byKey, bound)
	}
	if byMinute <= 10*bound {
		t.Errorf("the minute-ordered rollup read only %d rows: the seed does not tell a read by key from a scan", byMinute)
	}
}
