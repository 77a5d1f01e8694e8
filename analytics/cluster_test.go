package analytics_test

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/analytics/analyticstest"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestFaultClusterQueries (issue 10, row 10; part of scale-out): a two-shard ClickHouse
// 18.16 cluster (deploy/local/clickhouse-cluster.sh), the data split across
// the shards' local tables behind Distributed tables, and the same data on
// one server: every analytics query answers the same on both. On 18.16 a
// subquery reading the same Distributed table is "double distributed" and
// denied (distributed_product_mode = deny) unless it is GLOBAL.
func TestFaultClusterQueries(t *testing.T) {
	ctx := context.Background()
	migrate := func(ctx context.Context, c driver.Conn) error { return consumer.Migrate(ctx, c, consumer.Retention{}) }
	srv, shards, on := testenv.Distributed(t, migrate, consumer.CreateDistributed)
	one, _ := testenv.NewDatabase(t, srv.Get(t, "EDGELIMIT_CLICKHOUSE_SHARD1"), "single")
	if err := migrate(ctx, one); err != nil {
		t.Fatal(err)
	}

	fleetNow := fleetClock()
	f, _, _ := seededFleet(fleetNow)
	rows := f.Rows()
	var halves [2][]event.Decision
	for i, r := range rows {
		halves[i%2] = append(halves[i%2], r)
	}
	for i, c := range shards {
		if err := analyticstest.Insert(ctx, c, halves[i], consumer.Backfill); err != nil {
			t.Fatal(err)
		}
	}
	if err := analyticstest.Insert(ctx, one, rows, consumer.Backfill); err != nil {
		t.Fatal(err)
	}

	args := map[string]any{
		"from": fleetNow.Add(-15 * time.Minute).Truncate(time.Second), "to": fleetNow.Add(time.Minute).Truncate(time.Second),
		"recent": fleetNow.Add(-time.Minute).Truncate(time.Second), "warm_from": fleetNow.Add(-20 * time.Minute).Truncate(time.Second),
		"bucket": "minute", "by": "key", "top": 5, "top_limit": 6, "limit": 50,
		"min_requests": 10, "min_keys": 5, "min_user_agents": 5,
		"key": "hot-1", "ip": "198.51.100.7", "rule": "", "route": "", "plan": "", "gateway": "",
		"kind": "", "method": "", "tz": "Asia/Kolkata",
		"lo": "", "hi": "~", "plans": []string{"free", "pro"}, "routes": []string{" none", "/v1/orders"},
		"by_key": 1, "by_plan": 1, "by_route": 1, "by_day": 1, "all_keys": 1, "keys": []string{"hot-1"}, "key_names": []string{" none", "acme"},
	}
	queries := analytics.Queries()
	if len(queries) == 0 {
		t.Fatal("no embedded queries")
	}
	for _, file := range slices.Sorted(maps.Keys(queries)) {
		q := queries[file]
		var named []any
		for _, m := range slices.Compact(slices.Sorted(slices.Values(regexp.MustCompile(`@([a-z_]+)`).FindAllString(q, -1)))) {
			v, ok := args[m[1:]]
			if !ok {
				t.Fatalf("%s: no test value for %s", file, m)
			}
			named = append(named, clickhouse.Named(m[1:], v))
		}
		want, err := dump(ctx, one, q, named)
		if err != nil {
			t.Fatalf("%s on one server: %v", file, err)
		}
		got, err := dump(ctx, on, q, named)
		if err != nil {
			t.Errorf("%s on the Distributed tables: %v", file, err)
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: Distributed answers %d rows %v, one server %d rows %v", file, len(got), head(got), len(want), head(want))
		}
		t.Logf("%s: %d rows, same on both", file, len(want))
	}
}

// dump runs q and returns its rows as sorted strings.
func dump(ctx context.Context, c driver.Conn, q string, args []any) ([]string, error) {
	rows, err := c.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var vs []any
		for _, ct := range rows.ColumnTypes() {
			vs = append(vs, reflect.New(ct.ScanType()).Interface())
		}
		if err := rows.Scan(vs...); err != nil {
			return nil, err
		}
		var parts []string
		for _, v := range vs {
			parts = append(parts, fmt.Sprint(reflect.ValueOf(v).Elem().Interface()))
		}
		out = append(out, strings.Join(parts, "|"))
	}
	slices.Sort(out)
	return out, rows.Err()
}

func head(s []string) []string { return s[:min(len(s), 3)] }
