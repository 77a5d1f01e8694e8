package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestFaultClusterExactlyOnce: the consumer writes through Distributed
// tables over a two-shard ClickHouse 18.16 cluster (the ledger, claims and
// aborts too, so every consumer sees one of each), and row 1's fault (a
// rollup insert failing, here on one shard only) still ends with every event
// once in the raw table and every rollup: aborts delete on each shard.
func TestFaultClusterExactlyOnce(t *testing.T) {
	srv := testenv.Private(t, "clickhouse-cluster")
	cluster := srv.Get(t, "EDGELIMIT_CLICKHOUSE_CLUSTER")
	ctx := context.Background()
	suffix := fmt.Sprint(time.Now().UnixNano())
	local, dist := "local_"+suffix, "dist_"+suffix
	var shards []driver.Conn
	for _, name := range []string{"EDGELIMIT_CLICKHOUSE_SHARD1", "EDGELIMIT_CLICKHOUSE_SHARD2"} {
		addr := srv.Get(t, name)
		root := testenv.OpenClickHouse(t, addr, "default")
		for _, db := range []string{local, dist} {
			if err := root.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+db); err != nil {
				t.Fatal(err)
			}
		}
		c := testenv.OpenClickHouse(t, addr, local)
		if err := Migrate(ctx, c, Retention{}); err != nil {
			t.Fatal(err)
		}
		shards = append(shards, c)
	}
	ch := testenv.OpenClickHouse(t, srv.Get(t, "EDGELIMIT_CLICKHOUSE_SHARD1"), dist)
	for _, table := range append(batchTables, "decisions_ledger", "decisions_aborts", "decisions_claims") {
		// Names come from the consumer's own lists and the test's databases.
		q := fmt.Sprintf("CREATE TABLE %s AS %s.%s ENGINE = Distributed(%s, %s, %s, rand())", table, local, table, cluster, local, table)
		if err := ch.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	kb := realBackend(t, 2)
	drop := failingView(t, shards[1], "decisions_by_key_1m")
	const n = 3000
	produce(t, kb.brokers, kb.topic, decisions(n))
	cfg := kb.config()
	cfg.Shards = shards
	r := start(t, cfg, ch, nil)
	testenv.WaitFor(t, 30*time.Second, "two failed attempts", func() bool {
		return metric(t, r.reg, "edgelimit_consumer_retries_total") >= 2
	})
	t.Logf("while shard 2's key rollup fails: %v", counts(t, ch))
	drop()
	waitRaw(t, ch, n, 30*time.Second)
	r.stop()
	wantExact(t, ch, n)
	for i, sh := range shards {
		if got := count(t, sh, "SELECT count() FROM decisions"); got == 0 || got == n {
			t.Errorf("shard %d holds %d of %d raw rows, want a share", i+1, got, n)
		}
	}
}
