package analytics_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/analytics/analyticstest"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// namedFleet is seededFleet with what the richer trends tell apart: POSTs
// on /v1/orders that cost 3, and a fail-closed outage on gw-b beside the
// fail-open one on gw-c.
func namedFleet(now time.Time) (analyticstest.Fleet, []event.Decision) {
	f, _, _ := seededFleet(now)
	f.Outages = append(f.Outages, analyticstest.Outage{Gateway: "gw-b", From: now.Add(-4 * time.Minute).Truncate(time.Minute),
		For: 2 * time.Minute, Share: 0.5, Mode: event.ModeFailClosed})
	rows := f.Rows()
	for i := range rows {
		if rows[i].Route == "/v1/orders" {
			rows[i].Method, rows[i].Cost = "POST", 3
		}
	}
	return f, rows
}

// tally is what a trend point or key count says, computed from raw rows.
type tally struct {
	Requests, Denied, RateLimited, FailClosed, Cost, CostAllowed int64
}

func (t *tally) add(d event.Decision) {
	cost := max(1, d.Cost)
	t.Requests++
	t.Cost += cost
	switch {
	case d.Allowed:
		t.CostAllowed += cost
	case d.Mode == event.ModeFailClosed:
		t.Denied++
		t.FailClosed++
	default:
		t.Denied++
		t.RateLimited++
	}
}

func pointTally(p analytics.TrendPoint) tally {
	return tally{p.Requests, p.Denied, p.RateLimited, p.FailClosed, p.Cost, p.CostAllowed}
}

func countTally(c analytics.KeyCount) tally {
	return tally{c.Requests, c.Denied, c.RateLimited, c.FailClosed, c.Cost, c.CostAllowed}
}

// TestNamesAndRicherTrends checks, on seeded rows, that keys carry their
// names, that trends count cost and tell 429s from 503s under every filter
// at once, and that buckets align in the asked time zone.
func TestNamesAndRicherTrends(t *testing.T) {
	conn := mustDatabase(t)
	f, rows := namedFleet(fleetClock())
	mustInsert(t, conn, rows)
	r := analytics.NewReader(conn)
	ctx := context.Background()
	from, to := f.Now.Add(-f.Window).Truncate(time.Minute), f.Now.Add(time.Minute)

	t.Run("every filter at once", func(t *testing.T) {
		rg := analytics.Range{From: from, To: to, Plan: "free", Route: "/v1/orders", Rule: "per_minute", Gateway: "gw-b",
			KeyKind: "api_key", Method: "POST"}
		var want tally
		for _, d := range rows {
			if d.Plan == rg.Plan && d.Route == rg.Route && d.BindingRule == rg.Rule && d.GatewayID == rg.Gateway && d.Method == rg.Method {
				want.add(d)
			}
		}
		if want.Requests == 0 || want.RateLimited == 0 {
			t.Fatalf("seed has no rows for %+v: %+v", rg, want)
		}
		got, err := r.Trends(ctx, analytics.TrendQuery{Range: rg, Bucket: analytics.BucketHour})
		if err != nil {
			t.Fatal(err)
		}
		var sum tally
		for _, p := range got {
			pt := pointTally(p)
			sum = tally{sum.Requests + pt.Requests, sum.Denied + pt.Denied, sum.RateLimited + pt.RateLimited,
				sum.FailClosed + pt.FailClosed, sum.Cost + pt.Cost, sum.CostAllowed + pt.CostAllowed}
		}
		if sum != want {
			t.Errorf("Trends(%+v) sum to %+v, want %+v", rg, sum, want)
		}
	})

	t.Run("rate-limited and fail-closed by gateway", func(t *testing.T) {
		want := map[string]tally{}
		for _, d := range rows {
			w := want[d.GatewayID]
			w.add(d)
			want[d.GatewayID] = w
		}
		if want["gw-b"].FailClosed == 0 || want["gw-c"].FailClosed != 0 {
			t.Fatalf("seed: fail-closed by gateway %+v, want some on gw-b only", want)
		}
		got, err := r.Trends(ctx, analytics.TrendQuery{Range: analytics.Range{From: from, To: to}, Bucket: analytics.Bucket5m,
			By: analytics.DimGateway})
		if err != nil {
			t.Fatal(err)
		}
		sums := map[string]tally{}
		for _, p := range got {
			if p.Bucket.Minute()%5 != 0 || p.Bucket.Second() != 0 {
				t.Errorf("5m bucket %v not on a 5-minute boundary", p.Bucket)
			}
			if p.Denied != p.RateLimited+p.FailClosed {
				t.Errorf("point %+v: denied is not rate-limited + fail-closed", p)
			}
			s, pt := sums[p.Series], pointTally(p)
			sums[p.Series] = tally{s.Requests + pt.Requests, s.Denied + pt.Denied, s.RateLimited + pt.RateLimited,
				s.FailClosed + pt.FailClosed, s.Cost + pt.Cost, s.CostAllowed + pt.CostAllowed}
		}
		if diff := cmp.Diff(want, sums); diff != "" {
			t.Errorf("Trends by gateway (-want +got):\n%s", diff)
		}
	})

	t.Run("buckets in a time zone", func(t *testing.T) {
		for _, tt := range []struct {
			bucket, tz string
			aligned    func(time.Time) bool
		}{
			{"15m", "Asia/Kathmandu", func(b time.Time) bool { return b.Minute()%15 == 0 }},
			{"1h", "Asia/Kolkata", func(b time.Time) bool { return b.Minute() == 0 && b.UTC().Minute() == 30 }},
			{"1d", "America/New_York", func(b time.Time) bool { return b.Hour() == 0 && b.Minute() == 0 && b.UTC().Hour() != 0 }},
		} {
			got, err := r.Trends(ctx, analytics.TrendQuery{Range: analytics.Range{From: from, To: to}, Bucket: tt.bucket, TZ: tt.tz})
			if err != nil {
				t.Fatalf("%s in %s: %v", tt.bucket, tt.tz, err)
			}
			var n int64
			for _, p := range got {
				if p.Bucket.Location().String() != tt.tz || !tt.aligned(p.Bucket) {
					t.Errorf("%s bucket in %s = %v, not aligned there", tt.bucket, tt.tz, p.Bucket)
				}
				n += p.Requests
			}
			if n != int64(len(rows)) || len(got) == 0 {
				t.Errorf("%s buckets in %s hold %d requests in %d points, want all %d", tt.bucket, tt.tz, n, len(got), len(rows))
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		rg := analytics.Range{From: from, To: to}
		for _, q := range []analytics.TrendQuery{
			{Range: rg, Bucket: "7m"},
			{Range: rg, Bucket: "hour", TZ: "Mars/Olympus"},
			{Range: rg, Bucket: "hour", TZ: "Local"},
			{Range: rg, Bucket: "hour", By: "ip"},
			{Range: analytics.Range{From: from, To: to, KeyKind: "robot"}, Bucket: "hour"},
			{Range: analytics.Range{From: from, To: to, Method: strings.Repeat("G", 2000)}, Bucket: "hour"},
			{Range: analytics.Range{From: from, To: from.Add(400 * 24 * time.Hour)}, Bucket: "1m"},
		} {
			if _, err := r.Trends(ctx, q); !errors.Is(err, analytics.ErrBadQuery) {
				t.Errorf("Trends(bucket %q tz %q by %q kind %q) = %v, want ErrBadQuery", q.Bucket, q.TZ, q.By, q.KeyKind, err)
			}
		}
	})

	t.Run("names in top keys, hot keys and trends", func(t *testing.T) {
		top, err := r.TopKeys(ctx, analytics.Range{From: from, To: to}, 3)
		if err != nil {
			t.Fatal(err)
		}
		var want tally
		for _, d := range rows {
			if d.KeyID == "hot-1" {
				want.add(d)
			}
		}
		k := top[0]
		if k.KeyID != "hot-1" || k.KeyName != "acme" || top[1].KeyName != "" {
			t.Fatalf("TopKeys = %+v, want hot-1 named acme first, then unnamed keys", top)
		}
		if got := (tally{k.Requests, k.Denied, k.RateLimited, k.FailClosed, k.Cost, k.CostAllowed}); got != want {
			t.Errorf("TopKeys hot-1 = %+v, want %+v", got, want)
		}
		byName, err := r.TopKeys(ctx, analytics.Range{From: from, To: to, KeyID: "acme"}, 3)
		if err != nil || len(byName) != 1 || byName[0].KeyID != "hot-1" {
			t.Errorf("TopKeys(key acme) = %+v, %v; want hot-1 alone", byName, err)
		}
		hot, err := r.HotKeys(ctx, analytics.Config{}.WithDefaults().Hot, f.Now.Add(-time.Minute), f.Now, 0, nil)
		if err != nil || len(hot) != 1 || hot[0].KeyName != "acme" {
			t.Errorf("HotKeys = %+v, %v; want hot-1 named acme", hot, err)
		}
	})

	t.Run("key report by name and by id", func(t *testing.T) {
		var want tally
		rules, routes, gateways := map[string]tally{}, map[string]tally{}, map[string]tally{}
		for _, d := range rows {
			if d.KeyID != "hot-1" {
				continue
			}
			want.add(d)
			for m, v := range map[*map[string]tally]string{&rules: d.BindingRule, &routes: d.Route, &gateways: d.GatewayID} {
				t := (*m)[v]
				t.add(d)
				(*m)[v] = t
			}
		}
		for _, key := range []string{"acme", "hot-1"} {
			rep, err := r.KeyReport(ctx, analytics.Range{From: from, To: to}, key, "1m", "Europe/Berlin")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]analytics.KeyIdentity{{KeyID: "hot-1", KeyKind: "api_key", KeyName: "acme"}}, rep.Keys); diff != "" {
				t.Errorf("KeyReport(%s).Keys (-want +got):\n%s", key, diff)
			}
			if got := countTally(rep.Total); got != want {
				t.Errorf("KeyReport(%s).Total = %+v, want %+v", key, got, want)
			}
			for name, pair := range map[string]struct {
				got  []analytics.KeyCount
				want map[string]tally
			}{"rules": {rep.Rules, rules}, "routes": {rep.Routes, routes}, "gateways": {rep.Gateways, gateways}} {
				got := map[string]tally{}
				for _, c := range pair.got {
					got[c.Name] = countTally(c)
				}
				if diff := cmp.Diff(pair.want, got); diff != "" {
					t.Errorf("KeyReport(%s).%s (-want +got):\n%s", key, name, diff)
				}
			}
			var n int64
			for _, p := range rep.History {
				n += p.Requests
			}
			if n != want.Requests || rep.TZ != "Europe/Berlin" || rep.Bucket != analytics.BucketMinute {
				t.Errorf("KeyReport(%s) history holds %d requests (bucket %s, tz %s), want %d per minute in Europe/Berlin", key, n, rep.Bucket, rep.TZ, want.Requests)
			}
		}
		rep, err := r.KeyReport(ctx, analytics.Range{From: from, To: to}, "nobody", "auto", "")
		if err != nil || len(rep.Keys) != 0 || rep.Total.Requests != 0 {
			t.Errorf("KeyReport(nobody) = %+v, %v; want an empty report", rep, err)
		}
		if _, err := r.KeyReport(ctx, analytics.Range{From: from, To: to}, "", "auto", ""); !errors.Is(err, analytics.ErrBadQuery) {
			t.Errorf("KeyReport(\"\") = %v, want ErrBadQuery", err)
		}
	})
}

// namedAPI serves the API over namedFleet, with a detector whose directive
// store is the real Redis, holding a split of hot-1.
func namedAPI(t *testing.T) (*httptest.Server, []event.Decision) {
	t.Helper()
	conn := mustDatabase(t)
	now := fleetClock()
	_, rows := namedFleet(now)
	mustInsert(t, conn, rows)
	rdb, prefix := mustRedis(t)
	store := limiter.NewDirectiveStore(rdb, prefix)
	reader := analytics.NewReader(conn)
	det, err := analytics.NewDetector(analytics.Config{Hot: analytics.HotConfig{MinRate: 20}}, analytics.Deps{
		Reader: reader, Directives: store, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep := det.RunOnce(context.Background()); len(rep.Errors) > 0 || !rep.SplitsWritten {
		t.Fatalf("detector run = %+v, want a split written", rep)
	}
	api, err := analytics.NewAPI(reader, det, testToken, func() time.Time { return now }, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return srv, rows
}

func TestAPIKeyPageAndCSV(t *testing.T) {
	srv, rows := namedAPI(t)
	c := srv.Client()

	resp, body := get(t, c, srv.URL+"/api/keys/acme?from=-15m&to=now", testToken)
	var rep analytics.KeyReport
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &rep) != nil {
		t.Fatalf("GET /api/keys/acme = %d %s", resp.StatusCode, body)
	}
	var n int64
	for _, d := range rows {
		if d.KeyID == "hot-1" {
			n++
		}
	}
	if rep.Total.Requests != n || len(rep.Keys) != 1 || rep.Keys[0].KeyID != "hot-1" {
		t.Errorf("key page = %+v keys, %d requests; want hot-1 with %d", rep.Keys, rep.Total.Requests, n)
	}
	if rep.Directives != "redis" || len(rep.Splits) != 1 || rep.Splits[0].Key != limiter.DirectiveKey("api_key", "hot-1") {
		t.Errorf("key page directives = %q %+v, want hot-1's split from Redis", rep.Directives, rep.Splits)
	}

	resp, body = get(t, c, srv.URL+"/api/trends?from=-15m&to=now&by=gateway&bucket=15m&tz=Asia/Kolkata&method=POST&format=csv", testToken)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") ||
		!strings.Contains(resp.Header.Get("Content-Disposition"), "attachment") {
		t.Fatalf("trends CSV = %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	recs, err := csv.NewReader(strings.NewReader(string(body))).ReadAll()
	if err != nil || len(recs) < 2 {
		t.Fatalf("trends CSV: %v, %d records\n%s", err, len(recs), body)
	}
	if diff := cmp.Diff(analytics.TrendHeader("gateway"), recs[0]); diff != "" {
		t.Errorf("CSV header (-want +got):\n%s", diff)
	}
	var posts int64
	for _, d := range rows {
		if d.Method == "POST" {
			posts++
		}
	}
	var sum int64
	for _, rec := range recs[1:] {
		if !strings.HasSuffix(rec[0], "+05:30") {
			t.Errorf("CSV bucket %q not in Asia/Kolkata", rec[0])
		}
		v, _ := strconv.ParseInt(rec[2], 10, 64)
		sum += v
	}
	if sum != posts {
		t.Errorf("CSV requests sum to %d, want the %d POSTs", sum, posts)
	}

	// Signing in leads back to a key's page, and nowhere else.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for next, want := range map[string]string{"%2Fkeys%2Facme": "/keys/acme", "%2F%2Fevil.example%2F": "/",
		"https%3A%2F%2Fevil.example": "/", "%2Fapi%2Falerts": "/", "": "/"} {
		resp, err := noFollow.PostForm(srv.URL+"/login?next="+next, url.Values{"token": {testToken}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || got != want {
			t.Errorf("sign in with next=%s: %d to %q, want 303 to %q", next, resp.StatusCode, got, want)
		}
	}

	for _, q := range []string{"tz=Nowhere/Atall", "bucket=7m", "kind=robot", "format=xml", "by=colour"} {
		resp, body := get(t, c, srv.URL+"/api/trends?"+q, testToken)
		if p := wantProblem(t, "trends?"+q, resp, body, http.StatusBadRequest, "urn:edgelimit:problem:bad-query"); p.Detail == "" {
			t.Errorf("trends?%s: 400 without a detail", q)
		}
	}
}

// TestKeyPageInChromium signs in from a key's page link, as an analyst
// following one would, and reads the rendered page: the key's name, ids,
// totals, denials by rule and route, gateways, its split and its history.
func TestKeyPageInChromium(t *testing.T) {
	chromium := testenv.Chromium(t)
	srv, _ := namedAPI(t)
	// The login page of /keys/acme carries next=/keys/acme; the form here
	// posts what it would.
	resp, body := get(t, srv.Client(), srv.URL+"/keys/acme", "")
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `action="/login?next=%2Fkeys%2Facme"`) {
		t.Fatalf("GET /keys/acme signed out = %d\n%s\nwant the sign-in page leading back", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dom := readyDOM(t, ctx, chromium, signInPage(t, srv.URL+"/login?next=%2Fkeys%2Facme"))
	for _, want := range []string{`<h2 id="key-title">acme</h2>`, "<td>hot-1</td>", "<td>per_minute</td>", "<td>/v1/orders</td>",
		"<td>gw-a</td>", "<td>gw-b</td>"} {
		if !strings.Contains(dom, want) {
			t.Errorf("key page lacks %s", want)
		}
	}
	// The split the detector wrote to Redis: demand 3:1 with half denied,
	// so each gateway asks at least an equal part of what was allowed.
	if !regexp.MustCompile(`<table id="key-splits">.*<td>[^<]*gw-a 4\d%, gw-b 4\d%</td>`).MatchString(dom) {
		t.Errorf("key page lacks the split of hot-1:\n%s", regexp.MustCompile(`(?s)<table id="key-splits".*?</table>`).FindString(dom))
	}
	for _, chart := range []string{"chart-key-history", "chart-key-cost"} {
		m := regexp.MustCompile(`<svg id="` + chart + `"[^>]*data-points="(\d+)"`).FindStringSubmatch(dom)
		if n, _ := strconv.Atoi(m[1]); m == nil || n == 0 {
			t.Errorf("%s rendered no points", chart)
		}
	}
	// And the dashboard's CSV link carries every filter set in the page.
	dom = readyDOM(t, ctx, chromium, signInPage(t, srv.URL+"/login"))
	if !regexp.MustCompile(`<a id="csv" href="/api/trends\?[^"]*format=csv"`).MatchString(dom) {
		t.Errorf("dashboard has no CSV link for its trend")
	}
}

// readyDOM is dumpDOM of a page that must reach data-state="ready".
func readyDOM(t *testing.T, ctx context.Context, chromium, page string) string {
	t.Helper()
	dom := dumpDOM(t, ctx, chromium, page)
	if !strings.Contains(dom, `data-state="ready"`) {
		t.Fatalf("page did not reach ready:\n%.3000s", dom)
	}
	return dom
}

// TestAPIKeyPageNAT: an IP key's page shows the NAT directive in force for
// its address, which directives name by address and decisions by the
// address's keyed hash; another IP key's page shows none.
func TestAPIKeyPageNAT(t *testing.T) {
	conn := mustDatabase(t)
	now := fleetClock()
	var rows []event.Decision
	for i, k := range []struct{ id, ip string }{{"ip-nat", "198.51.100.7"}, {"ip-plain", "192.0.2.1"}, {"ip-v6", "2001:db8:aa:1::5"}} {
		for j := range 5 {
			rows = append(rows, event.Decision{Time: now.Add(-time.Duration(i*5+j) * time.Second), GatewayID: "gw-a",
				KeyID: k.id, KeyKind: event.KindIP, ClientIP: k.ip, Route: "/v1/orders", Method: "GET", Plan: "anonymous",
				BindingRule: "per_minute", Allowed: true, Limit: 100, Remaining: 50, Cost: 1, StoreStatus: event.StoreOK, Mode: event.ModeEnforced})
		}
	}
	mustInsert(t, conn, rows)
	rdb, prefix := mustRedis(t)
	store := limiter.NewDirectiveStore(rdb, prefix)
	var nats []limiter.NATDirective
	for _, ip := range []string{"198.51.100.7", "2001:db8:aa:1::9"} { // the v6 one: another address of the same /64
		k, _ := limiter.IPKey(ip)
		nats = append(nats, limiter.NATDirective{Key: k, Factor: 4, Clients: 25, Expires: time.Now().Add(time.Hour).UTC().Truncate(time.Second)})
	}
	if err := store.WriteNATs(context.Background(), nats); err != nil {
		t.Fatal(err)
	}
	reader := analytics.NewReader(conn)
	det, err := analytics.NewDetector(analytics.Config{}, analytics.Deps{Reader: reader, Directives: store, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	api, err := analytics.NewAPI(reader, det, testToken, func() time.Time { return now }, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	for key, want := range map[string][]limiter.NATDirective{"ip-nat": nats[:1], "ip-v6": nats[1:], "ip-plain": {}} {
		resp, body := get(t, srv.Client(), srv.URL+"/api/keys/"+key+"?from=-15m&to=now", testToken)
		var rep analytics.KeyReport
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &rep) != nil {
			t.Fatalf("GET /api/keys/%s = %d %s", key, resp.StatusCode, body)
		}
		if rep.Directives != "redis" || !cmp.Equal(rep.NATs, want) {
			t.Errorf("key page of %s: directives %q, NATs %+v; want %+v", key, rep.Directives, rep.NATs, want)
		}
	}
}

// TestHotKeysLeaveDoorCallersOut: a caller of the Envoy door is never hot:
// its descriptors' buckets are never split by the gateways, so a split
// written for it would be reported and do nothing.
func TestHotKeysLeaveDoorCallersOut(t *testing.T) {
	now := fleetClock() // the hot window holds whole minutes of the fleet
	f, _, _ := seededFleet(now)
	f.Hot = append(f.Hot, analyticstest.HotKey{KeyID: "door-1", Rate: 60, For: 90 * time.Second})
	rows := f.Rows()
	for i := range rows {
		if rows[i].KeyID == "door-1" {
			rows[i].KeyKind, rows[i].Route, rows[i].Method = event.KindUnknown, "envoy:ai", "ShouldRateLimit"
		}
	}
	conn := mustDatabase(t)
	mustInsert(t, conn, rows)
	hot, err := analytics.NewReader(conn).HotKeys(context.Background(), analytics.Config{}.WithDefaults().Hot, now.Add(-time.Minute), now, 0, nil)
	if err != nil || len(hot) != 1 || hot[0].KeyID != "hot-1" {
		t.Errorf("HotKeys = %+v, %v; want hot-1 alone (door-1 came through the Envoy door)", hot, err)
	}
}
