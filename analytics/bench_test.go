package analytics_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
)

// benchSeed generates @n decisions server-side over the @span seconds from
// @start: 2,000 API keys on 3 routes (one per key), 3 gateways, 2 plans,
// 90 % of the binding rules per_minute, 8 % denied. The consumer's
// materialized views fill the rollups as the rows go in.
const benchSeed = `INSERT INTO decisions (time, time_ms, gateway_id, key_id, key_kind, client_ip,
    user_agent_hash, route, method, plan, binding_rule, allowed, rule_limit, remaining, cost,
    store_status, mode, check_latency_us, schema_version)
SELECT
    toDateTime(@start) + intDiv(number * @span, @n) AS time,
    toUInt16(0),
    concat('gw-', toString(intHash32(number) % 3)),
    concat('key-', toString(intHash32(number + 1) % 2000)) AS key_id,
    'api_key',
    concat('10.', toString(intHash32(number + 1) % 2000 % 250), '.', toString(intDiv(intHash32(number + 1) % 2000, 250)), '.1'),
    intHash64(number) % 4,
    arrayElement(['/v1/search', '/v1/items', '/v1/orders'], intHash32(number + 1) % 2000 % 3 + 1),
    'GET',
    if(intHash32(number + 1) % 2000 % 2 = 0, 'free', 'pro'),
    if(intHash32(number + 2) % 10 = 0, 'per_hour', 'per_minute'),
    toUInt8(intHash32(number + 3) % 100 >= 8),
    toInt64(100), toInt64(50), toInt64(1),
    if(intHash32(number + 4) % 1000 = 0, 'unavailable', 'ok'),
    if(intHash32(number + 4) % 1000 = 0, 'fail_open', 'enforced'),
    toUInt32(200 + intHash32(number + 5) % 800),
    toUInt8(1)
FROM numbers(@n)`

// BenchmarkTrendQueries measures the analysts' queries over 10M decisions
// (EDGELIMIT_BENCH_EVENTS to change) spread over 6 hours, read from the
// rollups of a real ClickHouse. The seeding is not timed; it reports the
// rollup's rows beside each query's latency.
//
//	deploy/local/testenv.sh go test -run '^$' -bench TrendQueries -benchtime 20x ./analytics/
func BenchmarkTrendQueries(b *testing.B) {
	conn, start, end, n := seedBench(b)
	ctx := context.Background()
	t0 := time.Now()
	if err := consumer.RollUp(ctx, conn, 0); err != nil {
		b.Fatalf("seed: %v", err)
	}
	var raw, rollup uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM decisions").Scan(&raw); err != nil {
		b.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count() FROM decisions_by_key_1m").Scan(&rollup); err != nil {
		b.Fatal(err)
	}
	b.Logf("rolled up %d decisions in %v; decisions_by_key_1m holds %d rows", raw, time.Since(t0).Round(time.Millisecond), rollup)
	if int64(raw) != n {
		b.Fatalf("seeded %d rows, want %d", raw, n)
	}
	r := analytics.NewReader(conn)
	all := analytics.Range{From: start, To: end}
	lastHour := analytics.Range{From: end.Add(-time.Hour), To: end}
	for _, bc := range []struct {
		name string
		run  func() (int, error)
	}{
		{"trends/by=rule/bucket=hour/6h", func() (int, error) {
			p, err := r.Trends(ctx, analytics.TrendQuery{Range: all, Bucket: analytics.BucketHour, By: analytics.DimRule})
			return len(p), err
		}},
		{"trends/by=route/bucket=minute/6h", func() (int, error) {
			p, err := r.Trends(ctx, analytics.TrendQuery{Range: all, Bucket: analytics.BucketMinute, By: analytics.DimRoute})
			return len(p), err
		}},
		{"trends/by=key/top=10/bucket=minute/1h", func() (int, error) {
			p, err := r.Trends(ctx, analytics.TrendQuery{Range: lastHour, Bucket: analytics.BucketMinute, By: analytics.DimKey, Top: 10})
			return len(p), err
		}},
		{"trends/plan=free/by=gateway/bucket=day/6h", func() (int, error) {
			rg := all
			rg.Plan = "free"
			p, err := r.Trends(ctx, analytics.TrendQuery{Range: rg, Bucket: analytics.BucketDay, By: analytics.DimGateway})
			return len(p), err
		}},
		{"trends/every-filter/by=method/bucket=15m/tz=Asia-Kolkata/6h", func() (int, error) {
			rg := all
			rg.Plan, rg.Route, rg.Rule, rg.Gateway, rg.KeyKind, rg.Method = "free", "/v1/search", "per_minute", "gw-1", "api_key", "GET"
			p, err := r.Trends(ctx, analytics.TrendQuery{Range: rg, Bucket: analytics.Bucket15m, TZ: "Asia/Kolkata", By: analytics.DimMethod})
			return len(p), err
		}},
		{"key-page/6h", func() (int, error) {
			rep, err := r.KeyReport(ctx, all, "key-7", "auto", "Europe/Berlin")
			return len(rep.History), err
		}},
		{"top-keys/6h", func() (int, error) {
			k, err := r.TopKeys(ctx, all, 20)
			return len(k), err
		}},
		{"store-health/bucket=minute/6h", func() (int, error) {
			g, err := r.StoreHealth(ctx, all, analytics.BucketMinute)
			return len(g), err
		}},
		{"hot-keys/1m", func() (int, error) {
			h, err := r.HotKeys(ctx, analytics.Config{}.WithDefaults().Hot, end.Add(-time.Minute), end, 0, nil)
			return len(h), err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			rows := 0
			for b.Loop() {
				n, err := bc.run()
				if err != nil {
					b.Fatal(err)
				}
				rows = n
			}
			b.ReportMetric(float64(rows), "rows/op")
			b.ReportMetric(float64(rollup), "rollup_rows")
		})
	}
}

// seedBench fills a database of the benchmark's own with benchSeed's
// decisions over the 6 hours before end: 10M, or EDGELIMIT_BENCH_EVENTS.
func seedBench(b *testing.B) (conn driver.Conn, start, end time.Time, n int64) {
	b.Helper()
	n = int64(10_000_000)
	if v := os.Getenv("EDGELIMIT_BENCH_EVENTS"); v != "" {
		var err error
		if n, err = strconv.ParseInt(v, 10, 64); err != nil || n <= 0 {
			b.Fatalf("EDGELIMIT_BENCH_EVENTS=%q", v)
		}
	}
	conn = mustDatabase(b)
	end = time.Now().UTC().Truncate(time.Minute)
	start = end.Add(-6 * time.Hour)
	t0 := time.Now()
	if err := conn.Exec(context.Background(), benchSeed, clickhouse.Named("start", start), clickhouse.Named("span", int64(6*3600)), clickhouse.Named("n", n)); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d decisions in %v", n, time.Since(t0).Round(time.Millisecond))
	return conn, start, end, n
}
