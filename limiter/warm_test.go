package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testenv"
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
			forEach(func(c *redis.Client) { c.AddHook(cmdCounter{name: "function", sub: "load", n: &loads}) })
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

// cmdCounter counts the commands a client sends whose first word is
// name, and whose second is sub when set.
type cmdCounter struct {
	name, sub string
	n         *atomic.Int64
}

func (cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if strings.EqualFold(fmt.Sprint(args[0]), h.name) && (h.sub == "" || len(args) > 1 && strings.EqualFold(fmt.Sprint(args[1]), h.sub)) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestWarmTakesEveryConnection: the pool counts the connections
// MinIdleConns is still dialling, unauthenticated, and a Warm that trusted
// that count sent nothing: the first checks then paid for the handshakes
// (TestReadyMeansReady failed open so once in CI). Warm pings every one.
func TestWarmTakesEveryConnection(t *testing.T) {
	const n = 6
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), MinIdleConns: n})
	t.Cleanup(func() { rdb.Close() })
	var pings atomic.Int64
	rdb.AddHook(cmdCounter{name: "ping", n: &pings})
	if err := mustLimiter(t, rdb, Config{}).Warm(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got := pings.Load(); got != n {
		t.Errorf("Warm(%d) on a pool MinIdleConns is filling sent %d PINGs, want %d: one on each connection", n, got, n)
	}
}
