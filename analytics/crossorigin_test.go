package analytics_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/analytics"
)

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
