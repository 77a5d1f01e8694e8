package analytics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestUsageStatement: a month's statement in New York, whose 1 November
// 2026 is 25 hours long (DST ends): decisions are counted in the month and
// on the day of the zone, not of UTC; each figure to the unit, requests
// equal to allowed plus denied; a key asked for that used nothing gets
// zeros, one that never existed an error; completeness follows the data.
func TestUsageStatement(t *testing.T) {
	conn := mustDatabase(t)
	ctx := context.Background()
	at := func(s string) time.Time { return mustTime(t, s) }
	acme := func(when, route string, cost int64, allowed bool) event.Decision {
		return event.Decision{Time: at(when), GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey,
			Route: route, Plan: "pro", Cost: cost, Allowed: allowed, BindingRule: "month"}
	}
	ip := func(when string) event.Decision {
		return event.Decision{Time: at(when), GatewayID: "gw-2", KeyID: "k-ip", KeyKind: event.KindIP, Route: "/a", Plan: "anon", Allowed: true, BindingRule: "minute"}
	}
	mustInsert(t, conn, []event.Decision{
		acme("2026-11-01T03:30:00Z", "/a", 7, true),  // 31 Oct 23:30 EDT: October in New York
		acme("2026-11-01T04:30:00Z", "/a", 1, true),  // 1 Nov 00:30 EDT
		acme("2026-11-02T04:30:00Z", "/b", 5, true),  // 1 Nov 23:30 EST: still the 1st, its 25th hour
		acme("2026-11-02T05:30:00Z", "/b", 5, false), // 2 Nov 00:30 EST
		acme("2026-12-01T04:59:00Z", "/a", 2, true),  // 30 Nov 23:59 EST
		acme("2026-12-01T05:00:00Z", "/a", 3, true),  // 1 Dec 00:00 EST: December
		ip("2026-11-15T12:00:00Z"),
		{Time: at("2026-10-02T12:00:00Z"), GatewayID: "gw-1", KeyID: "k-idle", KeyKind: event.KindUser, Route: "/a", Plan: "pro", Allowed: true},
	})
	r := analytics.NewReader(conn)
	ny, _ := time.LoadLocation("America/New_York")
	from, to, err := analytics.UsagePeriod("2026-11", "", "", ny, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	st, err := r.Usage(ctx, analytics.UsageQuery{From: from, To: to, TZ: "America/New_York", By: []string{"day", "key"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range st.Rows {
		got = append(got, fmt.Sprintf("%s %s %s %d=%d+%d cost %d/%d", u.KeyID, u.KeyName, u.Day, u.Requests, u.Allowed, u.Denied, u.AllowedCost, u.DeniedCost))
	}
	want := []string{
		"k-acme acme 2026-11-01 2=2+0 cost 6/0",
		"k-acme acme 2026-11-02 1=0+1 cost 0/5",
		"k-acme acme 2026-11-30 1=1+0 cost 2/0",
		"k-ip  2026-11-15 1=1+0 cost 1/0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("November in New York by key and day:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if tot := st.Total; tot.Requests != 5 || tot.Allowed != 4 || tot.Denied != 1 || tot.AllowedCost != 9 || tot.DeniedCost != 5 {
		t.Errorf("total %+v, want 5 requests = 4 allowed + 1 denied, cost 9 allowed, 5 denied", tot)
	}
	if !st.Complete || st.DataThrough.Before(to) {
		t.Errorf("complete %v, data through %v: a decision at the month's end is stored", st.Complete, st.DataThrough)
	}

	// By route, for one key by its name and one idle key by its id.
	st, err = r.Usage(ctx, analytics.UsageQuery{From: from, To: to, TZ: "America/New_York", Keys: []string{"acme", "k-idle"}, By: []string{"key", "route"}})
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, u := range st.Rows {
		got = append(got, strings.Join(u.Record(st.By), ","))
	}
	want = []string{
		"k-acme,acme,api_key,/a,2,2,0,3,0,0",
		"k-acme,acme,api_key,/b,2,1,1,5,5,0",
		"k-idle,,user,,0,0,0,0,0,0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("acme and an idle key by route:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if h := strings.Join(analytics.UsageHeader(st.By), ","); h != "key_id,key_name,key_kind,route,requests,allowed,denied,allowed_cost,denied_cost,without_store" {
		t.Errorf("header %s", h)
	}

	// A period past the newest data is not complete.
	st, err = r.Usage(ctx, analytics.UsageQuery{From: from, To: time.Now().Add(time.Hour), TZ: "UTC"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Complete || st.Incomplete == "" {
		t.Errorf("a period ending in the future: complete %v (%q), want incomplete, saying why", st.Complete, st.Incomplete)
	}

	for _, tc := range []struct {
		name string
		q    analytics.UsageQuery
		want string
	}{
		{"unknown key", analytics.UsageQuery{From: from, To: to, Keys: []string{"acme", "nobody"}}, `no key "nobody"`},
		{"from after to", analytics.UsageQuery{From: to, To: from}, "not before"},
		{"unknown by", analytics.UsageQuery{From: from, To: to, By: []string{"gateway"}}, `by "gateway"`},
		{"unknown zone", analytics.UsageQuery{From: from, To: to, TZ: "Mars/Olympus"}, "time zone"},
	} {
		if _, err := r.Usage(ctx, tc.q); !errors.Is(err, analytics.ErrBadQuery) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrBadQuery saying %q", tc.name, err, tc.want)
		}
	}
}

// TestUsageNamesGatewayDrops: the gateways' accounting records (running
// totals) give each run's drops in the period, from its last report before
// to its first after, a record stored twice changing nothing; a statement
// with drops, or with a run that has not reported past the end, is
// incomplete and says so; runs that stopped before the period are not in
// it; one without drops, every run settled, is complete.
func TestUsageNamesGatewayDrops(t *testing.T) {
	conn := mustDatabase(t)
	ctx := context.Background()
	utc := func(s string) time.Time { return mustTime(t, s) }
	mustInsert(t, conn, []event.Decision{
		{Time: utc("2026-11-10T12:00:00Z"), GatewayID: "gw-1", KeyID: "k1", Route: "/a", Plan: "pro", Allowed: true, Cost: 1},
		{Time: utc("2026-12-01T06:00:00Z"), GatewayID: "gw-1", KeyID: "k1", Route: "/a", Plan: "pro", Allowed: true, Cost: 1},
		{Time: utc("2027-01-01T06:00:00Z"), GatewayID: "gw-1", KeyID: "k1", Route: "/a", Plan: "pro", Allowed: true, Cost: 1},
	})
	mustReport(t, conn, []report{
		{"gw-1", "2026-10-30T00:00:00Z", "2026-10-31T12:00:00Z", 100, 95, 5, 0, false},
		{"gw-1", "2026-10-30T00:00:00Z", "2026-11-15T12:00:00Z", 500, 488, 5, 7, false},
		{"gw-1", "2026-10-30T00:00:00Z", "2026-11-15T12:00:00Z", 500, 488, 5, 7, false}, // stored twice
		{"gw-1", "2026-10-30T00:00:00Z", "2026-12-01T00:00:05Z", 900, 880, 10, 10, false},
		{"gw-1", "2026-10-30T00:00:00Z", "2026-12-02T00:00:00Z", 990, 960, 20, 10, false},
		{"gw-2", "2026-11-10T00:00:00Z", "2026-11-10T00:00:05Z", 10, 10, 0, 0, false},
		{"gw-2", "2026-11-10T00:00:00Z", "2026-11-20T00:00:00Z", 60, 57, 0, 3, true},
		{"gw-3", "2026-11-29T00:00:00Z", "2026-11-29T00:00:05Z", 40, 40, 0, 0, false},
		{"gw-4", "2026-10-01T00:00:00Z", "2026-10-02T00:00:00Z", 40, 30, 10, 0, false},
		{"gw-5", "2026-12-05T00:00:00Z", "2026-12-05T00:00:05Z", 1, 1, 0, 0, false},
		{"gw-5", "2026-12-05T00:00:00Z", "2027-01-01T00:00:05Z", 9, 9, 0, 0, false},
	})
	rd := analytics.NewReader(conn)
	from, to := utc("2026-11-01T00:00:00Z"), utc("2026-12-01T00:00:00Z")
	st, err := rd.Usage(ctx, analytics.UsageQuery{From: from, To: to})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range st.Gateways {
		got = append(got, fmt.Sprintf("%s %s %d/%d dropped %d %v settled %v", g.GatewayID, g.RunStart.Format(time.DateOnly),
			g.Decisions, g.Published, g.Dropped, g.DroppedBy, g.Settled))
	}
	want := []string{
		"gw-1 2026-10-30 800/785 dropped 15 map[broker_error:10 buffer_full:5] settled true",
		"gw-2 2026-11-10 60/57 dropped 3 map[broker_error:3] settled true",
		"gw-3 2026-11-29 40/40 dropped 0 map[] settled false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("November's gateway runs:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st.Dropped != 18 || st.Complete || !strings.Contains(st.Incomplete, "dropped 18 decision events") || !strings.Contains(st.Incomplete, "gw-3") {
		t.Errorf("dropped %d, complete %v (%q); want 18 dropped, incomplete naming them and gw-3", st.Dropped, st.Complete, st.Incomplete)
	}

	// From 3 December gw-1's run is gone (its last report on the 2nd) and
	// gw-5's dropped nothing and reported past the end.
	st, err = rd.Usage(ctx, analytics.UsageQuery{From: utc("2026-12-03T00:00:00Z"), To: utc("2027-01-01T00:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Complete || st.Dropped != 0 || len(st.Gateways) != 1 || st.Gateways[0].GatewayID != "gw-5" || st.Gateways[0].Decisions != 9 {
		t.Errorf("December: complete %v (%q), dropped %d, gateways %+v; want complete, gw-5 alone, 9 decisions, no drops", st.Complete, st.Incomplete, st.Dropped, st.Gateways)
	}
}

// TestUsageSequenceGaps: per key, the decisions the store numbered in the
// period beside those stored: a hole in a sequence is a missing decision,
// a sequence begun in the period counts from 1, one begun before from its
// first stored number, and unnumbered decisions (the deny cache's) count
// in neither; a missing decision makes the statement incomplete.
func TestUsageSequenceGaps(t *testing.T) {
	conn := mustDatabase(t)
	ctx := context.Background()
	from, to := mustTime(t, "2026-11-01T00:00:00Z"), mustTime(t, "2026-12-01T00:00:00Z")
	in, before := mustTime(t, "2026-11-10T09:00:00Z"), mustTime(t, "2026-10-31T23:00:00Z")
	d := func(key string, seq int64, epoch, at time.Time) event.Decision {
		return event.Decision{Time: at, GatewayID: "gw-1", KeyID: key, Route: "/a", Plan: "pro", Allowed: true, Cost: 1, Seq: seq, SeqEpoch: epoch}
	}
	var ds []event.Decision
	for _, n := range []int64{2, 3, 5, 6} { // 1 and 4 lost
		ds = append(ds, d("k1", n, in, in.Add(time.Duration(n)*time.Second)))
	}
	ds = append(ds, d("k1", 0, time.Time{}, in.Add(time.Minute))) // a cached denial
	ds = append(ds, d("k2", 9, before, before.Add(time.Second)))  // before the period
	for _, n := range []int64{10, 11, 13} {                       // 12 lost
		ds = append(ds, d("k2", n, before, in.Add(time.Duration(n)*time.Second)))
	}
	ds = append(ds, d("k2", 1, in.Add(time.Hour), in.Add(time.Hour))) // a new epoch
	ds = append(ds, d("k3", 1, in, to.Add(time.Hour)))                // after the period
	mustInsert(t, conn, ds)

	st, err := analytics.NewReader(conn).Usage(ctx, analytics.UsageQuery{From: from, To: to})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range st.Sequences {
		got = append(got, fmt.Sprintf("%s %d=%d+%d (%d unnumbered)", s.KeyID, s.Decided, s.Stored, s.Missing, s.Unnumbered))
	}
	if want := []string{"k1 6=4+2 (1 unnumbered)", "k2 5=4+1 (0 unnumbered)"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("sequences %v, want %v", got, want)
	}
	if st.Missing != 3 || st.Complete || !strings.Contains(st.Incomplete, "numbered 3 decisions of the period that are not stored (k1 2, k2 1)") {
		t.Errorf("missing %d, complete %v (%q); want 3, incomplete, naming k1 and k2", st.Missing, st.Complete, st.Incomplete)
	}
	st, err = analytics.NewReader(conn).Usage(ctx, analytics.UsageQuery{From: from, To: to, Keys: []string{"k2"}})
	if err != nil || len(st.Sequences) != 1 || st.Missing != 1 {
		t.Errorf("k2 alone: %+v, %d missing, %v; want its sequence, 1 missing", st.Sequences, st.Missing, err)
	}
}

// TestUsagePeriod: a month is the zone's, a date its midnight; a month
// that does not exist, or one beside from and to, is refused.
func TestUsagePeriod(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	from, to, err := analytics.UsagePeriod("2026-03", "", "", ny, now)
	if err != nil || from.UTC().Format(time.RFC3339) != "2026-03-01T05:00:00Z" || to.UTC().Format(time.RFC3339) != "2026-04-01T04:00:00Z" {
		t.Errorf("March 2026 in New York = %v .. %v, %v; want 05:00Z .. 04:00Z (DST begins in it)", from.UTC(), to.UTC(), err)
	}
	from, to, err = analytics.UsagePeriod("", "2026-11-01", "", ny, now)
	if err != nil || from.UTC().Format(time.RFC3339) != "2026-11-01T04:00:00Z" || !to.Equal(now) {
		t.Errorf("from 2026-11-01 = %v .. %v, %v; want New York's midnight .. now", from.UTC(), to, err)
	}
	for _, bad := range [][3]string{{"2026-13", "", ""}, {"2026-11", "2026-11-01", ""}, {"", "", ""}, {"", "yesterday", ""}} {
		if _, _, err := analytics.UsagePeriod(bad[0], bad[1], bad[2], ny, now); !errors.Is(err, analytics.ErrBadQuery) {
			t.Errorf("UsagePeriod(%q, %q, %q) = %v, want ErrBadQuery", bad[0], bad[1], bad[2], err)
		}
	}
}

// TestUsageAPI: GET /api/v1/usage (and /api/usage) answers the statement
// as JSON, its rows as CSV (?format=csv or Accept: text/csv), behind the
// token; bad input is a 400 problem that says what is wrong.
func TestUsageAPI(t *testing.T) {
	conn := mustDatabase(t)
	day := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	mustInsert(t, conn, []event.Decision{
		{Time: day, GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Cost: 3, Allowed: true},
		{Time: day, GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Cost: 3, Allowed: false},
		{Time: day.AddDate(0, 1, 0), GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Allowed: true},
	})
	_, srv, c := serveAPI(t, analytics.NewReader(conn), nil)
	const q = "?month=2026-11&tz=Europe/Berlin&key=acme&by=key,plan"
	for _, path := range []string{"/api/v1/usage", "/api/usage"} {
		resp, body := get(t, c, srv.URL+path+q, testToken)
		var st analytics.UsageStatement
		if err := json.Unmarshal(body, &st); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s (%v)", path, resp.StatusCode, body, err)
		}
		if len(st.Rows) != 1 || st.Rows[0].KeyName != "acme" || st.Rows[0].Plan != "pro" || st.Rows[0].Requests != 2 ||
			st.Rows[0].AllowedCost != 3 || st.Rows[0].DeniedCost != 3 || !st.Complete || st.TZ != "Europe/Berlin" {
			t.Errorf("GET %s = %s, want acme's one row: 2 requests, cost 3 allowed and 3 denied, complete", path, body)
		}
	}
	want := "key_id,key_name,key_kind,plan,requests,allowed,denied,allowed_cost,denied_cost,without_store\nk-acme,acme,api_key,pro,2,1,1,3,3,0\n"
	resp, body := get(t, c, srv.URL+"/api/v1/usage"+q+"&format=csv", testToken)
	if string(body) != want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") {
		t.Errorf("?format=csv = %s %q, want %q", resp.Header.Get("Content-Type"), body, want)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/usage"+q, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Accept", "text/csv")
	if _, body := send(t, c, req); string(body) != want {
		t.Errorf("Accept: text/csv = %q, want %q", body, want)
	}
	resp, body = get(t, c, srv.URL+"/api/v1/usage"+q, "")
	wantProblem(t, "GET /api/v1/usage without the token", resp, body, http.StatusUnauthorized, "urn:edgelimit:problem:unauthorized")
	for give, says := range map[string]string{
		"?month=2026-13":                 "2026-13",
		"?month=2026-11&tz=Nowhere/Zone": "time zone",
		"?from=2026-11-02&to=2026-11-01": "not before",
		"?month=2026-11&by=gateway":      `by "gateway"`,
		"?month=2026-11&key=nobody":      `no key "nobody"`,
		"?month=2026-11&limit=5":         `unknown parameter "limit"`,
	} {
		resp, body := get(t, c, srv.URL+"/api/v1/usage"+give, testToken)
		if p := wantProblem(t, "GET /api/v1/usage"+give, resp, body, http.StatusBadRequest, "urn:edgelimit:problem:bad-query"); !strings.Contains(p.Detail, says) {
			t.Errorf("GET /api/v1/usage%s: %q, want it to say %q", give, p.Detail, says)
		}
	}
}

// TestUsagePageInChromium: the dashboard's usage page, reached by signing
// in from a link to it, shows the month's statement (complete, acme's
// rows and the total), and Chromium, in the page's session, downloads the
// CSV its link points at: the statement's rows.
func TestUsagePageInChromium(t *testing.T) {
	chromium := testenv.Chromium(t)
	conn := mustDatabase(t)
	day := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	mustInsert(t, conn, []event.Decision{
		{Time: day, GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/v1/export", Plan: "pro", Cost: 10, Allowed: true},
		{Time: day, GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/v1/orders", Plan: "pro", Cost: 1, Allowed: true},
		{Time: day, GatewayID: "gw-2", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/v1/orders", Plan: "pro", Cost: 1, Allowed: false},
		{Time: day.AddDate(0, 1, 0), GatewayID: "gw-1", KeyID: "k-globex", KeyName: "globex", KeyKind: event.KindAPIKey, Route: "/v1/orders", Plan: "pro", Allowed: true},
	})
	mustReport(t, conn, []report{
		{"gw-1", "2026-10-20T08:00:00Z", "2026-11-10T12:00:00Z", 40, 40, 0, 0, false},
		{"gw-1", "2026-10-20T08:00:00Z", "2026-12-10T12:00:00Z", 90, 90, 0, 0, false},
	})
	_, srv, _ := serveAPI(t, analytics.NewReader(conn), nil)
	// download=csv: the page downloads its CSV once it shows the statement.
	page := "/usage?month=2026-11&tz=America%2FNew_York&key=acme&by=key,route&download=csv"
	signIn := signInPage(t, srv.URL+"/login?next="+url.QueryEscape(page))
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(), "--window-size=1400,1000",
		"--virtual-time-budget=20000", "--dump-dom", "file://"+signIn)
	cmd.Env = append(os.Environ(), "HOME="+home) // downloads go to $HOME/Downloads
	var stdout, stderr testenv.LogBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Chromium does not always exit once it has dumped the DOM and saved
	// the download: both done is done.
	file := filepath.Join(home, "Downloads", "usage.csv")
	testenv.WaitFor(t, 80*time.Second, "Chromium to show the page and save its CSV", func() bool {
		select {
		case err := <-exited:
			exited <- err
			return true
		default:
		}
		_, err := os.Stat(file)
		return err == nil && strings.Contains(stdout.String(), "</html>")
	})
	_ = cmd.Process.Kill()
	if err := <-exited; err != nil && !strings.Contains(stdout.String(), "</html>") {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := stdout.String()
	for _, want := range []string{`data-state="ready"`, `data-complete="true"`, `<td><a href="/keys/k-acme">acme</a></td>`,
		`<td>/v1/export</td>`, `<td>/v1/orders</td>`, `<tr class="total"><td>total</td>`,
		`<td>gw-1</td><td>2026-10-20 08:00Z</td><td class="num">90</td><td class="num">90</td><td class="num">0</td><td></td><td>settled</td>`,
		`<a id="usage-csv" href="/api/usage?month=2026-11&amp;tz=America%2FNew_York&amp;key=acme&amp;by=key%2Croute&amp;format=csv"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("usage page lacks %s:\n%.4000s", want, dom)
		}
	}
	if _, err := os.Stat(file); err != nil {
		var files []string
		filepath.WalkDir(home, func(p string, _ os.DirEntry, _ error) error { files = append(files, p); return nil })
		t.Fatalf("no usage.csv downloaded: %v; %s holds %v", err, home, files)
	}
	got, _ := os.ReadFile(file)
	want := "key_id,key_name,key_kind,route,requests,allowed,denied,allowed_cost,denied_cost,without_store\n" +
		"k-acme,acme,api_key,/v1/export,1,1,0,10,0,0\nk-acme,acme,api_key,/v1/orders,2,1,1,1,1,0\n"
	if string(got) != want {
		t.Errorf("downloaded usage.csv = %q, want %q", got, want)
	}
}

// mustTime parses an RFC 3339 time.
func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// report is a gateway's accounting record: gateway, run start, report
// time, decisions, published, dropped (buffer full, broker error), final.
type report struct {
	gw, run, at  string
	d, p, bf, be int64
	final        bool
}

// mustReport stores reports in decisions_accounting, committed (batch 0).
func mustReport(t *testing.T, conn driver.Conn, reports []report) {
	t.Helper()
	batch, err := conn.PrepareBatch(context.Background(), `INSERT INTO decisions_accounting (time, gateway_id, run_start,
		decisions, published, dropped_buffer_full, dropped_broker_error, dropped_encode_error, dropped_closed, final, batch_id)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reports {
		final := uint8(0)
		if r.final {
			final = 1
		}
		if err := batch.Append(mustTime(t, r.at), r.gw, mustTime(t, r.run).UnixNano(), r.d, r.p, r.bf, r.be,
			int64(0), int64(0), final, uint64(0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
}
