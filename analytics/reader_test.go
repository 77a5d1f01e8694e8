package analytics_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestReaderOnSeededFleet seeds ClickHouse through the raw table (the
// consumer's materialized views fill the rollups) and checks every query
// against counts computed from the same rows in Go.
func TestReaderOnSeededFleet(t *testing.T) {
	conn := mustDatabase(t)
	f, _, _ := seededFleet(fleetClock())
	rows := f.Rows()
	mustInsert(t, conn, rows)
	r := analytics.NewReader(conn)
	ctx := context.Background()
	from, to := f.Now.Add(-f.Window).Truncate(time.Minute), f.Now.Add(time.Minute)

	t.Run("total requests", func(t *testing.T) {
		n, err := r.TotalRequests(ctx, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(len(rows)) {
			t.Errorf("TotalRequests = %d, want %d", n, len(rows))
		}
	})

	t.Run("trends by rule per minute", func(t *testing.T) {
		q := analytics.TrendQuery{Range: analytics.Range{From: from, To: to}, Bucket: analytics.BucketMinute, By: analytics.DimRule}
		got, err := r.Trends(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		type k struct {
			bucket time.Time
			rule   string
		}
		want := map[k][2]int64{}
		for _, d := range rows {
			key := k{d.Time.UTC().Truncate(time.Minute), d.BindingRule}
			w := want[key]
			w[0]++
			if !d.Allowed {
				w[1]++
			}
			want[key] = w
		}
		if len(got) != len(want) {
			t.Errorf("Trends returned %d points, want %d", len(got), len(want))
		}
		for _, p := range got {
			w := want[k{p.Bucket, p.Series}]
			if p.Requests != w[0] || p.Denied != w[1] {
				t.Errorf("Trends point %v %q = %d requests, %d denied; want %d, %d", p.Bucket, p.Series, p.Requests, p.Denied, w[0], w[1])
			}
			if p.Requests > 0 && math.Abs(p.Ratio-float64(p.Denied)/float64(p.Requests)) > 1e-12 {
				t.Errorf("Trends point ratio %v, want denied/requests", p.Ratio)
			}
		}
	})

	t.Run("trends by plan per hour, filtered by route", func(t *testing.T) {
		q := analytics.TrendQuery{Range: analytics.Range{From: from, To: to, Route: "/v1/search"}, Bucket: analytics.BucketHour, By: analytics.DimPlan}
		got, err := r.Trends(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][2]int64{}
		for _, d := range rows {
			if d.Route != "/v1/search" {
				continue
			}
			w := want[d.Plan]
			w[0]++
			if !d.Allowed {
				w[1]++
			}
			want[d.Plan] = w
		}
		gotm := map[string][2]int64{}
		for _, p := range got {
			if p.Bucket.Minute() != 0 || p.Bucket.Second() != 0 {
				t.Errorf("hour bucket %v not on the hour", p.Bucket)
			}
			w := gotm[p.Series]
			gotm[p.Series] = [2]int64{w[0] + p.Requests, w[1] + p.Denied}
		}
		if diff := cmp.Diff(want, gotm); diff != "" {
			t.Errorf("Trends by plan mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("trends by key, top 3 and other", func(t *testing.T) {
		q := analytics.TrendQuery{Range: analytics.Range{From: from, To: to}, Bucket: analytics.BucketDay, By: analytics.DimKey, Top: 3}
		got, err := r.Trends(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		series := map[string]int64{}
		var total int64
		for _, p := range got {
			series[p.Series] += p.Requests
			total += p.Requests
		}
		// A key is named by its name when it has one: hot-1 is acme.
		if len(series) != 4 || series[analytics.OtherSeries] == 0 || series["acme"] == 0 || series["hot-1"] != 0 {
			t.Errorf("Trends top 3 series = %v, want acme (hot-1 by name), two more and %s", series, analytics.OtherSeries)
		}
		if total != int64(len(rows)) {
			t.Errorf("Trends top 3 sum to %d requests, want all %d", total, len(rows))
		}
	})

	t.Run("top keys", func(t *testing.T) {
		got, err := r.TopKeys(ctx, analytics.Range{From: from, To: to}, 5)
		if err != nil {
			t.Fatal(err)
		}
		denied := map[string]int64{}
		for _, d := range rows {
			if !d.Allowed {
				denied[d.KeyID]++
			}
		}
		keys := make([]string, 0, len(denied))
		for k := range denied {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return denied[keys[i]] > denied[keys[j]] })
		if len(got) != 5 || got[0].KeyID != "hot-1" || got[0].Denied != denied["hot-1"] {
			t.Fatalf("TopKeys = %+v, want hot-1 first with %d denied", got, denied["hot-1"])
		}
		for i := 1; i < len(got); i++ {
			if got[i].Denied > got[i-1].Denied {
				t.Errorf("TopKeys not ordered by denied: %d after %d", got[i].Denied, got[i-1].Denied)
			}
			if got[i].Denied != denied[got[i].KeyID] {
				t.Errorf("TopKeys %s denied = %d, want %d", got[i].KeyID, got[i].Denied, denied[got[i].KeyID])
			}
		}
		if !slices.Contains(got[0].Rules, "per_minute") || got[0].Gateways != 2 || got[0].Plans[0] != "pro" {
			t.Errorf("TopKeys hot-1 evidence = %+v, want rule per_minute, 2 gateways, plan pro", got[0])
		}
	})

	t.Run("fail minutes and store health", func(t *testing.T) {
		fm, err := r.FailMinutes(ctx, analytics.Range{From: from, To: to})
		if err != nil {
			t.Fatal(err)
		}
		o := f.Outages[0]
		if len(fm) != 2 {
			t.Fatalf("FailMinutes = %+v, want the outage's 2 minutes", fm)
		}
		for i, m := range fm {
			if m.Gateway != "gw-c" || !m.Minute.Equal(o.From.Add(time.Duration(i)*time.Minute)) || m.FailOpen == 0 || m.FailClosed != 0 || m.StoreUnavailable != m.FailOpen {
				t.Errorf("FailMinutes[%d] = %+v, want gw-c at %v failing open", i, m, o.From.Add(time.Duration(i)*time.Minute))
			}
			if share := float64(m.FailOpen) / float64(m.Requests); share < 0.4 || share > 0.8 {
				t.Errorf("FailMinutes[%d] fail-open share %.2f, want about 0.6", i, share)
			}
		}
		sh, err := r.StoreHealth(ctx, analytics.Range{From: from, To: to, Gateway: "gw-c"}, analytics.BucketMinute)
		if err != nil {
			t.Fatal(err)
		}
		var open, n int64
		for _, g := range sh {
			if g.Gateway != "gw-c" {
				t.Errorf("StoreHealth filtered by gw-c returned %q", g.Gateway)
			}
			if g.Requests > 0 && (g.LatencyP50 < 200 || g.LatencyP99 > 1000 || g.LatencyMax < g.LatencyP99) {
				t.Errorf("StoreHealth latency p50 %v p99 %v max %v outside the seeded 200..1000µs", g.LatencyP50, g.LatencyP99, g.LatencyMax)
			}
			open += g.FailOpen
			n += g.Requests
		}
		if open != fm[0].FailOpen+fm[1].FailOpen || n == 0 {
			t.Errorf("StoreHealth fail open %d, want %d", open, fm[0].FailOpen+fm[1].FailOpen)
		}
	})

	t.Run("fleet alert over the outage", func(t *testing.T) {
		o := f.Outages[0]
		gh, err := r.GatewayHealth(ctx, o.From, o.From.Add(o.For))
		if err != nil {
			t.Fatal(err)
		}
		cfg := analytics.Config{}.WithDefaults().Alerts
		var firing []string
		for _, a := range analytics.EvaluateAlerts(cfg, gh) {
			if a.Firing {
				firing = append(firing, a.Name)
				if !cmp.Equal(a.Gateways, []string{"gw-c"}) {
					t.Errorf("%s gateways = %v, want [gw-c]", a.Name, a.Gateways)
				}
			}
		}
		if want := []string{analytics.AlertStoreUnavailable, analytics.AlertFailOpen}; !cmp.Equal(firing, want) {
			t.Errorf("alerts firing over the outage = %v, want %v", firing, want)
		}
		gh, err = r.GatewayHealth(ctx, f.Now.Add(-2*time.Minute), f.Now)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range analytics.EvaluateAlerts(cfg, gh) {
			if a.Firing {
				t.Errorf("alert %s firing after the outage: %+v", a.Name, a)
			}
		}
	})

	t.Run("histories", func(t *testing.T) {
		kh, err := r.KeyHistory(ctx, analytics.Range{From: from, To: to, KeyID: "hot-1"}, analytics.BucketMinute)
		if err != nil {
			t.Fatal(err)
		}
		per := map[string]int64{}
		for _, p := range kh {
			per[p.Gateway] += p.Requests
		}
		if len(per) != 2 || per["gw-a"] < 2*per["gw-b"] {
			t.Errorf("KeyHistory(hot-1) per gateway = %v, want gw-a about 3× gw-b", per)
		}
		ih, err := r.IPHistory(ctx, analytics.Range{From: from, To: to}, "2001:db8:aa:1::", analytics.BucketHour)
		if err != nil {
			t.Fatal(err)
		}
		var reqs, keys int64
		for _, p := range ih {
			reqs += p.Requests
			keys = max(keys, p.DistinctKeys)
		}
		if reqs != 600 || keys != 30 {
			t.Errorf("IPHistory(2001:db8:aa:1::/64) = %d requests, %d keys; want 600, 30", reqs, keys)
		}
	})

	t.Run("bad queries", func(t *testing.T) {
		for name, q := range map[string]analytics.TrendQuery{
			"empty range":   {Range: analytics.Range{From: to, To: from}, Bucket: "minute"},
			"bad bucket":    {Range: analytics.Range{From: from, To: to}, Bucket: "week"},
			"bad dimension": {Range: analytics.Range{From: from, To: to}, Bucket: "minute", By: "client_ip; DROP"},
			"too many":      {Range: analytics.Range{From: from.Add(-300 * 24 * time.Hour), To: to}, Bucket: "minute"},
			// 43,200 minutes (under the bucket bound) × 1,001 series.
			"too many series": {Range: analytics.Range{From: from.Add(-30 * 24 * time.Hour), To: to}, Bucket: "minute", By: "key", Top: 1000},
			"negative top":    {Range: analytics.Range{From: from, To: to}, Bucket: "day", Top: -1},
			"key without top": {Range: analytics.Range{From: from, To: to}, Bucket: "day", By: "key"},
			"too long range":  {Range: analytics.Range{From: from.Add(-500 * 24 * time.Hour), To: to}, Bucket: "day"},
		} {
			if _, err := r.Trends(ctx, q); !errors.Is(err, analytics.ErrBadQuery) {
				t.Errorf("Trends(%s) error = %v, want ErrBadQuery", name, err)
			}
		}
		// A filter value is bound, never spliced: quotes are data.
		got, err := r.Trends(ctx, analytics.TrendQuery{Range: analytics.Range{From: from, To: to, Route: "x' OR '1'='1"}, Bucket: "day"})
		if err != nil || len(got) != 0 {
			t.Errorf("Trends with a quoting route = %v, %v; want nothing", got, err)
		}
	})
}

// TestDetectorsOnSeededFleet runs the detectors over the seeded rollups:
// they must flag exactly the planted hot key and NAT addresses.
func TestDetectorsOnSeededFleet(t *testing.T) {
	conn := mustDatabase(t)
	f, wantHot, wantNAT := seededFleet(fleetClock())
	mustInsert(t, conn, f.Rows())
	r := analytics.NewReader(conn)
	ctx := context.Background()
	cfg := analytics.Config{Hot: analytics.HotConfig{MinRate: 20}}.WithDefaults()

	hotFrom := f.Now.Add(-cfg.Hot.Window).Truncate(time.Minute)
	span := f.Now.Sub(hotFrom)
	total, err := r.TotalRequests(ctx, hotFrom, f.Now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := r.KeyTraffic(ctx, hotFrom, f.Now.Add(time.Minute), cfg.Hot.Threshold(total, cfg.Hot.MinSpan), 4*cfg.Hot.MaxKeys)
	if err != nil {
		t.Fatal(err)
	}
	hot := analytics.DetectHotKeys(cfg.Hot, keys, total, span, nil)
	var gotHot []string
	for _, h := range hot {
		gotHot = append(gotHot, limiter.DirectiveKey(h.KeyKind, h.KeyID))
	}
	p, rc := precisionRecall(gotHot, wantHot)
	t.Logf("hot keys: flagged %v; precision %.2f recall %.2f (%d candidate keys)", gotHot, p, rc, len(keys))
	if p < 1 || rc < 1 {
		t.Errorf("hot keys flagged %v, want exactly %v", gotHot, wantHot)
	}
	if len(hot) == 1 {
		s := hot[0].Shares
		// Seen 3:1 and denied about half the time: gw-b's demand is half
		// of what the key was allowed, which it keeps (Shares).
		if math.Abs(s["gw-a"]-0.5) > 0.03 || math.Abs(s["gw-b"]-0.5) > 0.03 || len(s) != 2 {
			t.Errorf("hot-1 shares = %v, want about gw-a 0.5, gw-b 0.5", s)
		}
	}

	natFrom := f.Now.Add(-cfg.NAT.Window).Truncate(time.Minute)
	ips, err := r.IPTraffic(ctx, analytics.NATQuery{
		From: natFrom, To: f.Now.Add(time.Minute),
		MinRequests: cfg.NAT.MinRequests / 2, MinKeys: cfg.NAT.MinDistinctKeys / 2, MinUserAgents: cfg.NAT.MinDistinctUserAgents / 2,
		Limit: 2 * cfg.NAT.MaxIPs,
	})
	if err != nil {
		t.Fatal(err)
	}
	nats := analytics.DetectNATs(cfg.NAT, ips, nil)
	var gotNAT []string
	for _, n := range nats {
		gotNAT = append(gotNAT, n.Key)
	}
	p, rc = precisionRecall(gotNAT, wantNAT)
	t.Logf("NAT IPs: flagged %v; precision %.2f recall %.2f (%d candidates)", gotNAT, p, rc, len(ips))
	if p < 1 || rc < 1 {
		t.Errorf("NAT IPs flagged %v, want exactly %v", gotNAT, wantNAT)
	}
	for _, n := range nats {
		if n.Factor < 1 || n.Factor > cfg.NAT.MaxFactor || n.Clients < 25 {
			t.Errorf("NAT %s: factor %v for %d clients", n.Key, n.Factor, n.Clients)
		}
	}
}

func precisionRecall(got, want []string) (precision, recall float64) {
	tp := 0
	for _, g := range got {
		if slices.Contains(want, g) {
			tp++
		}
	}
	precision, recall = 1, 1
	if len(got) > 0 {
		precision = float64(tp) / float64(len(got))
	}
	if len(want) > 0 {
		recall = float64(tp) / float64(len(want))
	}
	return precision, recall
}
