package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// keyAdmin is what the admin API needs of a limiter store: *limiter.Redis
// and *limiter.Memory both fit. The store owns its key layout; the API only
// names keys and rules the way the request path does.
type keyAdmin interface {
	// Inspect reads the state of rules under key, consuming nothing.
	Inspect(ctx context.Context, key string, rules []limiter.Rule) (limiter.KeyState, error)
	// Reset refills rules under key to full.
	Reset(ctx context.Context, key string, rules []limiter.Rule) error
	// Clear deletes every rule's state under key.
	Clear(ctx context.Context, key string) error
}

// keyGranter is what a grant needs of a limiter store: *limiter.Redis and
// *limiter.Memory both fit.
type keyGranter interface {
	// Grant adds units to (negative: takes back from) the allowance of a
	// calendar rule's current window under key.
	Grant(ctx context.Context, key string, rule limiter.Rule, units int64) (limiter.GrantResult, error)
}

// MinAdminTokenLen is the shortest admin token accepted.
const MinAdminTokenLen = 16

// AdminConfig guards the admin API: the key inspect, reset and clear
// endpoints on the admin listener.
type AdminConfig struct {
	// Tokens are the bearer tokens that may use the API, by name; the name
	// (never the token) is who the audit log line and event say acted.
	// None: the API is disabled and its endpoints say so. Restart.
	Tokens map[string]Secret `yaml:"tokens"`
}

// Validate reports tokens too short to guess-proof and names that would
// not read plainly in a log.
func (c AdminConfig) Validate() error {
	var errs []error
	for _, name := range sortedKeys(c.Tokens) {
		if !nameRE.MatchString(name) || len(name) > 64 {
			errs = append(errs, fmt.Errorf("%w: admin_api.tokens: name %q may hold only letters, digits, '_', '-' and '.', at most 64", ErrInvalidConfig, name))
		}
		if len(c.Tokens[name]) < MinAdminTokenLen {
			errs = append(errs, fmt.Errorf("%w: admin_api.tokens.%s: at least %d characters", ErrInvalidConfig, name, MinAdminTokenLen))
		}
	}
	return errors.Join(errs...)
}

// Admin serves the key admin API for on-call engineers: show a caller's
// live limiter state for every rule set it can hit (with the directives in
// force for it on this gateway), refill it to full, or clear it. Every
// reset and clear is audited: a log line and a decision-stream record
// (mode admin) naming the token's name, never the token, and the key by
// its key id.
type Admin struct {
	g      *Gateway
	tokens []adminToken
	log    *slog.Logger
	// door finds the Envoy door's descriptor buckets; nil: none served.
	door doorBuckets
}

type adminToken struct {
	name string
	sum  [sha256.Size]byte
}

// NewAdmin returns the admin API of g under cfg, which must be valid.
func NewAdmin(g *Gateway, cfg AdminConfig) (*Admin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Admin{g: g, log: g.log}
	for _, name := range sortedKeys(cfg.Tokens) {
		a.tokens = append(a.tokens, adminToken{name: name, sum: sha256.Sum256([]byte(cfg.Tokens[name]))})
	}
	return a, nil
}

// Enabled reports whether any token may use the API.
func (a *Admin) Enabled() bool { return len(a.tokens) > 0 }

// AdminPath is where the key admin API is served on the admin listener.
const AdminPath = "/admin/v1/keys"

// Register adds the endpoints to mux (the admin listener's):
//
//	GET  /admin/v1/keys?api_key=ID|user=ID|ip=ADDR[&route=NAME|&plan=NAME]  the key's state
//	POST /admin/v1/keys/reset?...                                            refill to full
//	POST /admin/v1/keys/clear?...                                            delete its state
//	POST /admin/v1/keys/grant?...&rule=NAME&units=N                          N more (or, negative, fewer) units of a calendar rule's current window
//	... ?domain=NAME&entry=KEY=VALUE[&entry=KEY=VALUE...]                    an Envoy descriptor's buckets (SetDoor)
//
// An API key is named by its configured id, never the key itself. Without
// route, every rule set the caller can hit (its plan's, each route's own
// plan, an address's auth failure bucket); with route, the one that route
// checks; with plan, the bucket POST /v1/check keeps for a plan it names.
func (a *Admin) Register(mux *http.ServeMux) {
	mux.Handle("GET "+AdminPath, a.guard(a.show))
	mux.Handle("POST "+AdminPath+"/reset", a.guard(func(w http.ResponseWriter, r *http.Request, actor string) {
		a.change(w, r, actor, "reset")
	}))
	mux.Handle("POST "+AdminPath+"/clear", a.guard(func(w http.ResponseWriter, r *http.Request, actor string) {
		a.change(w, r, actor, "clear")
	}))
	mux.Handle("POST "+AdminPath+"/grant", a.guard(a.grant))
	// Everything else under /admin/ answers as the API does, in a problem
	// body, rather than with the mux's text/plain 404 and 405.
	mux.HandleFunc("/admin/", adminElse)
}

// adminMethods are the API's paths and the method each answers.
var adminMethods = map[string]string{
	AdminPath:            http.MethodGet,
	AdminPath + "/reset": http.MethodPost,
	AdminPath + "/clear": http.MethodPost,
	AdminPath + "/grant": http.MethodPost,
}

// adminElse answers a request under /admin/ that no endpoint took: a
// known path with another method (405), or an unknown path (404).
func adminElse(w http.ResponseWriter, r *http.Request) {
	if m, ok := adminMethods[r.URL.Path]; ok {
		allow := m
		if m == http.MethodGet {
			allow = "GET, HEAD"
		}
		w.Header()["Allow"] = []string{allow}
		writeProblem(w, problem{Type: probMethodNotAllowed, Status: http.StatusMethodNotAllowed,
			Detail: r.URL.Path + " answers " + m + " only."})
		return
	}
	writeProblem(w, problem{Type: probNoRoute, Status: http.StatusNotFound,
		Detail: "No admin endpoint has this path: " + AdminPath + " (GET), " + AdminPath + "/reset, " + AdminPath + "/clear and " + AdminPath + "/grant (POST)."})
}

// guard answers for a disabled API, then checks the bearer token: the
// presented token's SHA-256 against every configured one's, in constant
// time and without stopping at a match, so timing tells neither which
// token nor how much of one matched.
func (a *Admin) guard(h func(w http.ResponseWriter, r *http.Request, actor string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Enabled() {
			writeProblem(w, problem{Type: probAdminDisabled, Status: http.StatusNotFound,
				Detail: "The key admin API is disabled: no admin token is configured (admin_api.tokens, or EDGELIMIT_ADMIN_TOKEN)."})
			return
		}
		auth := r.Header.Get("Authorization")
		if len(auth) < 7 || !strings.EqualFold(auth[:7], "bearer ") {
			adminUnauthorized(w, "An admin token is needed: send Authorization: Bearer <token>.")
			return
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(auth[7:])))
		actor := ""
		for _, t := range a.tokens {
			if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
				actor = t.name
			}
		}
		if actor == "" {
			a.log.Warn("admin api: wrong token", "remote_addr", r.RemoteAddr, "path", r.URL.Path)
			adminUnauthorized(w, "Wrong admin token.")
			return
		}
		h(w, r, actor)
	})
}

func adminUnauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="edgelimit-gateway-admin"`)
	writeProblem(w, problem{Type: probAdminUnauthorized, Status: http.StatusUnauthorized, Detail: detail})
}

// Problem types of the admin API.
const (
	probAdminDisabled     = "urn:edgelimit:problem:admin-disabled"
	probAdminUnauthorized = "urn:edgelimit:problem:admin-unauthorized"
	probAdminNotFound     = "urn:edgelimit:problem:admin-key-not-found"
	probAdminStore        = "urn:edgelimit:problem:admin-store-failed"
)

// ruleSet is one bucket family a caller can hit: its plan's rules, a
// route's own plan, or the auth failure plan.
type ruleSet struct {
	// scope is "plan", "route", "auth-failure" or "check-plan" (a plan
	// POST /v1/check named).
	scope string
	route string
	// l is the request path's limits for this set (key, plan, rules),
	// directives not yet applied.
	l limits
}

// target is an identity and the rule sets the request asks about.
type target struct {
	id   identity
	sets []ruleSet
	// apiKeyID is the configured id when the caller is an API key.
	apiKeyID string
}

// resolve turns the query into the identity the gateway would compute for
// the caller and its rule sets, or the problem to answer.
func (a *Admin) resolve(r *http.Request, st *state) (target, *problem) {
	bad := func(status int, typ, detail string) (target, *problem) {
		return target{}, &problem{Type: typ, Status: status, Detail: detail}
	}
	q := r.URL.Query()
	for name := range q {
		switch name {
		case "api_key", "user", "ip", "route", "plan":
		case "rule", "units":
			if r.URL.Path != AdminPath+"/grant" {
				return bad(http.StatusBadRequest, probBadRequest, "Parameter "+strconv.Quote(name)+" is a grant's: POST "+AdminPath+"/grant.")
			}
		default:
			return bad(http.StatusBadRequest, probBadRequest, "Unknown parameter "+strconv.Quote(name)+": give one of api_key (its configured id), user or ip, and optionally route or plan.")
		}
	}
	var t target
	given := 0
	for _, name := range []string{"api_key", "user", "ip"} {
		if len(q[name]) > 1 {
			return bad(http.StatusBadRequest, probBadRequest, "Give "+name+" once.")
		}
		if q.Get(name) != "" {
			given++
		}
	}
	if given != 1 {
		return bad(http.StatusBadRequest, probBadRequest, "Give exactly one of api_key (its configured id, never the key), user or ip.")
	}
	switch {
	case q.Get("api_key") != "":
		id := q.Get("api_key")
		k := st.keyByID(id)
		if k == nil {
			// Not echoed: an operator may have pasted the key itself.
			return bad(http.StatusNotFound, probAdminNotFound, "No API key has this id in this gateway's configuration: give its api_keys[].id (default the first 16 hex digits of its sha256), never the key itself.")
		}
		t.id, t.apiKeyID = k.identity(), k.id
	case q.Get("user") != "":
		if st.user == nil {
			return bad(http.StatusNotFound, probAdminNotFound, "No user plan is configured, so no user is limited.")
		}
		t.id = identity{kind: event.KindUser, key: limiter.UserKey(q.Get("user")), plan: st.user}
	default:
		key, ok := limiter.IPKey(q.Get("ip"))
		if !ok {
			return bad(http.StatusBadRequest, probBadRequest, "ip "+strconv.Quote(q.Get("ip"))+" is not an IP address.")
		}
		t.id = identity{kind: event.KindIP, key: key, clientIP: q.Get("ip")}
		if st.anonymous != nil {
			t.id.plan = st.anonymous
		}
	}
	if q.Get("route") != "" && q.Get("plan") != "" {
		return bad(http.StatusBadRequest, probBadRequest, "Give route or plan, not both.")
	}
	if name := q.Get("plan"); name != "" {
		// POST /v1/check's "plan" (trusted proxies only) checks a bucket
		// of its own per caller and plan.
		p, ok := st.plans[name]
		if !ok {
			return bad(http.StatusBadRequest, probBadRequest, "No plan is named "+strconv.Quote(name)+".")
		}
		t.sets = []ruleSet{{scope: "check-plan", l: limits{key: t.id.key + "|p:" + name, plan: p, rules: p.rules}}}
		return t, nil
	}
	if name := q.Get("route"); name != "" {
		i := slices.IndexFunc(st.routes, func(rt *route) bool { return rt.Name == name })
		if i < 0 {
			return bad(http.StatusBadRequest, probBadRequest, "No route is named "+strconv.Quote(name)+".")
		}
		rt := st.routes[i]
		switch {
		case rt.Exempt:
			return bad(http.StatusBadRequest, probBadRequest, "Route "+strconv.Quote(name)+" is exempt: it checks no limit.")
		case rt.plan == nil && t.id.plan == nil:
			return bad(http.StatusNotFound, probAdminNotFound, "Route "+strconv.Quote(name)+" uses the caller's plan, and this caller has none (no anonymous_plan).")
		}
		t.sets = []ruleSet{t.setFor(st, rt)}
		return t, nil
	}
	if t.id.plan != nil {
		t.sets = append(t.sets, t.setFor(st, nil))
	}
	for _, rt := range st.routes {
		if rt.plan != nil && !rt.Exempt {
			t.sets = append(t.sets, t.setFor(st, rt))
		}
	}
	if t.id.kind == event.KindIP && st.authFailure != nil {
		// failedAuth's bucket: the address's own, apart from its traffic.
		t.sets = append(t.sets, ruleSet{scope: "auth-failure",
			l: limits{key: t.id.key + "|auth", plan: st.authFailure, rules: st.authFailure.rules}})
	}
	if len(t.sets) == 0 {
		return bad(http.StatusNotFound, probAdminNotFound, "No rule applies to this caller: it has no plan and no route has one.")
	}
	return t, nil
}

// setFor is the rule set rt (nil: a route without a plan of its own)
// checks for t's identity, as limitsFor computes it.
func (t target) setFor(st *state, rt *route) ruleSet {
	l := st.limitsFor(t.id, rt, false)
	if rt != nil && rt.plan != nil {
		return ruleSet{scope: "route", route: rt.Name, l: l}
	}
	return ruleSet{scope: "plan", l: l}
}

// keyByID finds a configured API key by its id.
func (st *state) keyByID(id string) *apiKey {
	for _, ks := range st.keys {
		for _, k := range ks {
			if k.id == id {
				return k
			}
		}
	}
	return nil
}

// bucket is one limiter key of a rule set and the rules checked under it:
// the shared one, or a gateway's own under a split directive.
type bucket struct {
	// name is "shared", or "gw:<gateway id>" ("gw:*" for the gateways a
	// split does not name).
	name  string
	key   string
	rules []limiter.Rule
	// inForce says this gateway checks this bucket now.
	inForce bool
}

// buckets lists the limiter keys of s as the directives in force leave
// them, the same way for a show, a reset and a clear: the shared bucket
// and, while a split applies, every gateway's own.
func (a *Admin) buckets(st *state, t target, s ruleSet, d *limiter.Directives, now time.Time) ([]bucket, directivesView) {
	var view directivesView
	l, id := s.l, t.id
	nat, split := a.g.directed(st, &id, &l, d, now)
	shared := s.l.rules
	if nat {
		n := d.NATs[id.key]
		view.NAT = &n
		shared, _ = d.NAT(id.key, s.l.rules, now)
	}
	out := []bucket{{name: "shared", key: s.l.key, rules: shared, inForce: !split}}
	if d == nil {
		return out, view
	}
	dk := limiter.DirectiveKey(id.kind.String(), a.g.keyID(&id))
	sd, ok := d.Splits[dk]
	if !ok || !now.Before(sd.Expires) {
		return out, view
	}
	view.Split, view.SplitSkipped = &sd, !split
	if !split {
		return out, view
	}
	for _, gw := range sortedKeys(sd.Shares) {
		sk, rules, ok := d.Split(dk, gw, shared, now)
		if !ok {
			continue
		}
		suffix := strings.TrimPrefix(sk, dk)
		out = append(out, bucket{name: strings.TrimPrefix(suffix, "/"), key: s.l.key + suffix, rules: rules, inForce: s.l.key+suffix == l.key})
	}
	return out, view
}

// adminTimeout bounds one admin request's store calls: an operator waits,
// a request path never does.
const adminTimeout = 5 * time.Second

func (a *Admin) show(w http.ResponseWriter, r *http.Request, _ string) {
	if r.URL.Query().Has("domain") {
		a.showDoor(w, r)
		return
	}
	st := a.g.st.Load()
	t, p := a.resolve(r, st)
	if p != nil {
		writeProblem(w, *p)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	a.writeView(w, a.view(ctx, st, t, ""))
}

// change resets or clears every bucket of t's rule sets, in the shared
// store and in this gateway's local fallback memory, and audits it.
func (a *Admin) change(w http.ResponseWriter, r *http.Request, actor, action string) {
	if r.URL.Query().Has("domain") {
		a.changeDoor(w, r, actor, action)
		return
	}
	st := a.g.st.Load()
	t, p := a.resolve(r, st)
	if p != nil {
		writeProblem(w, *p)
		return
	}
	ka, ok := a.g.store.(keyAdmin)
	if !ok {
		writeProblem(w, problem{Type: probAdminStore, Status: http.StatusNotImplemented, Detail: "This gateway's limiter store cannot reset keys."})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	now := a.g.now()
	d := a.g.currentDirectives()
	var failed error
	var done []string
	for _, s := range t.sets {
		bs, _ := a.buckets(st, t, s, d, now)
		var err error
		for _, b := range bs {
			err = errors.Join(err, apply(ctx, ka, action, b))
			if local, ok := any(a.g.local).(keyAdmin); ok && a.g.shared {
				// The local fallback's state of the key, so a reset also
				// holds while the shared store is down.
				_ = apply(ctx, local, action, b)
			}
		}
		if err != nil {
			failed = errors.Join(failed, fmt.Errorf("%s %s: %w", s.scope, s.route, err))
			continue
		}
		done = append(done, scopeName(s))
		a.audit(t, s, actor, action)
	}
	attrs := []any{"action", action, "actor", actor, "remote_addr", r.RemoteAddr, "kind", t.id.kind.String(),
		"key_id", a.g.keyID(&t.id), "rule_sets", done}
	if t.apiKeyID != "" {
		attrs = append(attrs, "api_key_id", t.apiKeyID) // a name from the config, not a secret
	}
	if failed != nil {
		a.log.Error("admin key "+action+" failed", append(attrs, "error", failed.Error())...)
		writeProblem(w, problem{Type: probAdminStore, Status: http.StatusServiceUnavailable,
			Detail: "The limiter store failed to " + action + " the key (" + strconv.Itoa(len(done)) + " of " + strconv.Itoa(len(t.sets)) + " rule sets done); see the gateway log, and retry."})
		return
	}
	a.log.Info("admin key "+action, attrs...)
	a.writeView(w, a.view(ctx, st, t, action))
}

func apply(ctx context.Context, ka keyAdmin, action string, b bucket) error {
	if action == "clear" {
		return ka.Clear(ctx, b.key)
	}
	return ka.Reset(ctx, b.key, b.rules)
}

func scopeName(s ruleSet) string {
	if s.route != "" {
		return s.scope + ":" + s.route
	}
	return s.scope + ":" + s.l.plan.name
}

// audit publishes the decision-stream record of one rule set's change:
// mode admin, the key id as decisions carry it, and the token's name.
func (a *Admin) audit(t target, s ruleSet, actor, action string) {
	if a.g.pub == nil {
		return
	}
	now := a.g.now()
	store := event.StoreOK
	if !a.g.shared {
		store = event.StoreUnknown
	}
	a.g.pub.Publish(event.Decision{
		ID: event.NewID(now), Time: now, GatewayID: a.g.gatewayID,
		KeyID: a.g.keyID(&t.id), KeyKind: t.id.kind, KeyName: t.id.name, ClientIP: t.id.clientIP,
		Route: s.route, Method: http.MethodPost, Plan: s.l.plan.name,
		// Nothing was decided: allowed, costing nothing, so a reader that
		// does not know mode admin counts no denial and no usage.
		Allowed: true, StoreStatus: store, Mode: event.ModeAdmin,
		Admin: event.AdminAction{Action: action, Actor: actor},
	})
}
