package consumer

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestFaultClusterExactlyOnce: the consumer writes through Distributed
// tables over a two-shard ClickHouse 18.16 cluster (the ledger, claims and
// aborts too, so every consumer sees one of each), and row 1's fault (a
// rollup insert failing, here on one shard only) still ends with every event
// once in the raw table and every rollup: aborts delete on each shard.
func TestFaultClusterExactlyOnce(t *testing.T) {
	t.Parallel()
	migrate := func(ctx context.Context, c driver.Conn) error { return Migrate(ctx, c, Retention{}) }
	_, shards, ch := testenv.Distributed(t, migrate, CreateDistributed)

	kb := realBackend(t, 2)
	cfg := kb.config()
	cfg.Shards = shards
	const n = 3000
	viewFailsAtInsert(t, kb, cfg, ch, shards[1], n)
	for i, sh := range shards {
		if got := count(t, sh, "SELECT count() FROM decisions"); got == 0 || got == n {
			t.Errorf("shard %d holds %d of %d raw rows, want a share", i+1, got, n)
		}
	}
}
