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
// nothing else writes to), with the old keys of the previous layout passed
// ("one-key", as the gateway does) and without ("one-key-only"). Two
// floors beside them say what any script costs Redis here, whatever it
// computes: "floor-call" returns at once, "floor-read-write" only reads
// TIME, GETs the key and SETs it with an expiry (a value of the rules'
// size) and replies as allow.lua does; a check that reads and writes its
// state in one script cannot cost less than the second. The rules
// travel packed in one binary argument, which redis-benchmark cannot send
// (it cuts arguments at NUL bytes).
func BenchmarkCeiling(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: mustRedis(b).Options().Addr, PoolSize: 64})
	defer rdb.Close()
	ctx := context.Background()
	l := mustLimiter(b, rdb, Config{})
	for _, tc := range []struct {
		name   string
		script *redis.Script
		keys   func(key string) []string
		args   func(cost int64) []any
	}{
		{"one-key", allowScript, func(key string) []string { return l.Keys(key, benchRules) }, func(c int64) []any { return scriptArgs(benchRules, c) }},
		{"one-key-only", allowScript, func(key string) []string { return l.Keys(key, benchRules)[:1] }, func(c int64) []any { return scriptArgs(benchRules, c) }},
		{"floor-call", redis.NewScript("return 1"), func(key string) []string { return l.Keys(key, benchRules)[:1] }, func(c int64) []any { return scriptArgs(benchRules, c) }},
		{"floor-read-write", floorReadWrite, func(key string) []string { return l.Keys(key, benchRules)[:1] }, func(c int64) []any { return scriptArgs(benchRules, c) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// Fresh identities each run.
			prefix := fmt.Sprintf("ceiling%x:", rand.Uint32())
			if err := tc.script.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			cpu0, held := redisCPU(b, rdb), rdb.DBSize(ctx).Val()
			args := tc.args(1)
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
							tc.script.EvalSha(ctx, pipe, tc.keys(prefix+strconv.Itoa(r.IntN(100_000))), args...)
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
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
			b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-µs/check")
			// Memory: 100k new identities at cost 50, whose states (the
			// same size at any cost) live a minute or more, so none
			// expires while they are counted; once the run's own states
			// (seconds long) have expired, so their freeing is not counted.
			deadline := time.Now().Add(time.Minute)
			for rdb.DBSize(ctx).Val() > held && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			const ids = 100_000
			mem0, keys0 := redisInfo(b, rdb, "memory", "used_memory"), rdb.DBSize(ctx).Val()
			for i := 0; i < ids; i += 1000 {
				pipe := rdb.Pipeline()
				for j := i; j < i+1000; j++ {
					tc.script.EvalSha(ctx, pipe, tc.keys(prefix+"m"+strconv.Itoa(j)), tc.args(50)...)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			mem, keys := redisInfo(b, rdb, "memory", "used_memory")-mem0, rdb.DBSize(ctx).Val()-keys0
			b.ReportMetric(float64(mem)/ids, "redis-B/identity")
			b.ReportMetric(float64(keys)/ids, "keys/identity")
			// Gone now, not expiring into the next count.
			for i := 0; i < ids; i += 1000 {
				pipe := rdb.Pipeline()
				for j := i; j < i+1000; j++ {
					pipe.Unlink(ctx, tc.keys(prefix+"m"+strconv.Itoa(j))...)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// floorReadWrite is the least a read-and-write check can do in a script:
// allow.lua's Redis calls and reply shape (one verdict, four integers per
// rule, the time) without its arithmetic.
var floorReadWrite = redis.NewScript(`
local t = redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[3], 'PXAT', (tonumber(t[1]) + 86400) * 1000)
return {1, 1, 99, 0, 600000000, 1, 4999, 0, 36000000000, 1, 49999, 0, 86400000000, tonumber(t[1])}`)

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
