package analytics_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestSplitSharesKeepTheLimit checks that a split sized from observed
// traffic keeps a hot key's limit under uneven load balancing. Two
// gateways see the key 3:1 at 1.2× its limit; each checks its own Redis
// bucket holding its share, as the gateways do through limiter.Directives.
// With shares from DetectHotKeys (observed 3:1) the total admitted must stay
// within ±5 % of the limit; an even split, for contrast, starves the busy
// gateway and admits visibly less.
func TestSplitSharesKeepTheLimit(t *testing.T) {
	rdb, prefix := mustRedis(t)
	t.Parallel()
	ctx := context.Background()
	lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 100 // per second
	// Burst = limit: a share of a small burst is a bucket of a token or
	// two, which loses refill whenever a loaded machine delays a request.
	rules := []limiter.Rule{{Name: "second", Limit: limit, Period: time.Second}}
	demand := map[string]float64{"gw-a": 0.9 * limit, "gw-b": 0.3 * limit} // 3:1, 1.2× the limit

	// The detector sees the key's traffic 3:1 and sizes the split from it.
	cfg := analytics.Config{}.WithDefaults().Hot
	hot := analytics.DetectHotKeys(cfg, []analytics.KeyTraffic{{KeyID: "observed", KeyKind: "api_key",
		Gateways: map[string]int64{"gw-a": 5400, "gw-b": 1800}}}, 7200, time.Minute, nil)
	if len(hot) != 1 {
		t.Fatalf("DetectHotKeys = %+v, want the key", hot)
	}
	now := time.Now()
	splits := analytics.SplitDirectives(hot, now, time.Minute)
	splits = append(splits, limiter.SplitDirective{Key: "api_key:even", Shares: map[string]float64{"gw-a": 0.5, "gw-b": 0.5}, Expires: now.Add(time.Minute)})
	store := limiter.NewDirectiveStore(rdb, prefix)
	if err := store.WriteSplits(ctx, splits); err != nil {
		t.Fatal(err)
	}
	w := limiter.NewWatcher(store, time.Hour)
	w.Refresh(ctx)

	const run = 8 * time.Second
	admitted := map[string]*atomic.Int64{"api_key:observed": {}, "api_key:even": {}}
	var wg sync.WaitGroup
	start := time.Now()
	for key := range admitted {
		for gw, rate := range demand {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k, rs, ok := w.Current().Split(key, gw, rules, time.Now())
				if !ok {
					t.Errorf("%s on %s: split not applied", key, gw)
					return
				}
				every := time.Duration(float64(time.Second) / rate)
				for i := 0; ; i++ {
					at := start.Add(time.Duration(i) * every)
					if at.Sub(start) >= run {
						return
					}
					time.Sleep(time.Until(at))
					d, err := lim.Allow(ctx, k, rs, 1)
					if err != nil {
						t.Errorf("allow: %v", err)
						return
					}
					if d.Allowed {
						admitted[key].Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	// The limit over the run, plus the buckets' initial burst.
	want := float64(limit)*run.Seconds() + float64(rules[0].Capacity())
	got := float64(admitted["api_key:observed"].Load())
	even := float64(admitted["api_key:even"].Load())
	t.Logf("3:1 load at 1.2× the limit for %v: observed-share split admitted %.0f (%.1f%% of the limit), even split %.0f (%.1f%%); shares %v",
		run, got, 100*got/want, even, 100*even/want, hot[0].Shares)
	// Never over the limit; under it by the reserve for unnamed gateways
	// (2%) and what a loaded machine's stalls lose, so the lower bound is
	// loose — the point is that shares sized from traffic beat even ones.
	if got > 1.05*want {
		t.Errorf("split sized from traffic admitted %.0f, want at most %.0f + 5%%", got, want)
	}
	if got < 0.85*want {
		t.Errorf("split sized from traffic admitted only %.0f, want about %.0f", got, want)
	}
	if got-even < 0.08*want {
		t.Errorf("observed shares admitted %.0f, even shares %.0f of %.0f: under 3:1 load the even split should starve the busy gateway visibly", got, even, want)
	}
}

// TestPipelineSplitFollowsDemand is issue 14 row 4 end to end: two real
// gateways on a real Redis, one saturated (3× the key's limit) and one at
// 10/s, their decisions through Kafka and the consumer into ClickHouse,
// and the split written by the detector from them. With the split in
// force the key must admit at least 90 % of what its shared bucket would
// (its limit), never more than the limit (plus one bucket's burst), and
// the quiet gateway must keep what it uses: a split in proportion to
// requests gave it the 5 % floor (about 2 of its 10/s), an even one left
// half the limit idle at it (229 admitted of about 400).
func TestPipelineSplitFollowsDemand(t *testing.T) {
	const limit = 40 // per second
	rule := limiter.Rule{Name: "second", Limit: limit, Period: time.Second}
	f := startFleet(t, []string{"gw-a", "gw-b"}, map[string]gateway.Plan{
		"hot": {Rules: []gateway.Rule{{Rule: rule}}},
	}, map[string]string{"hot": "hot"})
	t.Parallel()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := context.WithCancel(f.ctx)
	defer stop() // before wg.Wait: the detector and the load run until then

	f.detect(ctx, t, &wg, analytics.NATConfig{})
	var as answers
	start := time.Now()
	for gw, rate := range map[string]float64{"gw-a": 3 * limit, "gw-b": 10} {
		f.paced(ctx, t, &wg, start, gw, "hot", rate, as.record(t, gw))
	}
	hotKey := limiter.DirectiveKey("api_key", eventKeyID(fleetSecret, "k:hot"))
	f.waitSplit(t, hotKey)
	applied := time.Now()
	t.Logf("split applied %.1fs after the load started: shares %v", applied.Sub(start).Seconds(), f.watchers["gw-a"].Current().Splits[hotKey].Shares)

	// Measure over 8 periods from 12s on. The first split was sized from
	// the few seconds of traffic ClickHouse held, whose allowed count
	// includes the shared bucket's initial burst (the capacity looks
	// larger, so the quiet gateway's share smaller), and the new buckets
	// start full; from one min_span (10s) after the split on, the shares
	// are sized from traffic under it alone.
	const measure = 8 * time.Second
	m0 := applied.Add(12 * time.Second)
	time.Sleep(time.Until(m0.Add(measure + time.Second)))
	sent, admitted := as.count(m0, m0.Add(measure))
	stop()
	total := admitted["gw-a"] + admitted["gw-b"]
	shared := limit * measure.Seconds() // what the shared bucket admits, drained
	t.Logf("saturated gw-a sent %d, admitted %d; gw-b at 10/s sent %d, admitted %d; total %d of the shared bucket's %.0f (%.1f%%); shares %v",
		sent["gw-a"], admitted["gw-a"], sent["gw-b"], admitted["gw-b"], total, shared, 100*float64(total)/shared,
		f.watchers["gw-a"].Current().Splits[hotKey].Shares)
	if float64(total) < 0.9*shared {
		t.Errorf("admitted %d in %v, want at least 90%% of the shared bucket's %.0f", total, measure, shared)
	}
	if ceiling := shared + float64(rule.Capacity()); float64(total) > ceiling {
		t.Errorf("admitted %d in %v, over the limit's %.0f (with one burst)", total, measure, ceiling)
	}
	if float64(admitted["gw-b"]) < 0.9*float64(sent["gw-b"]) {
		t.Errorf("the quiet gateway kept %d of its %d requests, want at least 90%%: its share should follow what it uses",
			admitted["gw-b"], sent["gw-b"])
	}
}

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
