package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

// inspector is what the gateway's admin API needs of a store; both stores
// satisfy it.
type inspector interface {
	Inspect(ctx context.Context, key string, rules []Rule) (KeyState, error)
	Reset(ctx context.Context, key string, rules []Rule) error
	Clear(ctx context.Context, key string) error
}

var (
	_ inspector = (*Redis)(nil)
	_ inspector = (*Memory)(nil)
)

func mustInspect(t *testing.T, s store, key string, rules []Rule) KeyState {
	t.Helper()
	ks, err := s.a.(inspector).Inspect(context.Background(), key, rules)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	if len(ks.Rules) != len(rules) || ks.Key != key {
		t.Fatalf("Inspect(%q) = %+v: malformed", key, ks)
	}
	return ks
}

// remaining is what Inspect says is left, rule by rule.
func remaining(ks KeyState) []int64 {
	var out []int64
	for _, r := range ks.Rules {
		out = append(out, r.Remaining)
	}
	return out
}

var inspectRules = []Rule{
	{Name: "tb", Limit: 10, Period: time.Hour},
	{Name: "sw", Limit: 5, Period: time.Hour, Algorithm: SlidingWindow},
}

// TestInspect: Inspect reports what a check would see, consumes nothing,
// and agrees with the decisions before it.
func TestInspect(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		key := uniqueKey(t)
		fresh := mustInspect(t, s, key, inspectRules)
		want := KeyState{Key: key, Rules: []RuleState{
			{Rule: "tb", Algorithm: TokenBucket, Remaining: 10},
			{Rule: "sw", Algorithm: SlidingWindow, Remaining: 5},
		}}
		fresh.Time = time.Time{}
		if diff := cmp.Diff(want, fresh); diff != "" {
			t.Errorf("Inspect of a fresh key (-want +got):\n%s", diff)
		}
		d := mustAllow(t, s, key, inspectRules, 3)
		for range 2 {
			ks := mustInspect(t, s, key, inspectRules)
			if got := remaining(ks); !cmp.Equal(got, []int64{7, 2}) {
				t.Errorf("Inspect after Allow(3) = %+v, want remaining [7 2]", ks)
			}
			tb, sw := ks.Rules[0], ks.Rules[1]
			if !tb.Found || !sw.Found || sw.Count+sw.Previous != 3 || tb.Count != 0 {
				t.Errorf("Inspect after Allow(3) = %+v, want both found, 3 counted by the window", ks)
			}
			// Six minutes a token, so 18 minutes to full; less since the check.
			if ra := tb.ResetAfter; ra > d.Rules[0].ResetAfter || ra < d.Rules[0].ResetAfter-time.Minute {
				t.Errorf("token bucket ResetAfter = %v, want just under %v", ra, d.Rules[0].ResetAfter)
			}
			if ks.TTL <= 0 || ks.TTL > 2*time.Hour+time.Second {
				t.Errorf("TTL = %v, want within (0, 2h1s]", ks.TTL)
			}
		}
		if d := mustAllow(t, s, key, inspectRules, 2); !d.Allowed || d.Rules[1].Remaining != 0 {
			t.Errorf("Allow(2) after inspecting = %+v, want allowed with the window drained", d)
		}
	})
}

// TestResetAndClear: Reset refills the named rules only; Clear refills
// every rule of the key.
func TestResetAndClear(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		ctx := context.Background()
		key := uniqueKey(t)
		other := Rule{Name: "other", Limit: 4, Period: time.Hour}
		mustAllow(t, s, key, inspectRules, 5)
		mustAllow(t, s, key, []Rule{other}, 4)
		if d := mustAllow(t, s, key, inspectRules, 1); d.Allowed {
			t.Fatalf("Allow on a drained window = %+v, want denied", d)
		}
		in := s.a.(inspector)
		if err := in.Reset(ctx, key, inspectRules[1:]); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		all := append([]Rule{other}, inspectRules...)
		ks := mustInspect(t, s, key, all)
		if got := remaining(ks); !cmp.Equal(got, []int64{0, 5, 5}) || ks.Rules[2].Found {
			t.Errorf("after Reset(sw): Inspect = %+v, want remaining [0 5 5], sw not found", ks)
		}
		if d := mustAllow(t, s, key, inspectRules, 5); !d.Allowed {
			t.Errorf("Allow(5) after Reset = %+v, want allowed", d)
		}
		if err := in.Clear(ctx, key); err != nil {
			t.Fatalf("Clear: %v", err)
		}
		ks = mustInspect(t, s, key, all)
		if got := remaining(ks); !cmp.Equal(got, []int64{4, 10, 5}) || ks.TTL != 0 {
			t.Errorf("after Clear: Inspect = %+v, want remaining [4 10 5] and no TTL", ks)
		}
		for _, r := range ks.Rules {
			if r.Found {
				t.Errorf("after Clear: %+v found", r)
			}
		}
		if err := in.Clear(ctx, ""); err == nil {
			t.Error("Clear(\"\") returned no error")
		}
	})
}

// TestResetForgetsDenials: a denial the local deny cache holds does not
// outlive a Reset.
func TestResetForgetsDenials(t *testing.T) {
	l := mustLimiter(t, mustRedis(t), Config{})
	ctx := context.Background()
	key := uniqueKey(t)
	rules := inspectRules[:1]
	for range 2 {
		if _, err := l.Allow(ctx, key, rules, 10); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := l.Allow(ctx, key, rules, 10); !d.Cached {
		t.Fatalf("Allow on a drained key = %+v, want a cached denial", d)
	}
	if err := l.Reset(ctx, key, rules); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, key, rules, 10); err != nil || !d.Allowed {
		t.Errorf("Allow after Reset = %+v, %v; want allowed", d, err)
	}
}

// TestRuleSetsShareKey: checks of different rule sets on one identity
// keep each other's states, in one key, and a state no longer checked is
// dropped once it reads as full.
func TestRuleSetsShareKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		key := uniqueKey(t)
		m := Rule{Name: "m", Limit: 10, Period: time.Hour}
		h := Rule{Name: "h", Limit: 20, Period: time.Hour, Burst: 30}
		d := Rule{Name: "d", Limit: 40, Period: time.Hour, Algorithm: SlidingWindow}
		mustAllow(t, s, key, []Rule{m, h}, 2)
		mustAllow(t, s, key, []Rule{h, d}, 3)
		mustAllow(t, s, key, []Rule{d}, 1)
		ks := mustInspect(t, s, key, []Rule{m, h, d})
		if got := remaining(ks); !cmp.Equal(got, []int64{8, 25, 36}) {
			t.Errorf("Inspect = %+v, want remaining [8 25 36]", ks)
		}
	})
	rdb := mustRedis(t)
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	ctx := context.Background()
	key := uniqueKey(t)
	fast := Rule{Name: "fast", Limit: 10, Period: 100 * time.Millisecond}
	slow := Rule{Name: "slow", Limit: 10, Period: time.Hour}
	ik := identityKey("rl", key)
	mustRedisAllow(t, l, key, []Rule{fast}, 1)
	mustRedisAllow(t, l, key, []Rule{slow}, 1)
	both := rdb.StrLen(ctx, ik).Val()
	time.Sleep(200 * time.Millisecond) // fast is full again
	mustRedisAllow(t, l, key, []Rule{slow}, 1)
	if n := rdb.StrLen(ctx, ik).Val(); n >= both {
		t.Errorf("STRLEN %s = %d after fast refilled, want below %d (its state dropped)", ik, n, both)
	}
}

func mustRedisAllow(t *testing.T, l *Redis, key string, rules []Rule, cost int64) Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), key, rules, cost)
	if err != nil || !d.Allowed {
		t.Fatalf("Allow(%q, %d) = %+v, %v; want allowed", key, cost, d, err)
	}
	return d
}

// writePreviousLayout leaves in Redis what a gateway from before one key
// per identity wrote on admitting cost units of key to fresh states: a hash
// per rule, keyed <prefix>:{<key>}:<bucket>:tb|sw, holding a token
// bucket's tk (micro-tokens), ts (us), l, P (us) and c (the rule), or a
// sliding window's w (window index), c, p and P (us), expiring as that
// script set it (when the state reads as full again, plus a second). The
// fields, not a kept copy of the old script: they are the contract
// allow.lua still reads.
func writePreviousLayout(t testing.TB, rdb redis.Cmdable, key string, rules []Rule, cost int64) {
	t.Helper()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	us := now.UnixMicro()
	for _, r := range rules {
		period := r.Period.Microseconds()
		var fields []any
		var full int64 // us until the state reads as full
		if r.algorithm() == SlidingWindow {
			w := us / period
			fields = []any{"w", w, "c", cost, "p", 0, "P", period}
			full = (w+2)*period - us
		} else {
			fields = []any{"tk", (r.Capacity() - cost) * 1_000_000, "ts", us, "l", r.Limit, "P", period, "c", r.Capacity()}
			full = (cost*period + r.Limit - 1) / r.Limit
		}
		k := ruleKey("rl", key, r)
		ttl := time.Duration((full+999)/1000)*time.Millisecond + time.Second
		if err := rdb.HSet(ctx, k, fields...).Err(); err != nil {
			t.Fatalf("HSET %s: %v", k, err)
		}
		if err := rdb.PExpire(ctx, k, ttl).Err(); err != nil {
			t.Fatalf("PEXPIRE %s: %v", k, err)
		}
	}
}

// TestPreviousLayoutTakenOver: an upgrade mid-window forgets nothing. The
// states the previous script wrote (a hash per rule) are read while the
// identity's key lacks them, converted once (to a changed rule, too), and
// then the identity's key alone decides; Clear removes both.
func TestPreviousLayoutTakenOver(t *testing.T) {
	for name, rdb := range map[string]redis.UniversalClient{"standalone": mustRedis(t), "cluster": mustCluster(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := mustLimiter(t, rdb, Config{DenyCache: -1, PreviousLayout: true})
			key := uniqueKey(t)
			tb := Rule{Name: "tb", Limit: 10, Period: time.Hour}
			sw := Rule{Name: "sw", Limit: 5, Period: time.Hour, Algorithm: SlidingWindow}
			writePreviousLayout(t, rdb, key, []Rule{tb, sw}, 4)
			// Without the gate, the old keys are not read: full.
			off := mustLimiter(t, rdb, Config{DenyCache: -1})
			if ks, err := off.Inspect(ctx, key, []Rule{tb, sw}); err != nil || !cmp.Equal(remaining(ks), []int64{10, 5}) {
				t.Fatalf("Inspect without PreviousLayout = %+v, %v; want the old keys unread, remaining [10 5]", ks, err)
			}
			ks, err := l.Inspect(ctx, key, []Rule{tb, sw})
			if err != nil || !cmp.Equal(remaining(ks), []int64{6, 1}) || !ks.Rules[0].Found {
				t.Fatalf("Inspect of the previous layout = %+v, %v; want found, remaining [6 1]", ks, err)
			}
			// Raised from 10 to 20 per hour on the way: the difference is added.
			raised := tb
			raised.Limit = 20
			d := mustRedisAllow(t, l, key, []Rule{raised, sw}, 1)
			if d.Rules[0].Remaining != 15 || d.Rules[1].Remaining != 0 {
				t.Errorf("first check after the upgrade = %+v, want remaining 15 and 0", d.Rules)
			}
			if d, err := l.Allow(ctx, key, []Rule{raised, sw}, 1); err != nil || d.Allowed {
				t.Errorf("second check = %+v, %v; want denied by the window", d, err)
			}
			// Taken over: what the old keys say no longer counts.
			rdb.Del(ctx, ruleKey("rl", key, tb))
			if ks, err := l.Inspect(ctx, key, []Rule{raised}); err != nil || ks.Rules[0].Remaining != 15 {
				t.Errorf("Inspect without the old key = %+v, %v; want 15 remaining", ks, err)
			}
			if err := l.Clear(ctx, key); err != nil {
				t.Fatal(err)
			}
			if n := rdb.Exists(ctx, l.Keys(key, []Rule{tb, sw})...).Val(); n != 0 {
				t.Errorf("after Clear, %d of the keys %v remain", n, l.Keys(key, []Rule{tb, sw}))
			}
		})
	}
}

// TestIdentityKeyMemory reports (and bounds) what one identity with the
// benchmark's three rules costs in Redis, against the previous layout.
// MEMORY USAGE is deterministic for a given value length, so a bound holds.
func TestIdentityKeyMemory(t *testing.T) {
	rdb := mustRedis(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	key := "test:mem:" + time.Now().Format("150405.000000")
	mustRedisAllow(t, l, key, benchRules, 1)
	writePreviousLayout(t, rdb, key, benchRules, 1)
	defer l.Clear(ctx, key)
	one := rdb.MemoryUsage(ctx, identityKey("rl", key)).Val()
	var old int64
	for _, r := range benchRules {
		old += rdb.MemoryUsage(ctx, ruleKey("rl", key, r)).Val()
	}
	t.Logf("MEMORY USAGE: %d bytes in one key, %d in the previous layout's three", one, old)
	// 176 for the rules' records, and the 25 bytes of the sequence record
	// (numbered decisions, #35) round up to 208.
	if one > 208 || one*2 > old {
		t.Errorf("MEMORY USAGE of the identity's key = %d, want at most 208 and under half of the previous %d", one, old)
	}
}
