package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// TestAccuracy: 20 clients, each with its own connection and limiter (as
// 20 gateways would), hammer one key; the admitted count must equal burst +
// refill × elapsed within 1 %.
func TestAccuracy(t *testing.T) {
	for name, newClient := range map[string]func(t *testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), PoolSize: 2})
		},
		"cluster": func(t *testing.T) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t), PoolSize: 2})
		},
	} {
		t.Run(name, func(t *testing.T) {
			const (
				clients = 20
				limit   = 400 // per second
				burst   = 200
			)
			run := 3 * time.Second
			rule := []Rule{{Name: "sec", Limit: limit, Period: time.Second, Burst: burst}}
			key := uniqueKey(t)
			lims := make([]*Redis, clients)
			for i := range lims {
				rdb := newClient(t)
				t.Cleanup(func() { rdb.Close() })
				lims[i] = mustLimiter(t, rdb, Config{})
			}
			var allowed, calls, errs atomic.Int64
			// The span is measured between the first and the last decision,
			// by the time Redis used for each: a loaded machine's slow start
			// or tail must not count as time the bucket could refill in.
			var mu sync.Mutex
			var first, last time.Time
			var times []time.Time
			stop := time.Now().Add(run)
			var wg sync.WaitGroup
			for _, l := range lims {
				wg.Go(func() {
					for time.Now().Before(stop) {
						d, err := l.Allow(context.Background(), key, rule, 1)
						calls.Add(1)
						if err == nil && !d.Cached {
							mu.Lock()
							if first.IsZero() || d.Time.Before(first) {
								first = d.Time
							}
							if d.Time.After(last) {
								last = d.Time
							}
							times = append(times, d.Time)
							mu.Unlock()
						}
						switch {
						case err != nil:
							errs.Add(1)
						case d.Allowed:
							allowed.Add(1)
						default:
							// A real client backs off; this one briefly, so
							// demand stays far above the refill rate.
							time.Sleep(min(d.RetryAfter(), time.Millisecond))
						}
					}
				})
			}
			wg.Wait()
			elapsed := last.Sub(first)
			if errs.Load() > 0 {
				t.Fatalf("%d of %d checks failed", errs.Load(), calls.Load())
			}
			want := burst + limit*elapsed.Seconds()
			lost := stalled(times, burst, limit)
			got := float64(allowed.Load())
			t.Logf("allowed %v of %d calls in %v; burst+refill×elapsed = %.1f, %.1f of it refilled while every caller stalled", got, calls.Load(), elapsed, want, lost)
			if got > want*1.01 || got < (want-lost)*0.99 {
				t.Errorf("allowed %v, want %.1f (less what stalls left unasked, %.1f) ± 1%%", got, want, lost)
			}
			if calls.Load() < int64(2*want) {
				t.Errorf("only %d calls for %.0f admissible: demand too low to test accuracy", calls.Load(), want)
			}
		})
	}
}

// TestScriptFlushUnderLoad: SCRIPT FLUSH and FUNCTION FLUSH in the middle
// of a concurrent run cause no request errors, in single calls and in
// pipelines, whether the limiter calls the library (FCALL) or, as on a
// server without functions, the script (EVALSHA).
func TestScriptFlushUnderLoad(t *testing.T) {
	for name, mk := range map[string]func(testing.TB) redis.UniversalClient{
		"standalone": func(tb testing.TB) redis.UniversalClient { return mustRedis(tb) },
		"cluster":    func(tb testing.TB) redis.UniversalClient { return mustCluster(tb) },
	} {
		for _, via := range []int32{viaFunction, viaScript} {
			t.Run(fmt.Sprintf("%s/via=%d", name, via), func(t *testing.T) {
				rdb := mk(t)
				// One sender forces concurrent checks into shared pipelines.
				l := mustLimiter(t, rdb, Config{Senders: 1, DenyCache: -1})
				l.via.Store(via)
				rules := []Rule{{Name: "a", Limit: 1000, Period: time.Second}, {Name: "b", Limit: 10, Period: time.Minute, Algorithm: SlidingWindow}}
				ctx := context.Background()
				var ok, errs atomic.Int64
				var firstErr atomic.Value
				done := make(chan struct{})
				var wg sync.WaitGroup
				for g := range 16 {
					wg.Go(func() {
						for i := 0; ; i++ {
							select {
							case <-done:
								return
							default:
							}
							_, err := l.Allow(ctx, uniqueKey(t)+string(rune('a'+g)), rules, 1)
							if err != nil {
								errs.Add(1)
								firstErr.CompareAndSwap(nil, err)
							} else {
								ok.Add(1)
							}
						}
					})
				}
				testenv.WaitFor(t, 20*time.Second, "checks before flush", func() bool { return ok.Load() > 200 })
				for range 3 {
					flushScripts(t, rdb)
					before := ok.Load()
					testenv.WaitFor(t, 20*time.Second, "checks after flush", func() bool { return ok.Load() > before+200 })
				}
				close(done)
				wg.Wait()
				if errs.Load() > 0 {
					t.Fatalf("%d checks failed after SCRIPT FLUSH; first: %v", errs.Load(), firstErr.Load())
				}
				st := l.Stats()
				if st.Reloads == 0 {
					t.Errorf("Stats() = %+v: no NOSCRIPT reloads seen, flush did not hit", st)
				}
				if st.Pipelines >= st.Checks {
					t.Errorf("Stats() = %+v: no check shared a pipeline", st)
				}
				t.Logf("%d checks, %+v", ok.Load(), st)
			})
		}
	}
}

func flushScripts(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	var err error
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return flushNode(ctx, n) })
	} else {
		err = flushNode(ctx, rdb)
	}
	if err != nil {
		t.Fatalf("SCRIPT FLUSH, FUNCTION FLUSH: %v", err)
	}
}

// flushNode drops the server's scripts and functions, as a restart
// without persistence or a FLUSHALL-happy operator would.
func flushNode(ctx context.Context, rdb redis.Cmdable) error {
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		return err
	}
	return rdb.FunctionFlush(ctx).Err()
}

// TestExpiry: every key the script writes has a TTL, and is gone after it;
// a check writes one key for all the identity's named rules.
func TestExpiry(t *testing.T) {
	rdb := mustRedis(t)
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	ctx := context.Background()
	rules := []Rule{
		{Name: "tb", Limit: 10, Period: 200 * time.Millisecond},
		{Name: "sw", Limit: 10, Period: 200 * time.Millisecond, Algorithm: SlidingWindow},
	}
	key := uniqueKey(t)
	for range 12 {
		if _, err := l.Allow(ctx, key, rules, 1); err != nil {
			t.Fatal(err)
		}
	}
	keys := l.Keys(key, rules)
	if n, err := rdb.Exists(ctx, keys...).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %v = %d, %v; want only the identity's key", keys, n, err)
	}
	keys = keys[:1]
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// Full again within a period, plus the script's one-second margin.
		if ttl <= 0 || ttl > 1400*time.Millisecond {
			t.Errorf("PTTL(%s) = %v, want within (0, 1.4s]", k, ttl)
		}
		mem, err := rdb.MemoryUsage(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("MEMORY USAGE %s = %d bytes", k, mem)
	}
	testenv.WaitFor(t, 20*time.Second, "keys to expire", func() bool { return rdb.Exists(ctx, keys...).Val() == 0 })
}

// TestOneSlot: all keys of one check share a Redis Cluster hash slot,
// whatever braces the key holds, and a check of such a key succeeds on
// the Cluster and counts apart from every other key.
func TestOneSlot(t *testing.T) {
	rdb := mustCluster(t)
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	ctx := context.Background()
	rules := []Rule{{Name: "m", Limit: 1, Period: time.Minute}, {Name: "h", Limit: 1, Period: time.Hour}, {Name: "d", Limit: 1, Period: 24 * time.Hour, Algorithm: SlidingWindow}, {Name: "e", Limit: 1, Period: time.Hour, Bucket: "e0123"}}
	slot := func(k string) int64 { return rdb.ClusterKeySlot(ctx, k).Val() }
	base := uniqueKey(t)
	// A leading '}' empties the hash tag (each key is then hashed whole);
	// one inside ends it early, in the slot of the key before it.
	for _, suffix := range []string{"", "}", "}x", "{}", "odd}key{", "{x}", "%7D", "}~"} {
		key := base + suffix
		if strings.HasPrefix(suffix, "}") {
			key = suffix + base
		}
		var slots []int64
		for _, k := range l.Keys(key, rules) {
			slots = append(slots, slot(k))
		}
		for _, s := range slots[1:] {
			if s != slots[0] {
				t.Errorf("Keys(%q) slots = %v, want one slot", key, slots)
				break
			}
		}
		if prefix, _, ok := strings.Cut(key, "}"); ok && prefix != "" && slots[0] == slot(l.Keys(prefix, rules)[0]) {
			t.Errorf("Keys(%q) share slot %d with Keys(%q): a brace moved the identity", key, slots[0], prefix)
		}
		// Each key admits its own one unit: no other key's state is its.
		for i, want := range []bool{true, false} {
			d, err := l.Allow(ctx, key, rules, 1)
			if err != nil || d.Allowed != want {
				t.Errorf("Allow(%q) #%d = %v, %v; want allowed %v", key, i+1, d.Allowed, err, want)
			}
		}
	}
}

// TestDenyCacheExact: a hot key hammered through the deny cache is admitted
// exactly as often as Redis alone would admit it, with far fewer calls.
func TestDenyCacheExact(t *testing.T) {
	rdb := mustRedis(t)
	l := mustLimiter(t, rdb, Config{})
	rules := []Rule{{Name: "r", Limit: 50, Period: time.Second, Burst: 10}}
	key := uniqueKey(t)
	// The span runs from the first decision to the last, by their own
	// times (Redis', or the local clock for a cached denial): the bucket
	// starts full at the first, and what refills after the last is asked
	// by nobody; a loaded machine's slow start or tail must not count.
	var first, last time.Time
	var allowed, calls int
	for stop := time.Now().Add(1500 * time.Millisecond); time.Now().Before(stop); calls++ {
		d, err := l.Allow(context.Background(), key, rules, 1)
		if err != nil {
			t.Fatal(err)
		}
		if first.IsZero() {
			first = d.Time
		}
		last = d.Time
		if d.Allowed {
			allowed++
		} else if d.RetryAfter() <= 0 {
			t.Fatalf("denied with RetryAfter %v", d.RetryAfter())
		}
	}
	elapsed := last.Sub(first)
	want := 10 + 50*elapsed.Seconds()
	st := l.Stats()
	t.Logf("allowed %d of %d calls, want %.1f; %+v", allowed, calls, want, st)
	if math.Abs(float64(allowed)-want) > 2 {
		t.Errorf("allowed %d, want %.1f ± 2", allowed, want)
	}
	if st.Cached == 0 || st.Checks > int64(calls)/2 {
		t.Errorf("Stats() = %+v for %d calls: the deny cache answered too little", st, calls)
	}
}

// TestDenyCacheRuleCost: a cached denial answers only the rules' own
// costs it was given at: the same key and rules charged another Rule.Cost
// go to Redis (here: admitted), since the fingerprint covers it.
func TestDenyCacheRuleCost(t *testing.T) {
	l := mustLimiter(t, mustRedis(t), Config{})
	ctx := context.Background()
	key := uniqueKey(t)
	at := func(cost int64) []Rule {
		return []Rule{{Name: "tokens", Limit: 10, Period: time.Hour, Cost: cost}, {Name: "requests", Limit: 100, Period: time.Hour}}
	}
	if d, err := l.Allow(ctx, key, at(8), 1); err != nil || !d.Allowed {
		t.Fatalf("8 of 10 tokens: Allow = %+v, %v; want allowed", d, err)
	}
	for i, want := range []bool{false, true} {
		if d, err := l.Allow(ctx, key, at(8), 1); err != nil || d.Allowed || d.Cached != want {
			t.Fatalf("8 more tokens #%d: Allow = %+v, %v; want denied, cached %v", i+1, d, err, want)
		}
	}
	if d, err := l.Allow(ctx, key, at(2), 1); err != nil || !d.Allowed || d.Cached {
		t.Fatalf("2 tokens of the 2 left: Allow = %+v, %v; want allowed by Redis, not the cached denial at 8", d, err)
	}
}

// TestCachedRetryAfterIsEnough: a client that waits the RetryAfter of a
// denial the deny cache answered is admitted, even when Redis decided the
// denial it cached long after the call was sent (here a CLIENT PAUSE
// holds the call): the wait counts from the reply, not from the send.
func TestCachedRetryAfterIsEnough(t *testing.T) {
	rdb := mustRedis(t)
	pauser := mustRedis(t)
	l := mustLimiter(t, rdb, Config{})
	ctx := context.Background()
	rules := []Rule{{Name: "r", Limit: 1, Period: 4 * time.Second}}
	key := uniqueKey(t)
	if d, err := l.Allow(ctx, key, rules, 1); err != nil || !d.Allowed {
		t.Fatalf("first Allow = %+v, %v; want allowed", d, err)
	}
	if err := pauser.ClientPause(ctx, time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, key, rules, 1); err != nil || d.Allowed || d.Cached {
		t.Fatalf("Allow during the pause = %+v, %v; want denied by Redis", d, err)
	}
	d, err := l.Allow(ctx, key, rules, 1)
	if err != nil || d.Allowed || !d.Cached {
		t.Fatalf("Allow after the pause = %+v, %v; want a cached denial", d, err)
	}
	time.Sleep(d.RetryAfter())
	if d, err := l.Allow(ctx, key, rules, 1); err != nil || !d.Allowed {
		t.Errorf("Allow after the cached RetryAfter = %+v, %v; want allowed", d, err)
	}
}

func TestStoreErrors(t *testing.T) {
	// Nothing listens on port 1: the limiter must return an error, not a
	// decision, so the gateway's failure policy can act.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	l := mustLimiter(t, rdb, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := l.Allow(ctx, "k", []Rule{{Name: "r", Limit: 1, Period: time.Second}}, 1)
	if err == nil {
		t.Fatal("Allow against a dead store returned no error")
	}
	// A caller's deadline bounds the wait.
	ctx, cancel = context.WithTimeout(context.Background(), 0)
	defer cancel()
	if _, err := l.Allow(ctx, "k", []Rule{{Name: "r", Limit: 1, Period: time.Second}}, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Allow with an expired context: error = %v, want deadline exceeded", err)
	}
}

// TestParseReplies: the Go side checks a script's reply's shape before
// using it, for the token bucket's reply and for INSPECT's.
func TestParseReplies(t *testing.T) {
	rules := []Rule{{Name: "a", Limit: 1, Period: time.Second}}
	goodInspect := []any{int64(1), int64(0), int64(0), int64(0), int64(1000), int64(2000), int64(1_800_000_000_000_000)}
	// packed: overall, then per rule allowed, remaining (5 bytes), retry
	// and reset (7 each), then the time (7)
	packed := func(overall, allowed byte, tail ...byte) string {
		b := []byte{overall, allowed, 1, 0, 0, 0, 0}
		b = append(b, make([]byte, 7)...)
		b = append(b, 0xe8, 0x03, 0, 0, 0, 0, 0)
		b = append(b, 0x00, 0x80, 0x98, 0x28, 0x17, 0x65, 0x06)
		return string(append(b, tail...))
	}
	parsers := map[string]func(res any) error{
		"parseReply":   func(res any) error { _, err := parseReply(res, rules, false); return err },
		"parseInspect": func(res any) error { _, err := parseInspect("k", res.([]any), rules); return err },
	}
	tests := []struct {
		name    string
		parse   string
		give    any
		wantErr bool
	}{
		{"good", "parseReply", packed(1, 1), false},
		{"short", "parseReply", packed(1, 1)[:20], true},
		{"long", "parseReply", packed(1, 1, 0), true},
		{"array", "parseReply", []any{int64(1), int64(1), int64(0), int64(0), int64(1000), int64(0)}, true},
		{"overall disagrees", "parseReply", packed(0, 1), true},
		{"verdict not 0 or 1", "parseReply", packed(2, 2), true},
		{"good", "parseInspect", goodInspect, false},
		{"short", "parseInspect", []any{int64(1), int64(0)}, true},
		{"string", "parseInspect", []any{int64(1), "0", int64(0), int64(0), int64(1000), int64(2000), int64(0)}, true},
	}
	for _, tt := range tests {
		if err := parsers[tt.parse](tt.give); (err != nil) != tt.wantErr {
			t.Errorf("%s: %s(%q) error = %v, want error %v", tt.name, tt.parse, tt.give, err, tt.wantErr)
		}
	}
	if d, err := parseReply(packed(1, 1), rules, false); err != nil || !d.Allowed || d.Rules[0].Remaining != 1 || d.Rules[0].ResetAfter != time.Millisecond || d.Time.UnixMicro() != 1_800_000_000_000_000 {
		t.Errorf("parseReply(good) = %+v, %v, want allowed, 1 remaining, reset 1ms, time 1.8e15us", d, err)
	}
	if ks, err := parseInspect("k", goodInspect, rules); err != nil || ks.TTL != 2*time.Second || !ks.Rules[0].Found || ks.Rules[0].ResetAfter != time.Millisecond {
		t.Errorf("parseInspect(%v) = %+v, %v, want found, TTL 2s, ResetAfter 1ms", goodInspect, ks, err)
	}
}

// TestBatchingOnlyUnderLoad: a lone check goes out at once in a round trip
// of its own (no waiting to fill a batch); concurrent checks share them.
func TestBatchingOnlyUnderLoad(t *testing.T) {
	rdb := mustRedis(t)
	rules := []Rule{{Name: "r", Limit: 1000, Period: time.Second}}
	seq := mustLimiter(t, rdb, Config{DenyCache: -1})
	// Loaded ahead, so no NOSCRIPT retry adds a round trip below.
	if err := seq.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := seq.Allow(context.Background(), uniqueKey(t), rules, 1); err != nil {
			t.Fatal(err)
		}
		if st := seq.Stats(); st.Pipelines != int64(i+1) {
			t.Fatalf("after %d sequential checks, Stats() = %+v: want one round trip each", i+1, st)
		}
	}
	// Two senders for 64 callers: most checks must ride shared pipelines.
	conc := mustLimiter(t, rdb, Config{DenyCache: -1, Senders: 2})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 20 {
				if _, err := conc.Allow(context.Background(), uniqueKey(t), rules, 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := conc.Stats()
	t.Logf("64 callers × 20 checks: %+v", st)
	if st.Checks != 64*20 || st.Pipelines*2 > st.Checks {
		t.Errorf("Stats() = %+v: want %d checks in under half as many round trips", st, 64*20)
	}
}

// TestHungStoreHonoursDeadlines: with a store that accepts connections and
// never answers, and a queue that fills up, every caller still gets its
// error once its own context ends (within a generous margin), none waits
// on the others.
func TestHungStoreHonoursDeadlines(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Serve(t, nil), MaxRetries: -1, ContextTimeoutEnabled: true})
	defer rdb.Close()
	l := mustLimiter(t, rdb, Config{Senders: 1, Batch: 1})
	rules := []Rule{{Name: "r", Limit: 1, Period: time.Second}}
	const deadline = 50 * time.Millisecond
	var wg sync.WaitGroup
	var late atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			start := time.Now()
			var err error
			if i%2 == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				_, err = l.Allow(ctx, uniqueKey(t), rules, 1)
			} else {
				// The gateway's way: the deadline without a context.
				_, err = l.AllowUncachedWithin(context.Background(), deadline, uniqueKey(t), rules, 1)
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("AllowUncachedWithin against a hung store: %v, want a deadline exceeded", err)
				}
			}
			if err == nil {
				t.Error("Allow against a hung store returned no error")
			}
			if time.Since(start) > deadline+time.Second {
				late.Add(1)
			}
		})
	}
	wg.Wait()
	if n := late.Load(); n > 0 {
		t.Errorf("%d of 20 callers waited more than a second past their deadline", n)
	}
}

// TestScriptWhenFunctionsRefused: a user whose ACL was written for
// EVALSHA (no FCALL, no FUNCTION LOAD) still gets decisions: the limiter
// falls back to the script for good.
func TestScriptWhenFunctionsRefused(t *testing.T) {
	admin := mustRedis(t)
	ctx := context.Background()
	user := fmt.Sprintf("nofcall%x", time.Now().UnixNano())
	if err := admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "resetchannels", "~*", "-@all",
		"+ping", "+evalsha", "+eval", "+script|load", "+time", "+get", "+mget", "+set", "+del", "+exists", "+pttl", "+hmget").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
	rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: user, Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	rules := []Rule{{Name: "r", Limit: 3, Period: time.Hour}}
	key := uniqueKey(t)
	for i := range 4 {
		d, err := l.Allow(ctx, key, rules, 1)
		if err != nil || d.Allowed != (i < 3) {
			t.Fatalf("Allow %d = %+v, %v; want allowed %t", i, d, err, i < 3)
		}
	}
	if l.via.Load() != viaScript {
		t.Errorf("via = %d, want the script (%d)", l.via.Load(), viaScript)
	}
}

// TestDenyCacheAfterNATLapse: a denial cached under a key's rules does not
// outlive a NAT directive applied and lapsed through the limiter's API.
// Checked under the raised rules, Redis converts the key's state and
// refills it ten times as fast; converted back once the directive lapses,
// it admits again well before the old denial's retry: the cache must
// answer as Redis does.
func TestDenyCacheAfterNATLapse(t *testing.T) {
	rdb := mustRedis(t)
	l := mustLimiter(t, rdb, Config{})
	peek := mustLimiter(t, rdb, Config{DenyCache: -1})
	ctx := context.Background()
	key := "ip:" + uniqueKey(t)
	rules := []Rule{{Name: "anon", Limit: 2, Period: 20 * time.Second}}
	for i, want := range []bool{true, true, false} {
		if d, err := l.Allow(ctx, key, rules, 1); err != nil || d.Allowed != want {
			t.Fatalf("drain #%d: Allow = %+v, %v; want allowed %v", i+1, d, err, want)
		}
	}
	if d, err := l.Allow(ctx, key, rules, 1); err != nil || d.Allowed || !d.Cached {
		t.Fatalf("after the drain: Allow = %+v, %v; want a cached denial", d, err)
	}

	now := time.Now()
	dirs := &Directives{NATs: map[string]NATDirective{key: {Key: key, Factor: 10, Clients: 10, Expires: now.Add(time.Hour)}}}
	raised, ok := dirs.NAT(key, rules, now)
	if !ok {
		t.Fatal("the NAT directive does not apply")
	}
	if d, err := l.Allow(ctx, key, raised, 1); err != nil || !d.Allowed {
		t.Fatalf("under the NAT directive: Allow = %+v, %v; want allowed", d, err)
	}
	// The raised bucket refills to its capacity (1 token a second)…
	testenv.WaitFor(t, 60*time.Second, "the raised bucket to refill", func() bool {
		ks, err := peek.Inspect(ctx, key, raised)
		return err == nil && ks.Rules[0].Remaining == raised[0].Capacity()
	})
	// …so, the directive lapsed, Redis admits under the key's own rules.
	back, ok := dirs.NAT(key, rules, now.Add(2*time.Hour))
	if ok {
		t.Fatal("the NAT directive applies after it expired")
	}
	ks, err := peek.Inspect(ctx, key, back)
	if err != nil || ks.Rules[0].Remaining < 1 {
		t.Fatalf("Redis' state after the lapse = %+v, %v; want room (the test's premise)", ks, err)
	}
	if d, err := l.Allow(ctx, key, back, 1); err != nil || !d.Allowed || d.Cached {
		t.Errorf("after the lapse: Allow = %+v, %v; want allowed by Redis, not the denial cached before the directive", d, err)
	}
}
