package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestWarm: Warm leaves the library loaded and the asked number of
// connections open to every master, and a second Warm neither loads the
// library again nor opens a connection more.
func TestWarm(t *testing.T) {
	ctx := context.Background()
	for name, rdb := range map[string]redis.UniversalClient{"standalone": mustRedis(t), "cluster": mustCluster(t)} {
		t.Run(name, func(t *testing.T) {
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
			// On every master's client: a Cluster client's own hooks do
			// not reach nodes it already knows.
			var loads atomic.Int64
			forEach(func(c *redis.Client) { c.AddHook(loadCounter{&loads}) })
			l := mustLimiter(t, rdb, Config{})
			const n = 6
			if err := l.Warm(ctx, n); err != nil {
				t.Fatal(err)
			}
			conns := func(c *redis.Client) int { return int(c.PoolStats().TotalConns) }
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
			loadsBefore := loads.Load()
			if err := l.Warm(ctx, n); err != nil {
				t.Fatal(err)
			}
			if loadsBefore == 0 || loads.Load() != loadsBefore {
				t.Errorf("FUNCTION LOAD sent %d times by the first Warm, %d by the second; want some, then none", loadsBefore, loads.Load()-loadsBefore)
			}
			forEach(func(c *redis.Client) {
				if got := conns(c); got != before[c.Options().Addr] {
					t.Errorf("%s: %d connections after a second Warm, %d before", c.Options().Addr, got, before[c.Options().Addr])
				}
			})
		})
	}
}

// loadCounter counts the FUNCTION LOADs a client sends.
type loadCounter struct{ n *atomic.Int64 }

func (loadCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h loadCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if len(cmd.Args()) > 1 && strings.EqualFold(fmt.Sprint(cmd.Args()[0]), "function") && strings.EqualFold(fmt.Sprint(cmd.Args()[1]), "load") {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (loadCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
