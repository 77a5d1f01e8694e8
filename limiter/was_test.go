package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestTagSharesOneContainer: a check's buckets under one tag are one
// Redis key, read and written once; an Alone bucket keeps a key of its
// own beside it; each bucket still counts apart.
func TestTagSharesOneContainer(t *testing.T) {
	rdb := mustRedis(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{Prefix: fmt.Sprintf("sh%x", time.Now().UnixNano()), DenyCache: -1})
	key := "rls:dom"
	rules := []Rule{
		{Name: "m", Bucket: "em", Tag: "tcaller", Limit: 3, Period: time.Minute},
		{Name: "h", Bucket: "eh", Tag: "tcaller", Limit: 5, Period: time.Hour, Burst: 6},
		{Name: "p", Bucket: "ep", Tag: "tcaller", Alone: true, Limit: 10, Period: time.Hour},
		{Name: "g", Bucket: "eg", Tag: "tall", Limit: 10, Period: time.Hour},
	}
	keys := l.Keys(key, rules)
	want := []string{l.cfg.Prefix + ":{tcaller}::rls:dom:", l.cfg.Prefix + ":{tcaller}::rls:dom:ep", l.cfg.Prefix + ":{tall}::rls:dom:"}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("Keys = %q, want %q", keys, want)
	}
	for i := range 3 {
		d, err := l.Allow(ctx, key, rules, 1)
		if err != nil || !d.Allowed || d.Rules[0].Remaining != int64(2-i) || d.Rules[1].Remaining != int64(5-i) {
			t.Fatalf("Allow %d = %+v, %v; want allowed, %d and %d left", i, d, err, 2-i, 5-i)
		}
	}
	d, err := l.Allow(ctx, key, rules, 1)
	if err != nil || d.Allowed || d.Rules[0].Allowed || !d.Rules[1].Allowed {
		t.Fatalf("Allow after m's 3 = %+v, %v; want denied by m alone", d, err)
	}
	stored, err := rdb.Keys(ctx, l.cfg.Prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 3 {
		t.Errorf("keys stored = %q, want the 3 containers", stored)
	}
	// The rules checked apart still find their states in the shared one.
	d, err = l.Allow(ctx, key, rules[1:2], 1)
	if err != nil || !d.Allowed || d.Rules[0].Remaining != 2 {
		t.Errorf("h alone = %+v, %v; want allowed, 2 left", d, err)
	}
	ks, err := l.Inspect(ctx, key, rules[:2])
	if err != nil || !ks.Rules[0].Found || ks.Rules[0].Remaining != 0 || ks.Rules[1].Remaining != 2 {
		t.Errorf("Inspect = %+v, %v; want m empty, h 2 left", ks, err)
	}
	if err := l.Reset(ctx, key, rules[:1]); err != nil {
		t.Fatal(err)
	}
	ks, err = l.Inspect(ctx, key, rules[:2])
	if err != nil || ks.Rules[0].Found || ks.Rules[1].Remaining != 2 {
		t.Errorf("Inspect after resetting m = %+v, %v; want m gone, h kept", ks, err)
	}
}

// TestWasTagHoldsBothLayouts: gateways of the earlier layout (a container
// per bucket) and of the shared one, side by side in any order, admit a
// caller its limit once, not once each; a reset clears both layouts. On a
// Cluster the two containers are in different slots.
func TestWasTagHoldsBothLayouts(t *testing.T) {
	for _, tc := range []struct {
		name string
		rdb  func(t *testing.T) rediser
	}{
		{"redis", func(t *testing.T) rediser { return mustRedis(t) }},
		{"redis-cluster", func(t *testing.T) rediser { return mustCluster(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := tc.rdb(t)
			ctx := context.Background()
			l := mustLimiter(t, rdb, Config{DenyCache: -1})
			key := uniqueKey(t)
			tags := []string{"tnew", "told1", "told2"}
			if _, ok := rdb.(*redis.ClusterClient); ok {
				tags = tagsApart(t, l, key, 3)
			}
			old := []Rule{
				{Name: "m", Bucket: "em", Tag: tags[1], Alone: true, Limit: 4, Period: time.Hour},
				{Name: "h", Bucket: "eh", Tag: tags[2], Alone: true, Limit: 6, Period: time.Hour},
			}
			cur := []Rule{
				{Name: "m", Bucket: "em", Tag: tags[0], WasTag: tags[1], Limit: 4, Period: time.Hour},
				{Name: "h", Bucket: "eh", Tag: tags[0], WasTag: tags[2], Limit: 6, Period: time.Hour},
			}
			admitted := 0
			for i := range 8 {
				rules := old
				if i%3 != 0 {
					rules = cur
				}
				d, err := l.Allow(ctx, key, rules, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
				if len(d.Rules) != 2 || d.Rules[0].Rule.Name != "m" {
					t.Fatalf("Allow %d answers %+v; want the 2 rules checked", i, d.Rules)
				}
			}
			if admitted != 4 {
				t.Errorf("admitted %d across both layouts; want m's limit, 4", admitted)
			}
			d, err := l.Allow(ctx, key, cur[1:], 1)
			if err != nil || !d.Allowed || d.Rules[0].Remaining != 1 {
				t.Errorf("h after 4 = %+v, %v; want allowed with 1 left in both layouts", d, err)
			}
			d, err = l.Allow(ctx, key, old[1:], 1)
			if err != nil || !d.Allowed || d.Rules[0].Remaining != 0 {
				t.Errorf("h in the old layout after 5 = %+v, %v; want allowed with 0 left", d, err)
			}
			ks, err := l.Inspect(ctx, key, cur)
			if err != nil || ks.Rules[1].Remaining != 0 || ks.Rules[0].Remaining != 0 {
				t.Errorf("Inspect = %+v, %v; want m and h empty (the more used side of each)", ks, err)
			}
			if err := l.Reset(ctx, key, cur); err != nil {
				t.Fatal(err)
			}
			for _, rules := range [][]Rule{old, cur} {
				d, err := l.Allow(ctx, key, rules, 1)
				if err != nil || !d.Allowed {
					t.Errorf("Allow after Reset = %+v, %v; want allowed in either layout", d, err)
				}
			}
		})
	}
}

// TestWasTagPastMaxRules: with their previous containers, MaxRules rules
// are twice as many checks as one call carries; still one decision.
func TestWasTagPastMaxRules(t *testing.T) {
	rdb := mustRedis(t)
	ctx := context.Background()
	l := mustLimiter(t, rdb, Config{DenyCache: -1})
	key := uniqueKey(t)
	rules := make([]Rule, MaxRules)
	for i := range rules {
		b := fmt.Sprintf("e%d", i)
		rules[i] = Rule{Name: b, Bucket: b, Tag: "tnew", WasTag: fmt.Sprintf("told%d", i), Limit: int64(3 + i), Period: time.Hour}
	}
	for i := range 3 {
		d, err := l.Allow(ctx, key, rules, 1)
		if err != nil || !d.Allowed || len(d.Rules) != MaxRules || d.Rules[0].Remaining != int64(2-i) {
			t.Fatalf("Allow %d = %+v, %v; want allowed, %d left", i, d, err, 2-i)
		}
	}
	d, err := l.Allow(ctx, key, rules, 1)
	if err != nil || d.Allowed || d.Rules[1].Remaining != 1 {
		t.Fatalf("Allow 4 = %+v, %v; want denied by the first rule, the second given back (1 left)", d, err)
	}
	old := rules[5]
	old.Tag, old.Alone, old.WasTag = old.WasTag, true, ""
	d, err = l.Allow(ctx, key, []Rule{old}, 1)
	if err != nil || !d.Allowed || d.Rules[0].Remaining != 4 {
		t.Errorf("rule 5 in its previous container = %+v, %v; want 3 charged there too, 4 left", d, err)
	}
}
