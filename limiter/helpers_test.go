package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// allower is what the conformance suite needs of a store.
type allower interface {
	Allow(ctx context.Context, key string, rules []Rule, cost int64) (Decision, error)
}

func mustRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(tb)})
	mustPing(tb, rdb, "redis")
	return rdb
}

func mustCluster(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(tb)})
	mustPing(tb, rdb, "redis cluster")
	return rdb
}

// mustPing closes rdb when the test ends, and fails the test now unless
// the server (what) answers.
func mustPing(tb testing.TB, rdb redis.UniversalClient, what string) {
	tb.Helper()
	tb.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("ping %s: %v", what, err)
	}
}

func mustLimiter(tb testing.TB, rdb rediser, cfg Config) *Redis {
	tb.Helper()
	l, err := New(rdb, cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return l
}

// uniqueKey keeps concurrent test runs on one Redis apart.
func uniqueKey(tb testing.TB) string {
	return fmt.Sprintf("test:%s:%x", tb.Name(), rand.Uint64())
}

// redisTime reads Redis' clock, the one the script uses.
func redisTime(tb testing.TB, rdb redis.Cmdable) time.Time {
	tb.Helper()
	t, err := rdb.Time(context.Background()).Result()
	if err != nil {
		tb.Fatalf("TIME: %v", err)
	}
	return t
}

// fakeClock is a manual clock for the in-memory store.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time      { return c.t }
func (c *fakeClock) Add(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock           { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func testingProcs() int { return runtime.GOMAXPROCS(0) }

// stalled is how many units a bucket of capacity burst refilled at rate
// per second could not take because nobody asked: for each pause between
// two consecutive decisions (at Redis' times) longer than the bucket takes
// to fill, the refill past full. On a loaded machine every caller can be
// descheduled at once; an accuracy test subtracts this from what the
// bucket had to admit, and only from that bound: what it may admit at
// most is never eased.
func stalled(times []time.Time, burst, rate float64) float64 {
	times = slices.SortedFunc(slices.Values(times), time.Time.Compare)
	fill := burst / rate
	lost := 0.0
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]).Seconds(); gap > fill {
			lost += (gap - fill) * rate
		}
	}
	return lost
}
