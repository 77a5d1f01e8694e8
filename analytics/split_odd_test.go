package analytics_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestSplitOddGatewayIDs: a hot key seen at a gateway without an id (its
// host name unknown) or at one named "*" (the others' share's name) still
// gets a split whose buckets, over every gateway, hold exactly the key's
// limit; and such a key does not fail the write of every other key's split
// (one invalid directive refuses the whole set).
func TestSplitOddGatewayIDs(t *testing.T) {
	rdb, prefix := mustRedis(t)
	ctx := context.Background()
	cfg := analytics.Config{}.WithDefaults().Hot
	traffic := []analytics.KeyTraffic{
		{KeyID: "unnamed", KeyKind: "api_key", Gateways: map[string]int64{"": 3000, "gw-a": 3000}},
		{KeyID: "star", KeyKind: "api_key", Gateways: map[string]int64{limiter.OtherGateways: 3000, "gw-a": 3000}},
		{KeyID: "plain", KeyKind: "api_key", Gateways: map[string]int64{"gw-a": 4500, "gw-b": 1500}},
	}
	hot := analytics.DetectHotKeys(cfg, traffic, 18000, time.Minute, nil)
	now := time.Now()
	splits := analytics.SplitDirectives(hot, now, time.Minute)
	if len(splits) != len(traffic) {
		t.Fatalf("SplitDirectives = %d splits of %d hot keys %+v, want one each", len(splits), len(hot), hot)
	}
	store := limiter.NewDirectiveStore(rdb, prefix)
	if err := store.WriteSplits(ctx, splits); err != nil {
		t.Fatalf("WriteSplits(%+v) = %v, want every split written", splits, err)
	}
	d, _, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rules := []limiter.Rule{{Name: "minute", Limit: 1000, Period: time.Minute}}
	for _, k := range traffic {
		key := limiter.DirectiveKey(k.KeyKind, k.KeyID)
		// Every bucket any gateway checks, named or not, counted once.
		buckets := map[string]int64{}
		for _, gw := range []string{"", limiter.OtherGateways, "gw-a", "gw-b", "gw-new"} {
			bk, rs, ok := d.Split(key, gw, rules, now)
			if !ok {
				t.Errorf("%s at %q: split not applied", key, gw)
				continue
			}
			buckets[bk] = rs[0].Limit
		}
		var sum int64
		for _, n := range buckets {
			sum += n
		}
		if sum != rules[0].Limit {
			t.Errorf("%s: buckets %v hold %d in all, want the limit %d", key, buckets, sum, rules[0].Limit)
		}
		// The odd gateway's demand is half the key's: its bucket (the
		// others') holds about half the limit, not the 2% reserve.
		if k.KeyID != "plain" && buckets[key+"/gw:"+limiter.OtherGateways] < rules[0].Limit/3 {
			t.Errorf("%s: the odd gateway's bucket holds %d of %d, want about half", key, buckets[key+"/gw:"+limiter.OtherGateways], rules[0].Limit)
		}
	}
}
