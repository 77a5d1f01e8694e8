package analytics_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// clock is a settable time for the detector.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// TestDetectorDirectivesThroughRedis runs the detector over a seeded
// ClickHouse against a real Redis: the planted hot key's split and the
// planted NAT addresses' raises land in Redis and load through
// limiter.Watcher as the gateways load them; an unchanged run does not
// rewrite them; when the key cools the split is removed and the shared
// bucket returns; and a directive left behind lapses at its expiry.
func TestDetectorDirectivesThroughRedis(t *testing.T) {
	conn := mustDatabase(t)
	now := fleetClock()
	f, _, wantNAT := seededFleet(now)
	mustInsert(t, conn, f.Rows())
	rdb, prefix := mustRedis(t)
	store := limiter.NewDirectiveStore(rdb, prefix)
	clk := &clock{t: now}
	reg := prometheus.NewRegistry()
	// The whole seeded fleet stops with the hot key here, so the cold run's
	// data is 3 minutes old: StaleAfter lets the run act on it
	// (TestFaultStaleData covers stale data).
	det, err := analytics.NewDetector(analytics.Config{StaleAfter: 5 * time.Minute, Hot: analytics.HotConfig{MinRate: 10, MinShare: -1}}, analytics.Deps{
		Reader: analytics.NewReader(conn), Directives: store, Now: clk.Now, Registry: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := limiter.NewWatcher(store, time.Hour) // refreshed by hand below
	rules := []limiter.Rule{{Name: "per_minute", Limit: 1000, Period: time.Minute}}
	splitKey := limiter.DirectiveKey("api_key", "hot-1")

	rep := det.RunOnce(ctx)
	if len(rep.Errors) > 0 || !rep.SplitsWritten || !rep.NATsWritten {
		t.Fatalf("first run = %+v, want splits and NATs written without errors", rep)
	}
	w.Refresh(ctx)
	d := w.Current()
	s, ok := d.Splits[splitKey]
	if len(d.Splits) != 1 || !ok {
		t.Fatalf("watcher splits = %+v, want only %s", d.Splits, splitKey)
	}
	// hot-1 is seen 3:1 and denied about half the time: gw-b asks for
	// about half of what the key was allowed, and keeps it (Shares).
	if math.Abs(s.Shares["gw-a"]-0.49) > 0.03 || math.Abs(s.Shares["gw-b"]-0.49) > 0.03 {
		t.Errorf("split shares = %v, want about 0.49 / 0.49 (and 0.02 for the others)", s.Shares)
	}
	if got := s.Expires.Sub(now); got != 2*time.Minute {
		t.Errorf("split expires %v after the run, want the 2m TTL", got)
	}
	key, scaled, applied := d.Split(splitKey, "gw-b", rules, now)
	if !applied || key == splitKey || math.Abs(float64(scaled[0].Limit)-490) > 30 {
		t.Errorf("gw-b applies split = %q %+v %v, want its own bucket with about 490/min", key, scaled, applied)
	}
	if len(d.NATs) != len(wantNAT) {
		t.Errorf("watcher NATs = %v, want %v", d.NATs, wantNAT)
	}
	for _, k := range wantNAT {
		n, ok := d.NATs[k]
		if !ok || n.Factor <= 1 || n.Clients < 25 {
			t.Errorf("NAT directive %s = %+v, %v; want a raise for 25+ clients", k, n, ok)
		}
		if raised, ok := d.NAT(k, rules, now); !ok || raised[0].Limit <= rules[0].Limit {
			t.Errorf("NAT(%s) = %+v, %v; want a raised limit", k, raised, ok)
		}
	}
	version := d.Version

	// Same data, 5s later: nothing changed, nothing rewritten.
	clk.Set(now.Add(5 * time.Second))
	rep = det.RunOnce(ctx)
	if rep.SplitsWritten || rep.NATsWritten || len(rep.HotKeys) != 1 {
		t.Errorf("unchanged run = %+v, want no rewrite and the hot key still there", rep)
	}
	if v, _ := store.Version(ctx); v != version {
		t.Errorf("directive version moved %d → %d on an unchanged run", version, v)
	}
	if rep.HotKeys[0].Since != now {
		t.Errorf("hot key since %v, want the first run %v", rep.HotKeys[0].Since, now)
	}

	// The key's traffic ended at now. 75s later its rate over the window
	// (the 30s of the minute it still covers, over 105s) is 17/s, about
	// half of it allowed: under the 10/s threshold of allowed requests,
	// over half of it, so the split stays (cooling), its expiry refreshed
	// since less than half its TTL was left.
	clk.Set(now.Add(75 * time.Second))
	rep = det.RunOnce(ctx)
	if len(rep.HotKeys) != 1 || rep.HotKeys[0].Reason != "cooling" || !rep.SplitsWritten {
		t.Errorf("run 75s after = %+v, written %v; want hot-1 cooling, split refreshed", rep.HotKeys, rep.SplitsWritten)
	}
	w.Refresh(ctx)
	if s := w.Current().Splits[splitKey]; !s.Expires.Equal(now.Add(75*time.Second + 2*time.Minute)) {
		t.Errorf("cooling split expires %v, want refreshed to %v", s.Expires, now.Add(75*time.Second+2*time.Minute))
	}

	// Three minutes after, the key is cold: the split is removed and the
	// gateways go back to the shared bucket.
	clk.Set(now.Add(3 * time.Minute))
	rep = det.RunOnce(ctx)
	if len(rep.HotKeys) != 0 || !rep.SplitsWritten {
		t.Fatalf("cold run = %+v, want no hot key and the split removed", rep)
	}
	w.Refresh(ctx)
	if _, ok := w.Current().Splits[splitKey]; ok {
		t.Fatalf("split still loaded after the key cooled: %+v", w.Current().Splits)
	}
	if key, _, applied := w.Current().Split(splitKey, "gw-a", rules, now.Add(3*time.Minute)); applied || key != splitKey {
		t.Errorf("after cooling Split = %q, %v; want the shared key", key, applied)
	}
	// Writes: splits at the first run, the cooling refresh and the
	// removal; NATs once.
	if got, err := testutil.GatherAndCount(reg, "edgelimit_analytics_directive_writes_total"); err != nil || got != 2 {
		t.Errorf("directive write series = %d, %v; want 2 (split, nat)", got, err)
	}

	// A directive whose writer stopped lapses at its expiry: the gateway's
	// copy stops applying, and Redis drops the set with its newest entry.
	short := limiter.SplitDirective{Key: "api_key:orphan", Shares: map[string]float64{"gw-a": 0.5, "gw-b": 0.5}, Expires: time.Now().Add(300 * time.Millisecond)}
	if err := store.WriteSplits(ctx, []limiter.SplitDirective{short}); err != nil {
		t.Fatal(err)
	}
	w.Refresh(ctx)
	if _, _, ok := w.Current().Split(short.Key, "gw-a", rules, time.Now()); !ok {
		t.Fatal("fresh orphan split not applied")
	}
	testenv.WaitFor(t, 5*time.Second, "the orphan split to lapse", func() bool {
		_, _, ok := w.Current().Split(short.Key, "gw-a", rules, time.Now())
		return !ok
	})
	testenv.WaitFor(t, 5*time.Second, "Redis to drop the expired split set", func() bool {
		n, err := rdb.Exists(ctx, prefix+":{directives}:split").Result()
		return err == nil && n == 0
	})
}
