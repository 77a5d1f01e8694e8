package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkCeiling is what Redis itself can do with allow.lua: 64
// connections each sending pipelines of 16 EVALSHA of benchRules over
// 100k random keys, with no limiter in between (the ceiling beside
// BenchmarkAllow in `make bench`). It reports Redis' own CPU per check
// (INFO cpu) and its memory per identity (INFO memory; run it on a Redis
// nothing else writes to), for this script ("one-key") and for the previous one, a hash
// per rule ("per-rule-keys"), on the same server. The rules travel packed
// in one binary argument, which redis-benchmark cannot send (it cuts
// arguments at NUL bytes).
func BenchmarkCeiling(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: mustRedis(b).Options().Addr, PoolSize: 64})
	defer rdb.Close()
	ctx := context.Background()
	l := mustLimiter(b, rdb, Config{})
	prev := redis.NewScript(perRuleKeysSource)
	var prevArgs []any
	prevArgs = append(prevArgs, 1)
	for _, r := range benchRules {
		prevArgs = append(prevArgs, 0, r.Limit, r.Period.Microseconds(), r.Capacity(), 0)
	}
	for _, tc := range []struct {
		name   string
		script *redis.Script
		keys   func(key string) []string
		args   []any
	}{
		{"one-key", allowScript, func(key string) []string { return l.Keys(key, benchRules) }, scriptArgs(benchRules, 1)},
		{"one-key-only", allowScript, func(key string) []string { return l.Keys(key, benchRules)[:1] }, scriptArgs(benchRules, 1)},
		{"per-rule-keys", prev, func(key string) []string {
			keys := make([]string, len(benchRules))
			for i, r := range benchRules {
				keys[i] = ruleKey("rl", key, r)
			}
			return keys
		}, prevArgs},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// Fresh identities each run.
			prefix := fmt.Sprintf("ceiling%x:", rand.Uint32())
			if err := tc.script.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			mem0, cpu0, keys0 := redisInfo(b, rdb, "memory", "used_memory"), redisCPU(b, rdb), rdb.DBSize(ctx).Val()
			const conns, depth = 64, 16
			var next sync.WaitGroup
			work := make(chan int, conns)
			b.ResetTimer()
			start := time.Now()
			for range conns {
				next.Go(func() {
					r := rand.New(rand.NewPCG(rand.Uint64(), 1))
					for n := range work {
						pipe := rdb.Pipeline()
						for range n {
							tc.script.EvalSha(ctx, pipe, tc.keys(prefix+strconv.Itoa(r.IntN(100_000))), tc.args...)
						}
						if _, err := pipe.Exec(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			for left := b.N; left > 0; left -= depth {
				work <- min(left, depth)
			}
			close(work)
			next.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			cpu := redisCPU(b, rdb) - cpu0
			mem := redisInfo(b, rdb, "memory", "used_memory") - mem0
			// Identities still held: states expire within seconds (a
			// token's refill), and memory and key count drop together.
			ids := rdb.DBSize(ctx).Val() - keys0
			if tc.name == "per-rule-keys" {
				ids /= int64(len(benchRules))
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
			b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-µs/check")
			if ids > 0 {
				b.ReportMetric(float64(mem)/float64(ids), "redis-B/identity")
				b.ReportMetric(float64(ids), "identities")
			}
		})
	}
}

// redisCPU is Redis' CPU time so far, system and user, in seconds.
func redisCPU(tb testing.TB, rdb *redis.Client) float64 {
	tb.Helper()
	return float64(redisInfo(tb, rdb, "cpu", "used_cpu_sys_µs")+redisInfo(tb, rdb, "cpu", "used_cpu_user_µs")) / 1e6
}

// redisInfo reads one field of an INFO section; used_cpu_*_µs reads the
// seconds field as microseconds.
func redisInfo(tb testing.TB, rdb *redis.Client, section, field string) int64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	name, micros := strings.CutSuffix(field, "_µs")
	for _, line := range strings.Split(info, "\r\n") {
		v, ok := strings.CutPrefix(line, name+":")
		if !ok {
			continue
		}
		if micros {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return int64(f * 1e6)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			tb.Fatal(err)
		}
		return n
	}
	tb.Fatal(fmt.Errorf("INFO %s has no %s", section, name))
	return 0
}
