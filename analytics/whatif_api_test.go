package analytics_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// fakeProposals stands in for cmd's YAML parser (tested there): any text
// naming plans: is whatIfProposal, anything else a parse error.
func fakeProposals(rules, change string) (analytics.Proposal, error) {
	if !strings.Contains(rules, "plans:") || change != "" {
		return analytics.Proposal{}, errors.New("rules: line 1: no plans: section")
	}
	return whatIfProposal(), nil
}

// whatIfAPI serves the API over seedWhatIf's decisions.
func whatIfAPI(t *testing.T, parse analytics.ProposalParser) *httptest.Server {
	t.Helper()
	api, err := analytics.NewAPI(seedWhatIf(t), nil, testToken, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	api.ParseProposal = parse
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, u, token, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestWhatIfAPI: POST /api/whatif answers the report of the seeded
// replay, and every mistake a problem that says what is wrong.
func TestWhatIfAPI(t *testing.T) {
	srv := whatIfAPI(t, fakeProposals)
	t.Parallel()
	rng := `"from": "` + whatIfStart.Add(-time.Minute).Format(time.RFC3339) + `", "to": "` + whatIfStart.Add(time.Minute).Format(time.RFC3339) + `"`
	resp, body := post(t, srv.URL+"/api/whatif", testToken, `{"rules": "plans: {}", `+rng+`, "top": 3}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/whatif = %d %s", resp.StatusCode, body)
	}
	var rep analytics.WhatIfReport
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	if want := (analytics.WhatIfCounts{Requests: 18, WasDenied: 3, WouldDeny: 5, NewlyDenied: 4, NewlyAllowed: 2}); rep.Totals != want || len(rep.TopKeys) != 3 {
		t.Errorf("report totals %+v with %d top keys, want %+v and 3", rep.Totals, len(rep.TopKeys), want)
	}
	if rep.SelfCheck != nil {
		t.Errorf("self-check %+v without the rules that ran", rep.SelfCheck)
	}
	// The rules that ran, replayed beside the proposal: here the same
	// rules, so the self-check's counts are the proposal's replayed ones.
	resp, body = post(t, srv.URL+"/api/whatif", testToken, `{"rules": "plans: {}", "ran": "plans: {}", `+rng+`}`)
	if err := json.Unmarshal(body, &rep); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("POST /api/whatif with ran = %d %s", resp.StatusCode, body)
	}
	if c := rep.SelfCheck; c == nil || c.Requests+c.NotReplayed != rep.Totals.Requests || c.NotReplayed != 3 || c.WouldDeny != rep.Totals.WouldDeny-1 {
		t.Errorf("self-check %+v beside totals %+v; want the 15 replayed decisions, 3 of plan gold not", c, rep.Totals)
	}

	for _, tt := range []struct {
		name, body, detail string
	}{
		{"not json", `rules: x`, "want a JSON object"},
		{"unknown field", `{"rules": "plans: {}", "bucket": "hour"}`, `unknown field "bucket"`},
		{"empty proposal", `{` + rng + `}`, "the proposal is empty"},
		{"parse error", `{"rules": "routes: []", ` + rng + `}`, "no plans: section"},
		{"ran parse error", `{"rules": "plans: {}", "ran": "routes: []", ` + rng + `}`, "ran: rules: line 1: no plans: section"},
		{"bad time", `{"rules": "plans: {}", "from": "yesterday"}`, `time "yesterday"`},
		{"range too long", `{"rules": "plans: {}", "from": "-40d"}`, "at most 744h0m0s"},
		{"top", `{"rules": "plans: {}", "top": 5000}`, "top 5000"},
	} {
		resp, body := post(t, srv.URL+"/api/whatif", testToken, tt.body)
		p := wantProblem(t, tt.name, resp, body, http.StatusBadRequest, "urn:edgelimit:problem:bad-query")
		if !strings.Contains(p.Detail, tt.detail) {
			t.Errorf("%s: detail %q, want it to say %q", tt.name, p.Detail, tt.detail)
		}
	}
	resp, body = post(t, srv.URL+"/api/whatif", "", `{"rules": "plans: {}"}`)
	wantProblem(t, "without the token", resp, body, http.StatusUnauthorized, "urn:edgelimit:problem:unauthorized")
	resp, body = get(t, http.DefaultClient, srv.URL+"/api/whatif", testToken)
	wantProblem(t, "GET", resp, body, http.StatusMethodNotAllowed, "urn:edgelimit:problem:method-not-allowed")
	if resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /api/whatif: Allow = %q, want POST", resp.Header.Get("Allow"))
	}
	off := whatIfAPI(t, nil)
	resp, body = post(t, off.URL+"/api/whatif", testToken, `{"rules": "plans: {}"}`)
	wantProblem(t, "without a parser", resp, body, http.StatusNotFound, "urn:edgelimit:problem:no-route")
}

// TestWhatIfBusy: two replays at once, the third is told to come back.
func TestWhatIfBusy(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	srv := whatIfAPI(t, func(rules, change string) (analytics.Proposal, error) {
		inside <- struct{}{}
		<-release
		return fakeProposals(rules, change)
	})
	t.Parallel()
	done := make(chan int, 2)
	for range 2 {
		go func() {
			// Not post: t.Fatal must not run on this goroutine.
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/whatif", strings.NewReader(`{"rules": "plans: {}"}`))
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		<-inside // that one holds a slot
	}
	resp, body := post(t, srv.URL+"/api/whatif", testToken, `{"rules": "plans: {}"}`)
	wantProblem(t, "a third replay", resp, body, http.StatusTooManyRequests, "urn:edgelimit:problem:busy")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("busy: no Retry-After")
	}
	close(release)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a replay holding a slot = %d, want 200", code)
		}
	}
	// The slots are free again.
	go func() { <-inside }()
	if resp, body := post(t, srv.URL+"/api/whatif", testToken, `{"rules": "plans: {}"}`); resp.StatusCode != http.StatusOK {
		t.Errorf("after the others = %d %s, want 200", resp.StatusCode, body)
	}
}

// TestWhatIfDashboard runs the dashboard's what-if form in headless
// Chromium: a link whose fragment carries the proposal and the range
// fills the form and replays it, and the page shows the report.
func TestWhatIfDashboard(t *testing.T) {
	chromium := testenv.Chromium(t)
	srv := whatIfAPI(t, fakeProposals)
	frag := url.Values{"rules": {"plans: (the test's proposal)"}, "ran": {"plans: (the same)"}, "from": {whatIfStart.Add(-time.Minute).Format(time.RFC3339)},
		"to": {whatIfStart.Add(time.Minute).Format(time.RFC3339)}, "top": {"5"}}
	// The sign-in redirects to /, which keeps the fragment (RFC 9110 10.2.2).
	signIn := signInPage(t, srv.URL+"/login#whatif?"+frag.Encode())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dom := dumpDOM(t, ctx, chromium, signIn)
	if !strings.Contains(dom, `<section id="whatif" data-state="done">`) {
		t.Fatalf("what-if did not finish:\n%.4000s", dom[max(0, strings.Index(dom, `<section id="whatif"`)):])
	}
	for _, want := range []string{
		"18 decisions of 5 keys replayed",
		// totals: 18 requests, 3 were denied, 5 would be, 4 newly denied, 2 newly allowed
		`<td>total</td><td class="num">18</td><td class="num">3</td><td class="num">5</td><td class="num">4</td><td class="num">2</td>`,
		`<td>second</td><td class="num">0</td><td class="num">3</td>`,
		`<td>b</td><td>api_key</td><td class="num">2</td><td class="num">2</td><td class="num">0</td>`,
		"Caveat: 3 decisions were of plans the proposal does not name",
		"Self-check: the rules that ran, replayed, decided ",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("dashboard what-if lacks %s", want)
		}
	}
}

// TestWhatIfOutlastsWriteTimeout: a replay may take WhatIfTimeout, longer
// than the server's write timeout (cmd's is 60s); its answer still arrives,
// rather than a dropped connection. The proposal's parsing stands in for a
// long replay: it holds the request past a short write timeout.
func TestWhatIfOutlastsWriteTimeout(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	api, err := analytics.NewAPI(seedWhatIf(t), nil, testToken, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	api.ParseProposal = func(rules, change string) (analytics.Proposal, error) {
		time.Sleep(3 * writeTimeout) // longer than the write timeout, whatever the load
		return fakeProposals(rules, change)
	}
	srv := httptest.NewUnstartedServer(api.Handler())
	srv.Config.WriteTimeout = writeTimeout
	srv.Start()
	defer srv.Close()
	rng := `"from": "` + whatIfStart.Add(-time.Minute).Format(time.RFC3339) + `", "to": "` + whatIfStart.Add(time.Minute).Format(time.RFC3339) + `"`
	resp, body := post(t, srv.URL+"/api/whatif", testToken, `{"rules": "plans: {}", `+rng+`}`)
	var rep analytics.WhatIfReport
	if err := json.Unmarshal(body, &rep); resp.StatusCode != http.StatusOK || err != nil || rep.Totals.Requests == 0 {
		t.Errorf("POST /api/whatif past the write timeout = %d %.300s, want 200 and the report", resp.StatusCode, body)
	}
}
