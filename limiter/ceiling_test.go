package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkCeiling is what Redis itself can do with allow.lua: 64
// connections each sending pipelines of 16 checks of benchRules over 100k
// random keys, with no limiter in between (the ceiling beside
// BenchmarkAllow in `make bench`). It reports Redis' own CPU per check
// (INFO cpu) and its memory per identity (INFO memory; run it on a Redis
// nothing else writes to). The cases: "function" sends each check as an
// FCALL of its own, "coalesced" the 16 as one FCALL (as the limiter does
// with checks that share a pipeline), "script" each by EVALSHA (servers
// without functions), "previous-layout" each with the previous layout's
// keys (Config.PreviousLayout), "door" and "door-coalesced" the Envoy
// door's shape (three buckets of a request, each its own key). Two floors beside them say what any script
// costs Redis here, whatever it computes: "floor-call" returns at once,
// "floor-read-write" only reads TIME, GETs the key and SETs it with an
// expiry (a value of the rules' size) and replies as allow.lua does; a
// check that reads and writes its state in one call of its own cannot
// cost less than the second. The rules travel packed in one binary
// argument, which redis-benchmark cannot send (it cuts arguments at NUL
// bytes).
func BenchmarkCeiling(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: mustRedis(b).Options().Addr, PoolSize: 64})
	defer rdb.Close()
	ctx := context.Background()
	l := mustLimiter(b, rdb, Config{})
	if err := l.Load(ctx); err != nil {
		b.Fatal(err)
	}
	old := mustLimiter(b, rdb, Config{PreviousLayout: true})
	// checkArgs is one check's part of a call: its key count and ARGV.
	checkArgs := func(keys []string, rules []Rule, cost int64) []any {
		return append([]any{len(keys)}, scriptArgs(rules, cost, time.Now())...)
	}
	// queue sends checks of keys on pipe: one command, or one a check.
	type queue func(pipe redis.Pipeliner, keys [][]string, rules [][]Rule, cost int64)
	each := func(name, body string) queue {
		return func(pipe redis.Pipeliner, keys [][]string, rules [][]Rule, cost int64) {
			for i, k := range keys {
				a := []any{name, body, len(k)}
				for _, x := range k {
					a = append(a, x)
				}
				a = append(a, 1)
				pipe.Do(ctx, append(a, checkArgs(k, rules[i], cost)...)...)
			}
		}
	}
	coalesced := func(pipe redis.Pipeliner, keys [][]string, rules [][]Rule, cost int64) {
		a := []any{"fcall", allowFunction, 0}
		var args []any
		for i, k := range keys {
			for _, x := range k {
				a = append(a, x)
			}
			args = append(args, checkArgs(k, rules[i], cost)...)
		}
		a[2] = len(a) - 3
		a = append(a, len(keys))
		pipe.Do(ctx, append(a, args...)...)
	}
	// coalescedFloor sends the checks as coalesced does, to a script that
	// only reads and writes each check's container (floorCoalesced).
	coalescedFloor := func(pipe redis.Pipeliner, keys [][]string, rules [][]Rule, cost int64) {
		var ks []string
		var args []any
		for i, k := range keys {
			ks = append(ks, k...)
			args = append(args, checkArgs(k, rules[i], cost)...)
		}
		floorCoalesced.EvalSha(ctx, pipe, ks, append([]any{len(keys)}, args...)...)
	}
	floor := func(script *redis.Script) queue {
		return func(pipe redis.Pipeliner, keys [][]string, rules [][]Rule, cost int64) {
			for _, k := range keys {
				script.EvalSha(ctx, pipe, k, scriptArgs(benchRules, cost, time.Now())...)
			}
		}
	}
	// door is the Envoy door's shape: three descriptors of one request,
	// each a bucket of its own (two per caller, one shared by a hundred),
	// under the domain's key.
	door := func(k int) []Rule {
		rules := slices.Clone(benchRules)
		for i, v := range []int{k, k + 1<<20, k%1000 + 1<<30} {
			rules[i].Bucket = fmt.Sprintf("e%032x", v)
		}
		return rules
	}
	plan := func(int) []Rule { return benchRules }
	for _, tc := range []struct {
		name  string
		lim   *Redis
		rules func(k int) []Rule
		queue queue
		load  *redis.Script
	}{
		{"function", l, plan, each("fcall", allowFunction), nil},
		{"coalesced", l, plan, coalesced, nil},
		{"script", l, plan, each("evalsha", allowScript.Hash()), allowScript},
		{"previous-layout", old, plan, each("fcall", allowFunction), nil},
		{"door", l, door, each("fcall", allowFunction), nil},
		{"door-coalesced", l, door, coalesced, nil},
		{"floor-call", l, plan, floor(floorCall), floorCall},
		{"floor-read-write", l, plan, floor(floorReadWrite), floorReadWrite},
		{"floor-coalesced", l, plan, coalescedFloor, floorCoalesced},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// Fresh identities each run.
			prefix := fmt.Sprintf("ceiling%x:", rand.Uint32())
			if tc.load != nil {
				if err := tc.load.Load(ctx, rdb).Err(); err != nil {
					b.Fatal(err)
				}
			}
			cpu0, held := redisCPU(b, rdb), rdb.DBSize(ctx).Val()
			const conns, depth = 64, 16
			var next sync.WaitGroup
			work := make(chan int, conns)
			b.ResetTimer()
			start := time.Now()
			for range conns {
				next.Go(func() {
					r := rand.New(rand.NewPCG(rand.Uint64(), 1))
					keys := make([][]string, 0, depth)
					rules := make([][]Rule, 0, depth)
					for n := range work {
						keys, rules = keys[:0], rules[:0]
						for range n {
							k := r.IntN(100_000)
							rs := tc.rules(k)
							keys = append(keys, tc.lim.Keys(prefix+strconv.Itoa(k), rs))
							rules = append(rules, rs)
						}
						pipe := rdb.Pipeline()
						tc.queue(pipe, keys, rules, 1)
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
				for j := i; j < i+1000; j += depth {
					var keys [][]string
					var rules [][]Rule
					for k := j; k < j+depth; k++ {
						rs := tc.rules(k)
						keys = append(keys, tc.lim.Keys(prefix+"m"+strconv.Itoa(k), rs))
						rules = append(rules, rs)
					}
					tc.queue(pipe, keys, rules, 50)
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
					pipe.Unlink(ctx, tc.lim.Keys(prefix+"m"+strconv.Itoa(j), tc.rules(j))...)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var floorCall = redis.NewScript("return 1")

// floorReadWrite is the least a read-and-write check can do in a script:
// allow.lua's Redis calls and reply shape (one verdict, four integers per
// rule, the time) without its arithmetic.
var floorReadWrite = redis.NewScript(`
local t = redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[3], 'PXAT', (tonumber(t[1]) + 86400) * 1000)
return {1, 1, 99, 0, 600000000, 1, 4999, 0, 36000000000, 1, 49999, 0, 86400000000, tonumber(t[1])}`)

// floorCoalesced is floorReadWrite for a call of many checks, its KEYS
// and ARGV as allow.lua's: what a coalesced call costs Redis whatever
// the script computes. Each check writes a container of its rules' size
// (their prefixes and states) and replies a string of allow.lua's size.
var floorCoalesced = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out, k0, a = {}, 0, 1
for j = 1, tonumber(ARGV[1]) do
  local nk, blob = tonumber(ARGV[a + 1]), ARGV[a + 5]
  local n = #blob / 37
  redis.call('GET', KEYS[k0 + 1])
  redis.call('SET', KEYS[k0 + 1], string.rep('x', n * 32 + 21), 'PXAT', string.format('%d', now / 1000 + 86400000))
  out[j] = string.rep('y', 1 + 21 * n + 7 + 14)
  k0, a = k0 + nk, a + 5 + n
end
return out`)

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
