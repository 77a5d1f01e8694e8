package analytics_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
)

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
