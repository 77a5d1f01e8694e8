package limiter

import (
	"context"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestWarm: Warm leaves the library loaded and the asked number of
// connections open to every master, and a second Warm opens none more.
func TestWarm(t *testing.T) {
	ctx := context.Background()
	for name, rdb := range map[string]redis.UniversalClient{"standalone": mustRedis(t), "cluster": mustCluster(t)} {
		t.Run(name, func(t *testing.T) {
			l := mustLimiter(t, rdb, Config{})
			const n = 6
			if err := l.Warm(ctx, n); err != nil {
				t.Fatal(err)
			}
			conns := func(c *redis.Client) int { return int(c.PoolStats().TotalConns) }
			var mu sync.Mutex // ForEachMaster runs f on every master at once
			forEach := func(f func(c *redis.Client)) {
				if cc, ok := rdb.(*redis.ClusterClient); ok {
					_ = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
						mu.Lock()
						defer mu.Unlock()
						f(c)
						return nil
					})
					return
				}
				f(rdb.(*redis.Client))
			}
			before := map[string]int{}
			forEach(func(c *redis.Client) {
				if got := conns(c); got < n {
					t.Errorf("%s: %d connections after Warm(%d)", c.Options().Addr, got, n)
				}
				before[c.Options().Addr] = conns(c)
				if libs, err := c.Do(ctx, "function", "list", "libraryname", allowLibrary).Slice(); err != nil || len(libs) == 0 {
					t.Errorf("%s: FUNCTION LIST = %v, %v; want the library loaded", c.Options().Addr, libs, err)
				}
			})
			if err := l.Warm(ctx, n); err != nil {
				t.Fatal(err)
			}
			forEach(func(c *redis.Client) {
				if got := conns(c); got != before[c.Options().Addr] {
					t.Errorf("%s: %d connections after a second Warm, %d before", c.Options().Addr, got, before[c.Options().Addr])
				}
			})
		})
	}
}
