package analytics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

const testToken = "test-token-0123456789abcdef"

// seededAPI seeds a fleet, runs a detector over it once (at the fleet's
// clock) and serves the API on a real loopback listener.
func seededAPI(t *testing.T) (*httptest.Server, time.Time) {
	t.Helper()
	conn := mustDatabase(t)
	now := fleetClock()
	f, _, _ := seededFleet(now)
	mustInsert(t, conn, f.Rows())
	reader := analytics.NewReader(conn)
	det, err := analytics.NewDetector(analytics.Config{Hot: analytics.HotConfig{MinRate: 20}}, analytics.Deps{
		Reader: reader, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep := det.RunOnce(context.Background()); len(rep.Errors) > 0 || len(rep.HotKeys) != 1 {
		t.Fatalf("detector run = %+v", rep)
	}
	api, err := analytics.NewAPI(reader, det, testToken, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return srv, now
}

func get(t *testing.T, c *http.Client, u, token string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return send(t, c, req)
}

// send sends req with c and returns the response and its body.
func send(t *testing.T, c *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// serveAPI serves a tokened API over reader on a loopback listener (its
// clock now; nil: the real one), with a client that does not follow
// redirects, as a browser's sign-in is checked.
func serveAPI(t *testing.T, reader *analytics.Reader, now func() time.Time) (*analytics.API, *httptest.Server, *http.Client) {
	t.Helper()
	api, err := analytics.NewAPI(reader, nil, testToken, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return api, srv, c
}

// problemBody is an RFC 9457 problem as analytics answers it.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// wantProblem checks that resp is a problem of type typ with status, a
// title and a detail, and returns it.
func wantProblem(t *testing.T, what string, resp *http.Response, body []byte, status int, typ string) problemBody {
	t.Helper()
	var p problemBody
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("%s: Content-Type = %q, want application/problem+json", what, ct)
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Errorf("%s: body %q: %v", what, body, err)
	}
	want := problemBody{Type: typ, Title: http.StatusText(status), Status: status, Detail: p.Detail}
	if resp.StatusCode != status || p != want || p.Detail == "" {
		t.Errorf("%s = %d %+v, want %d %+v with a detail", what, resp.StatusCode, p, status, want)
	}
	return p
}

func TestAPIToken(t *testing.T) {
	if _, err := analytics.NewAPI(nil, nil, "short", nil, nil); !errors.Is(err, analytics.ErrBadToken) {
		t.Errorf("NewAPI with a short token = %v, want ErrBadToken", err)
	}
	// Every reading of the clock a guess window later: this test sends
	// more wrong tokens from one address than a window allows (the budget
	// is TestAPIGuessThrottle's), and far fewer readings than a session
	// lasts.
	var ticks atomic.Int64
	start := time.Now()
	clock := func() time.Time { return start.Add(time.Duration(ticks.Add(1)) * analytics.GuessWindow) }
	_, srv, c := serveAPI(t, analytics.NewReader(nil), clock)

	for _, path := range []string{"/api/trends", "/api/top-keys", "/api/fail-minutes", "/api/store-health", "/api/hot-keys", "/api/nat-ips", "/api/alerts", "/api/status"} {
		for name, tok := range map[string]string{"missing": "", "wrong": testToken + "x", "prefix": testToken[:16]} {
			resp, body := get(t, c, srv.URL+path, tok)
			wantProblem(t, "GET "+path+" with a "+name+" token", resp, body, http.StatusUnauthorized, "urn:edgelimit:problem:unauthorized")
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("GET %s with a %s token: 401 without WWW-Authenticate", path, name)
			}
		}
	}
	// The token is never read from an API URL.
	resp, body := get(t, c, srv.URL+"/api/status?token="+testToken, "")
	wantProblem(t, "GET /api/status?token=", resp, body, http.StatusUnauthorized, "urn:edgelimit:problem:unauthorized")
	if resp, body := get(t, c, srv.URL+"/api/status", testToken); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"detector": false`) {
		t.Errorf("GET /api/status with the token = %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(t, c, srv.URL+"/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200 without a token", resp.StatusCode)
	}

	// The page without a session is the sign-in form, which POSTs the
	// token: a token in the address is refused (issue 9), a wrong one too;
	// the right one starts a random session (not derived from the token:
	// two sign-ins get two sessions) and redirects to the page.
	resp, body = get(t, c, srv.URL+"/", "")
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `<form method="post" action="/login">`) {
		t.Fatalf("GET / without a session = %d %.200s, want 401 and the sign-in form", resp.StatusCode, body)
	}
	resp, body = get(t, c, srv.URL+"/?token="+url.QueryEscape(testToken), "")
	wantProblem(t, "GET /?token=", resp, body, http.StatusBadRequest, "urn:edgelimit:problem:bad-query")
	login := func(tok string) *http.Response {
		t.Helper()
		resp, err := c.PostForm(srv.URL+"/login", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := login("nope-nope-nope-nope"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /login with a wrong token = %d, want 401", resp.StatusCode)
	}
	cookieOf := func(resp *http.Response) *http.Cookie {
		for _, ck := range resp.Cookies() {
			if ck.Name == analytics.CookieName {
				return ck
			}
		}
		return nil
	}
	resp = login(testToken)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("POST /login = %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	session, other := cookieOf(resp), cookieOf(login(testToken))
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode || session.MaxAge <= 0 || session.Secure {
		t.Fatalf("session cookie = %+v, want HttpOnly, SameSite=Lax, an expiry, not Secure over plain HTTP", session)
	}
	if other == nil || other.Value == session.Value || strings.Contains(session.Value, testToken) {
		t.Errorf("two sign-ins share session %q / %v: sessions must be random", session.Value, other)
	}
	jar, _ := cookiejar.New(nil)
	u, _ := url.Parse(srv.URL)
	jar.SetCookies(u, []*http.Cookie{session})
	c.Jar = jar
	resp, body = get(t, c, srv.URL+"/", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `id="chart-trends"`) {
		t.Fatalf("GET / with the cookie = %d", resp.StatusCode)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'sha256-") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("dashboard CSP = %q, want default-src 'none' and hashed scripts", csp)
	}
	if resp, _ := get(t, c, srv.URL+"/api/alerts", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/alerts with the cookie = %d, want 200", resp.StatusCode)
	}
	// Signing out ends the session on the server, whatever the browser keeps.
	resp, err := c.Post(srv.URL+"/logout", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	jar.SetCookies(u, []*http.Cookie{session})
	if resp, _ := get(t, c, srv.URL+"/api/alerts", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /api/alerts after logout = %d, want 401", resp.StatusCode)
	}
	jar.SetCookies(u, []*http.Cookie{{Name: analytics.CookieName, Value: other.Value + "0"}})
	if resp, _ := get(t, c, srv.URL+"/api/alerts", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /api/alerts with a forged cookie = %d, want 401", resp.StatusCode)
	}
	// Behind a TLS proxy the cookie is Secure when configured.
	secure, _ := analytics.NewAPI(analytics.NewReader(nil), nil, testToken, nil, nil)
	secure.SecureCookie = true
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {testToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	secure.Handler().ServeHTTP(rec, req)
	if ck := cookieOf(rec.Result()); ck == nil || !ck.Secure {
		t.Errorf("with SecureCookie, session cookie = %+v, want Secure", ck)
	}
}

func TestAPIOnSeededFleet(t *testing.T) {
	srv, now := seededAPI(t)
	c := srv.Client()
	from := now.Add(-15 * time.Minute).Format(time.RFC3339)
	to := now.Add(time.Minute).Format(time.RFC3339)
	q := "?from=" + url.QueryEscape(from) + "&to=" + url.QueryEscape(to)

	resp, body := get(t, c, srv.URL+"/api/trends"+q+"&by=gateway&bucket=minute", testToken)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("trends = %d %s", resp.StatusCode, body)
	}
	var tr analytics.TrendsResponse
	if err := json.Unmarshal(body, &tr); err != nil {
		t.Fatal(err)
	}
	gws := map[string]int64{}
	for _, p := range tr.Points {
		gws[p.Series] += p.Denied
	}
	if tr.Bucket != "minute" || tr.By != "gateway" || len(gws) != 3 || gws["gw-a"] <= gws["gw-c"] {
		t.Errorf("trends by gateway: bucket %q by %q denied %v; want 3 gateways, gw-a (3/4 of hot-1) over gw-c", tr.Bucket, tr.By, gws)
	}

	var top struct {
		Keys []analytics.KeyRejections `json:"keys"`
	}
	resp, body = get(t, c, srv.URL+"/api/top-keys"+q+"&limit=3", testToken)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &top) != nil || len(top.Keys) != 3 || top.Keys[0].KeyID != "hot-1" {
		t.Errorf("top-keys = %d %s", resp.StatusCode, body)
	}

	var hot struct {
		HotKeys []analytics.HotKey `json:"hot_keys"`
	}
	resp, body = get(t, c, srv.URL+"/api/hot-keys", testToken)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &hot) != nil || len(hot.HotKeys) != 1 || hot.HotKeys[0].KeyID != "hot-1" {
		t.Errorf("hot-keys = %d %s", resp.StatusCode, body)
	}
	var hist struct {
		History []analytics.KeyPoint `json:"history"`
	}
	resp, body = get(t, c, srv.URL+"/api/hot-keys"+q+"&key=hot-1", testToken)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &hist) != nil || len(hist.History) == 0 {
		t.Errorf("hot-keys history = %d %s", resp.StatusCode, body)
	}
	var nat struct {
		NATIPs []analytics.NATIP `json:"nat_ips"`
	}
	resp, body = get(t, c, srv.URL+"/api/nat-ips", testToken)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &nat) != nil || len(nat.NATIPs) != 3 {
		t.Errorf("nat-ips = %d %s", resp.StatusCode, body)
	}
	var fm struct {
		Minutes []analytics.FailMinute `json:"minutes"`
	}
	resp, body = get(t, c, srv.URL+"/api/fail-minutes"+q, testToken)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &fm) != nil || len(fm.Minutes) != 2 {
		t.Errorf("fail-minutes = %d %s", resp.StatusCode, body)
	}

	for _, tt := range []struct {
		give string
		want string // in the detail
	}{
		{"/api/trends" + q + "&bucket=week", `bucket "week"`},
		{"/api/trends" + q + "&by=client_ip", `by "client_ip"`},
		{"/api/trends" + q + "&top=-1", `top "-1"`},
		{"/api/trends?from=yesterday", `"yesterday"`},
		{"/api/trends?from=" + url.QueryEscape(to) + "&to=" + url.QueryEscape(from), "is empty"},
		{"/api/trends?from=-500d&bucket=day", "longer than"},
		{"/api/top-keys" + q + "&limit=0", `limit "0"`},
		{"/api/store-health" + q + "&bucket=week", `bucket "week"`},
		{"/api/fail-minutes?to=-2h", "is empty"},
		{"/api/hot-keys?from=-1h&key=hot-1&bucket=fortnight", `bucket "fortnight"`},
		{"/api/nat-ips?ip=not-an-ip", "not an IP address"},
		// A parameter the path does not read is named, not ignored (the
		// answer would be about the last hour, 20 keys, JSON).
		{"/api/trends?form=-24h", `unknown parameter "form"`},
		{"/api/top-keys" + q + "&limt=3", `unknown parameter "limt"`},
		{"/api/top-keys" + q + "&format=csv", `unknown parameter "format": /api/top-keys takes bucket, from, gateway, key, kind, limit, method, plan, route, rule, to, tz`},
		{"/api/alerts?from=-1h", `/api/alerts takes no parameters`},
		{"/api/hot-keys?token=" + testToken, `unknown parameter "token"`},
		{"/api/keys/" + testToken + "?x=1", `/api/keys/{key} takes`}, // the path is not echoed
	} {
		resp, body := get(t, c, srv.URL+tt.give, testToken)
		p := wantProblem(t, "GET "+tt.give, resp, body, http.StatusBadRequest, "urn:edgelimit:problem:bad-query")
		if !strings.Contains(p.Detail, tt.want) || strings.HasPrefix(p.Detail, "analytics:") || strings.Contains(p.Detail, testToken) {
			t.Errorf("GET %s detail = %q, want it to say %q without the error's prefix", tt.give, p.Detail, tt.want)
		}
	}
}

// TestAPIStoreFailure points the API at a ClickHouse database that does
// not exist: every query fails with ClickHouse's own error text, which the
// log gets and the client never does.
func TestAPIStoreFailure(t *testing.T) {
	// An analyst may paste a key itself where its name or id belongs.
	const rawKey = "sk_live_pasted-raw-api-key"
	db := fmt.Sprintf("analytics_missing_%d", time.Now().UnixNano())
	conn := testenv.OpenClickHouse(t, testenv.ClickHouseAddr(t), db)
	var logs bytes.Buffer
	api, err := analytics.NewAPI(analytics.NewReader(conn), nil, testToken, nil, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()

	paths := []string{"/api/trends", "/api/top-keys", "/api/fail-minutes", "/api/store-health", "/api/hot-keys",
		"/api/nat-ips", "/api/hot-keys?key=k1", "/api/nat-ips?ip=192.0.2.1", "/api/keys/" + rawKey}
	for _, path := range paths {
		resp, body := get(t, srv.Client(), srv.URL+path, testToken)
		wantProblem(t, "GET "+path, resp, body, http.StatusInternalServerError, "urn:edgelimit:problem:query-failed")
		if strings.Contains(string(body), db) || strings.Contains(strings.ToLower(string(body)), "code:") {
			t.Errorf("GET %s leaks the store's error: %s", path, body)
		}
	}
	var n int
	for line := range strings.Lines(logs.String()) {
		var rec struct {
			Msg      string   `json:"msg"`
			Path     string   `json:"path"`
			Error    string   `json:"error"`
			Duration *float64 `json:"duration_ms"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Msg != "analytics api" || rec.Path == "" || !strings.Contains(rec.Error, db) || rec.Duration == nil {
			t.Errorf("log line %s: want msg \"analytics api\", the path, duration_ms and ClickHouse's error under \"error\"", line)
		}
		n++
	}
	if n != len(paths) {
		t.Errorf("%d log lines for %d failed queries:\n%s", n, len(paths), logs.String())
	}
	if strings.Contains(logs.String(), rawKey) {
		t.Errorf("the log holds the raw key an analyst pasted into a key's path:\n%s", logs.String())
	}
}

// TestAPIUnknownRoutes: the mux's own 404 and 405 are problems too.
func TestAPIUnknownRoutes(t *testing.T) {
	api, err := analytics.NewAPI(analytics.NewReader(nil), nil, testToken, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	for _, tt := range []struct {
		method, path string
		status       int
		typ          string
	}{
		{http.MethodGet, "/api/nope", http.StatusNotFound, "urn:edgelimit:problem:no-route"},
		{http.MethodGet, "/api/trends/", http.StatusNotFound, "urn:edgelimit:problem:no-route"},
		{http.MethodPost, "/api/trends", http.StatusMethodNotAllowed, "urn:edgelimit:problem:method-not-allowed"},
		{http.MethodDelete, "/api/status", http.StatusMethodNotAllowed, "urn:edgelimit:problem:method-not-allowed"},
		{http.MethodPost, "/", http.StatusMethodNotAllowed, "urn:edgelimit:problem:method-not-allowed"},
		{http.MethodPut, "/healthz", http.StatusMethodNotAllowed, "urn:edgelimit:problem:method-not-allowed"},
	} {
		req, _ := http.NewRequest(tt.method, srv.URL+tt.path, nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantProblem(t, tt.method+" "+tt.path, resp, body, tt.status, tt.typ)
		if tt.status == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow = %q, want GET, HEAD", tt.method, tt.path, resp.Header.Get("Allow"))
		}
	}
}

// TestDashboardInChromium loads the dashboard in headless Chromium against
// the seeded fleet and reads the rendered DOM: every chart drew data, the
// top-keys chart names the planted hot key, the tables list the hot key
// and the NAT addresses.
func TestDashboardInChromium(t *testing.T) {
	chromium := testenv.Chromium(t)
	srv, _ := seededAPI(t)
	signIn := signInPage(t, srv.URL+"/login")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dom := dumpDOM(t, ctx, chromium, signIn)
	if !strings.Contains(dom, `data-state="ready"`) {
		t.Fatalf("dashboard did not reach ready:\n%.3000s", dom)
	}
	for _, chart := range []string{"chart-trends", "chart-ratio", "chart-denials", "chart-cost", "chart-top-keys", "chart-store", "chart-fail", "chart-latency"} {
		m := regexp.MustCompile(`<svg id="` + chart + `"[^>]*data-points="(\d+)"`).FindStringSubmatch(dom)
		if m == nil {
			t.Errorf("%s: no data-points attribute: not rendered", chart)
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n == 0 {
			t.Errorf("%s rendered no points", chart)
		}
	}
	if n := strings.Count(dom, `class="line"`); n < 5 {
		t.Errorf("dashboard drew %d lines, want one per series of 5 line charts at least", n)
	}
	// EDGELIMIT_DASHBOARD_SCREENSHOT=file.png keeps a picture for humans.
	if png := os.Getenv("EDGELIMIT_DASHBOARD_SCREENSHOT"); png != "" {
		shot := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
			"--user-data-dir="+t.TempDir(), "--window-size=1400,1900", "--virtual-time-budget=20000",
			"--screenshot="+png, "file://"+signIn)
		if out, err := shot.CombinedOutput(); err != nil {
			t.Errorf("screenshot: %v\n%s", err, out)
		}
	}
	// Keys show their names and link to their pages by id.
	for _, want := range []string{`data-key="hot-1"`, `<td><a href="/keys/hot-1">acme</a></td>`, "<td>203.0.113.9</td>", "<td>2001:db8:aa:1::/64</td>", "gw-c open"} {
		if !strings.Contains(dom, want) {
			t.Errorf("dashboard lacks %s", want)
		}
	}
}

// signInPage writes a page that signs in as a person would, a form that
// POSTs the token to action (never a URL with it), after which the browser
// follows to the dashboard with its session cookie; it returns its path.
func signInPage(t *testing.T, action string) string {
	t.Helper()
	signIn := filepath.Join(t.TempDir(), "signin.html")
	page := `<!doctype html><form id="f" method="post" action="` + action + `">` +
		`<input name="token" value="` + testToken + `"></form><script>document.getElementById("f").submit()</script>`
	if err := os.WriteFile(signIn, []byte(page), 0o600); err != nil {
		t.Fatal(err)
	}
	return signIn
}

// dumpDOM opens page in headless Chromium and returns the DOM once the
// page's scripts have run (20s of virtual time).
func dumpDOM(t *testing.T, ctx context.Context, chromium, page string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(), "--window-size=1400,1800",
		"--virtual-time-budget=20000", "--dump-dom", "file://"+page)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// TestAPIGuessThrottle: a client that sends MaxGuesses wrong tokens (bearer
// or the sign-in form's) in a window gets 429 for every token after them,
// the right one included (it is not compared, so a guesser learns nothing
// more), until the window ends; another address is not held up.
func TestAPIGuessThrottle(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	api, srv, c := serveAPI(t, analytics.NewReader(nil), clock)
	signIn := func(tok string) int {
		t.Helper()
		resp, err := c.PostForm(srv.URL+"/login", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	wrong := testToken[:len(testToken)-1] + "x"

	for round, guess := range []func() int{
		func() int { resp, _ := get(t, c, srv.URL+"/api/status", wrong); return resp.StatusCode },
		func() int { return signIn(wrong) },
	} {
		for i := range analytics.MaxGuesses {
			if got := guess(); got != http.StatusUnauthorized {
				t.Fatalf("round %d: wrong token %d = %d, want 401", round, i+1, got)
			}
		}
		resp, body := get(t, c, srv.URL+"/api/status", wrong)
		wantProblem(t, "a wrong token past the budget", resp, body, http.StatusTooManyRequests, "urn:edgelimit:problem:too-many-wrong-tokens")
		if ra := resp.Header.Get("Retry-After"); ra == "" || ra == "0" {
			t.Errorf("429 Retry-After = %q, want the seconds left in the window", ra)
		}
		resp, body = get(t, c, srv.URL+"/api/status", testToken)
		wantProblem(t, "the right token past the budget", resp, body, http.StatusTooManyRequests, "urn:edgelimit:problem:too-many-wrong-tokens")
		if got := signIn(testToken); got != http.StatusTooManyRequests {
			t.Errorf("round %d: signing in with the right token past the budget = %d, want 429", round, got)
		}
		// Another address keeps its own budget.
		req := httptest.NewRequest(http.MethodGet, "/api/status", nil)
		req.RemoteAddr = "192.0.2.7:40000"
		req.Header.Set("Authorization", "Bearer "+testToken)
		rec := httptest.NewRecorder()
		api.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"detector"`) {
			t.Errorf("round %d: the right token from another address = %d, want 200", round, rec.Code)
		}
		mu.Lock()
		now = now.Add(analytics.GuessWindow)
		mu.Unlock()
		if resp, _ := get(t, c, srv.URL+"/api/status", testToken); resp.StatusCode != http.StatusOK {
			t.Fatalf("round %d: the right token after the window = %d, want 200", round, resp.StatusCode)
		}
	}
}

// TestAPICrossOrigin: SameSite=Lax does not keep the session cookie off a
// POST from another origin of the same site (another port, a sibling
// subdomain), so the API refuses every POST a browser marks cross-origin
// (Sec-Fetch-Site, or a foreign Origin): no signing the analyst out, no
// replays on their session. Same-origin posts, clients that send neither
// header (the CLI, curl) and signing in (it takes the one token: a forged
// sign-in needs it) still work.
func TestAPICrossOrigin(t *testing.T) {
	api, srv, c := serveAPI(t, analytics.NewReader(nil), nil)
	api.ParseProposal = func(string, string) (analytics.Proposal, error) { return analytics.Proposal{}, nil }
	post := func(path, contentType, body string, hdr map[string]string, cookie *http.Cookie) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if cookie != nil {
			req.AddCookie(cookie)
		}
		return send(t, c, req)
	}
	form := "application/x-www-form-urlencoded"
	signIn := func(hdr map[string]string) *http.Response {
		t.Helper()
		resp, _ := post("/login", form, url.Values{"token": {testToken}}.Encode(), hdr, nil)
		return resp
	}
	resp := signIn(map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": srv.URL})
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == analytics.CookieName {
			session = ck
		}
	}
	if resp.StatusCode != http.StatusSeeOther || session == nil {
		t.Fatalf("same-origin POST /login = %d, cookie %v; want 303 and a session", resp.StatusCode, session)
	}
	live := func() bool {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/alerts", nil)
		req.AddCookie(session)
		resp, _ := send(t, c, req)
		return resp.StatusCode == http.StatusOK
	}

	sameSite := map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://app.example.test"}
	for _, tt := range []struct {
		name, path, contentType, body string
		hdr                           map[string]string
	}{
		{"logout from a same-site page", "/logout", form, "", sameSite},
		{"logout from an old browser's foreign origin", "/logout", form, "", map[string]string{"Origin": "http://app.example.test"}},
		// A text/plain form posts JSON without a CORS preflight.
		{"replay from a same-site page", "/api/whatif", "text/plain", `{"rules":"plans: {}","from":"-1h","to":"now"}`, sameSite},
	} {
		resp, body := post(tt.path, tt.contentType, tt.body, tt.hdr, session)
		wantProblem(t, tt.name+": POST "+tt.path, resp, body, http.StatusForbidden, "urn:edgelimit:problem:cross-origin")
		if len(resp.Cookies()) > 0 {
			t.Errorf("%s: POST %s set cookies %v", tt.name, tt.path, resp.Cookies())
		}
		if !live() {
			t.Fatalf("%s: POST %s ended the session", tt.name, tt.path)
		}
	}

	// The CLI and scripts send neither header; a sign-in form may live
	// elsewhere.
	for _, hdr := range []map[string]string{nil, {"Sec-Fetch-Site": "cross-site", "Origin": "null"}} {
		if resp := signIn(hdr); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("POST /login with %v = %d, want 303", hdr, resp.StatusCode)
		}
	}
	if resp, _ := post("/logout", form, "", map[string]string{"Sec-Fetch-Site": "same-origin"}, session); resp.StatusCode != http.StatusSeeOther || live() {
		t.Errorf("same-origin POST /logout = %d (session live: %v), want 303 and the session ended", resp.StatusCode, live())
	}
}
