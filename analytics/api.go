package analytics

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

//go:embed dashboard.html
var dashboardHTML []byte

// dashboardCSP allows only the page's own inline script and style (by
// hash) and requests to its own origin: no CDN, nothing else.
var dashboardCSP = func() string {
	hashes := func(tag string) string {
		re := regexp.MustCompile(`(?s)<` + tag + `>(.*?)</` + tag + `>`)
		var out []string
		for _, m := range re.FindAllSubmatch(dashboardHTML, -1) {
			sum := sha256.Sum256(m[1])
			out = append(out, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		}
		return strings.Join(out, " ")
	}
	return "default-src 'none'; script-src " + hashes("script") + "; style-src " + hashes("style") +
		"; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
}()

// loginHTML is the sign-in page: a form that POSTs the token, no script
// and no style, so its CSP allows nothing but the form. {next} is where
// signing in leads (see loginPage).
const loginHTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgelimit analytics: sign in</title></head>
<body><h1>edgelimit analytics</h1>
<form method="post" action="/login{next}">
<label>API token <input type="password" name="token" autocomplete="current-password" autofocus required minlength="16"></label>
<button type="submit">Sign in</button>
</form></body></html>
`

// nextRE matches the pages signing in may lead to: the dashboard, a key's
// page (a key's name or id is letters, digits, '_', '-' and '.') and the
// usage page with its query. A fixed shape, never another host: no open
// redirect.
var nextRE = regexp.MustCompile(`^/(keys/[A-Za-z0-9_.-]+|usage(\?[A-Za-z0-9_.,=&%+-]*)?)?$`)

// validNext reports whether signing in may lead to path (see nextRE).
func validNext(path string) bool {
	return len(path) <= 1024 && nextRE.MatchString(path)
}

// loginPage is the sign-in page leading back to path when it is a page
// nextRE allows: its form posts to /login?next=PATH (the token stays in
// the body).
func loginPage(path string) []byte {
	next := ""
	if path != "/" && validNext(path) {
		next = html.EscapeString("?next=" + url.QueryEscape(path))
	}
	return []byte(strings.Replace(loginHTML, "{next}", next, 1))
}

const loginCSP = "default-src 'none'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// MinTokenLen is the shortest API token accepted.
const MinTokenLen = 16

// ErrBadToken is returned by NewAPI for a missing or short token.
var ErrBadToken = errors.New("analytics: api token must be at least 16 characters")

// API serves the analysts' HTTP JSON API and the dashboard page. Every
// route but /healthz and the sign-in needs the token: as "Authorization:
// Bearer <token>", or, in a browser, a session: the page's form POSTs the
// token to /login (never in a URL, so never in history or proxy logs),
// which starts a session of its own (a random id in an HttpOnly,
// SameSite=Lax cookie, Secure over TLS or when configured) that ends after
// SessionTTL or at POST /logout.
type API struct {
	reader *Reader
	det    *Detector
	token  string
	now    func() time.Time
	log    *slog.Logger

	// SecureCookie marks the session cookie Secure even over plain HTTP,
	// for an API served behind a TLS proxy; over TLS it always is.
	SecureCookie bool
	// ParseProposal reads what-if proposals (POST /api/whatif); nil turns
	// the route off. See whatif_api.go.
	ParseProposal ProposalParser
	whatIfs       atomic.Int32 // replays running

	mu       sync.Mutex
	sessions map[string]time.Time // session id → expiry
	guesses  guesses              // wrong tokens per client (guess.go)
}

// CookieName is the dashboard's session cookie.
const CookieName = "edgelimit_analytics"

// Sessions: how long one lasts, and how many are kept (the oldest go
// first), so signing in again and again cannot grow memory.
const (
	SessionTTL  = 12 * time.Hour
	maxSessions = 10000
)

// NewAPI returns the API over reader; det (optional) supplies the current
// hot keys, NAT IPs and alerts. now and log default to time.Now and
// slog.Default().
func NewAPI(reader *Reader, det *Detector, token string, now func() time.Time, log *slog.Logger) (*API, error) {
	if len(token) < MinTokenLen {
		return nil, ErrBadToken
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	return &API{reader: reader, det: det, token: token, now: now, log: log, sessions: map[string]time.Time{}}, nil
}

// newSession starts a session and returns its id.
func (a *API) newSession() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.sessions) >= maxSessions {
		oldest, at := "", time.Time{}
		for s, exp := range a.sessions {
			if !exp.After(now) {
				delete(a.sessions, s)
			} else if oldest == "" || exp.Before(at) {
				oldest, at = s, exp
			}
		}
		if len(a.sessions) >= maxSessions {
			delete(a.sessions, oldest)
		}
	}
	a.sessions[id] = now.Add(SessionTTL)
	return id
}

// session reports whether id is a live session.
func (a *API) session(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.sessions[id]
	if ok && !exp.After(a.now()) {
		delete(a.sessions, id)
		return false
	}
	return ok
}

func (a *API) sessionCookie(r *http.Request, id string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: CookieName, Value: id, Path: "/", MaxAge: maxAge, HttpOnly: true,
		// Lax, not Strict: the page is GET-only, and Strict would drop the
		// cookie on the redirect after signing in from a bookmark or link.
		// State-changing routes are POSTs, which Lax never sends cross-site.
		SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil || a.SecureCookie,
	}
}

// login starts a session for the token posted in the form field "token".
func (a *API) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	tok := r.PostFormValue("token")
	client, now := clientOf(r), a.now()
	if until, ok := a.guesses.blocked(client, now); ok {
		tooManyGuesses(w, until, now)
		return
	}
	if subtle.ConstantTimeCompare([]byte(tok), []byte(a.token)) != 1 {
		a.guesses.wrong(client, now)
		unauthorized(w, "Wrong token.")
		return
	}
	http.SetCookie(w, a.sessionCookie(r, a.newSession(), int(SessionTTL/time.Second)))
	next := r.URL.Query().Get("next")
	if !validNext(next) {
		next = "/"
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the request's session.
func (a *API) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(CookieName); err == nil {
		a.mu.Lock()
		delete(a.sessions, c.Value)
		a.mu.Unlock()
	}
	http.SetCookie(w, a.sessionCookie(r, "", -1))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// Handler returns the API's routes. Every error answer, the mux's own
// 404 and 405 included, is an RFC 9457 problem (application/problem+json),
// as the gateway's are.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /{$}", a.dashboard)
	// A key's page is the dashboard's, which reads the key from its path.
	mux.HandleFunc("GET /keys/{key}", a.dashboard)
	mux.HandleFunc("GET /usage", a.dashboard)
	mux.HandleFunc("POST /login", a.login)
	mux.HandleFunc("POST /logout", a.logout)
	paths := []string{"/healthz", "/{$}", "/keys/{key}", "/usage"}
	for _, rt := range []struct {
		path string
		h    func(http.ResponseWriter, *http.Request) error
		// params are the query parameters h reads; any other is a 400.
		params []string
	}{
		{"/api/trends", a.trends, append([]string{"by", "top", "format"}, rangeParams...)},
		{"/api/top-keys", a.ranged(a.topKeys), append([]string{"limit"}, rangeParams...)},
		{"/api/keys/{key}", a.ranged(a.key), rangeParams},
		{"/api/fail-minutes", a.ranged(a.failMinutes), rangeParams},
		{"/api/store-health", a.ranged(a.storeHealth), rangeParams},
		{"/api/hot-keys", a.ranged(a.hotKeys), rangeParams},
		{"/api/nat-ips", a.ranged(a.natIPs), append([]string{"ip"}, rangeParams...)},
		{"/api/usage", a.usage, []string{"month", "from", "to", "tz", "key", "by", "format"}},
		{"/api/v1/usage", a.usage, []string{"month", "from", "to", "tz", "key", "by", "format"}},
		{"/api/alerts", a.alerts, nil},
		{"/api/status", a.status, nil},
	} {
		mux.Handle("GET "+rt.path, a.auth(only(rt.path, rt.params, rt.h)))
		paths = append(paths, rt.path)
	}
	mux.Handle("POST /api/whatif", a.auth(a.whatIf))
	mux.HandleFunc("/api/whatif", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Allow", "POST")
		writeProblem(w, problem{Type: probMethodNotAllowed, Status: http.StatusMethodNotAllowed, Detail: "This path answers POST only."})
	})
	// The same paths without a method catch every method but GET (and
	// HEAD), which the mux would otherwise answer in plain text.
	for _, p := range paths {
		mux.HandleFunc(p, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Allow", "GET, HEAD")
			writeProblem(w, problem{Type: probMethodNotAllowed, Status: http.StatusMethodNotAllowed,
				Detail: "This path answers GET only."})
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, problem{Type: probNotFound, Status: http.StatusNotFound, Detail: "No such path."})
	})
	// SameSite=Lax keeps the cookie off cross-site POSTs, not off those of
	// another origin of the same site (another port of this host, a sibling
	// subdomain): a page there could sign the analyst out or start replays
	// with their session, by a text/plain form a browser sends without
	// asking. So every POST a browser marks cross-origin (Sec-Fetch-Site,
	// or an Origin that is not this host) is refused; the CLI and scripts
	// send neither header and pass. Signing in is the exception: it takes
	// the one token, so a forged sign-in needs it and gains nothing, and a
	// sign-in form elsewhere (a portal, a saved page) keeps working.
	xo := http.NewCrossOriginProtection()
	xo.AddInsecureBypassPattern("POST /login")
	xo.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, problem{Type: probCrossOrigin, Status: http.StatusForbidden,
			Detail: "A cross-origin request may not change anything here; use the dashboard's own page."})
	}))
	return xo.Handler(mux)
}

// Problem types of the API's error answers: stable URIs in the gateway's
// urn:edgelimit:problem: namespace, for clients to branch on.
const (
	probBadQuery         = "urn:edgelimit:problem:bad-query"
	probUnauthorized     = "urn:edgelimit:problem:unauthorized"
	probQueryFailed      = "urn:edgelimit:problem:query-failed"
	probNotFound         = "urn:edgelimit:problem:no-route"
	probMethodNotAllowed = "urn:edgelimit:problem:method-not-allowed"
	probCrossOrigin      = "urn:edgelimit:problem:cross-origin"
)

// problem is an RFC 9457 problem detail, the shape of the gateway's.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers p; its title is the status text, as the gateway's.
func writeProblem(w http.ResponseWriter, p problem) {
	p.Title = http.StatusText(p.Status)
	writeBody(w, "application/problem+json", p.Status, p)
}

// unauthorized answers 401 with the challenge RFC 9110 asks of every 401.
func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="edgelimit-analytics"`)
	writeProblem(w, problem{Type: probUnauthorized, Status: http.StatusUnauthorized, Detail: detail})
}

// authorized checks the bearer token, in constant time, or the session
// cookie. A bearer token from a client out of wrong tokens (guess.go) is
// not compared: authorized answers 429 itself and returns false with
// answered set.
func (a *API) authorized(w http.ResponseWriter, r *http.Request) (ok, answered bool) {
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		client, now := clientOf(r), a.now()
		if until, blocked := a.guesses.blocked(client, now); blocked {
			tooManyGuesses(w, until, now)
			return false, true
		}
		if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(h[7:])), []byte(a.token)) == 1 {
			return true, false
		}
		a.guesses.wrong(client, now)
		return false, false
	}
	if c, err := r.Cookie(CookieName); err == nil {
		return a.session(c.Value), false
	}
	return false, false
}

func (a *API) auth(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ok, answered := a.authorized(w, r); !ok {
			if !answered {
				unauthorized(w, "Missing or wrong token: send Authorization: Bearer <token>.")
			}
			return
		}
		start := a.now()
		if err := h(w, r); err != nil {
			if errors.Is(err, ErrBadQuery) {
				// Our own validation's words, safe to show; the title
				// already says it is a bad request.
				writeProblem(w, problem{Type: probBadQuery, Status: http.StatusBadRequest,
					Detail: strings.TrimPrefix(err.Error(), ErrBadQuery.Error()+": ")})
				return
			}
			// Anything else is the store's or ours: its text (ClickHouse's
			// error, table names) goes to the log, never to the client.
			// The route's pattern, not the path: a key's path may hold
			// what an analyst pasted, a raw API key even.
			a.log.Error("analytics api", "path", r.Pattern, "duration_ms", a.now().Sub(start).Milliseconds(), "error", err.Error())
			writeProblem(w, problem{Type: probQueryFailed, Status: http.StatusInternalServerError,
				Detail: "The query failed; see the analytics log."})
		}
	})
}

func (a *API) dashboard(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("token") {
		// The token never travels in a URL: history and proxy logs keep them.
		writeProblem(w, problem{Type: probBadQuery, Status: http.StatusBadRequest,
			Detail: "Sign in with the form at / (POST /login); a token in the address is refused."})
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	ok, answered := a.authorized(w, r)
	if answered {
		return
	}
	if !ok {
		h.Set("Content-Security-Policy", loginCSP)
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("WWW-Authenticate", `Bearer realm="edgelimit-analytics"`)
		w.WriteHeader(http.StatusUnauthorized)
		next := r.URL.Path
		if next == "/usage" && r.URL.RawQuery != "" {
			next += "?" + r.URL.RawQuery
		}
		w.Write(loginPage(next))
		return
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.Write(dashboardHTML)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, "application/json", status, v)
}

func writeBody(w http.ResponseWriter, contentType string, status int, v any) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// rangeParams are the query parameters of a range (rangeOf) and its
// buckets (bucketOf and tz), which every ranged endpoint takes: the
// dashboard sends the same ones to each.
var rangeParams = []string{"from", "to", "rule", "route", "plan", "gateway", "key", "kind", "method", "bucket", "tz"}

// only refuses a query parameter h does not read: a misspelt one
// (?form=-24h, ?limt=5) or one another path takes (?format=csv beside
// /api/top-keys) would be ignored, and the answer would silently be about
// something else (the last hour, the default 20 keys, JSON). The answer
// names the path's pattern, not the path: a key's path may hold what an
// analyst pasted, a raw API key even.
func only(pattern string, params []string, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	takes := "no parameters"
	if len(params) > 0 {
		sorted := slices.Sorted(slices.Values(params))
		takes = strings.Join(sorted, ", ")
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		for name := range r.URL.Query() {
			if !slices.Contains(params, name) {
				return fmt.Errorf("%w: unknown parameter %q: %s takes %s", ErrBadQuery, name, pattern, takes)
			}
		}
		return h(w, r)
	}
}

// rangeOf reads from (default 1h ago), to (default now) and the filters.
func (a *API) rangeOf(r *http.Request) (Range, error) {
	q := r.URL.Query()
	now := a.now().UTC()
	from, err := ParseTime(q.Get("from"), now, now.Add(-time.Hour))
	if err != nil {
		return Range{}, err
	}
	to, err := ParseTime(q.Get("to"), now, now)
	if err != nil {
		return Range{}, err
	}
	rg := Range{From: from, To: to, Rule: q.Get("rule"), Route: q.Get("route"), Plan: q.Get("plan"),
		Gateway: q.Get("gateway"), KeyID: q.Get("key"), KeyKind: q.Get("kind"), Method: q.Get("method")}
	return rg, rg.validate()
}

func bucketOf(r *http.Request, rg Range) string {
	if b := r.URL.Query().Get("bucket"); b != "" && b != "auto" {
		return b
	}
	return AutoBucket(rg.From, rg.To)
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%w: %s %q: want an integer in [%d, %d]", ErrBadQuery, name, s, lo, hi)
	}
	return n, nil
}
