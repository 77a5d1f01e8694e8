package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/bodyscan"
	"github.com/edgelimit/edgelimit/limiter"
)

// state is one configuration, compiled for the request path. A reload
// builds a new one and swaps it in; requests keep the one they started with.
type state struct {
	cfg       Config
	plans     map[string]*plan
	anonymous *plan // nil: callers need a key
	user      *plan
	keys      map[uint64][]*apiKey // by the first 8 bytes of the SHA-256
	routes    []*route             // longest prefix first
	trusted   []*net.IPNet
	strip     headerSet     // removed from untrusted peers' requests
	keyParams []string      // query parameters that carry an API key
	bodyNames []string      // bodyscan.OverrideParams and keyParams: a body read for both (scanBody)
	jitter    time.Duration // the most jitter added to Retry-After

	// authFailure limits failed authentication by address; nil: off.
	authFailure *plan
}

// plan is a compiled list of rules with their failure policies.
type plan struct {
	name     string
	rules    []limiter.Rule
	policy   string // RateLimit-Policy of rules, rendered once
	policies []FailurePolicy
	local    bool // some enforced rule fails locally
	closed   bool // some enforced rule fails closed
	// tokens and inflight index the rules that count tokens
	// (plans.UnitTokens) and requests in flight; noTokens and forCheck
	// are the plans routes without a tokens setting and the check API
	// check instead (nil: the same rules). See planVariants.
	tokens, inflight   []int
	noTokens, forCheck *plan
}

type apiKey struct {
	id string
	// name is the configured id, which events carry for people to read;
	// empty when the id defaults to a digest of the key, which is no name
	// and would put a derivative of the key in every event.
	name string
	sum  [sha256.Size]byte
	plan *plan
}

type route struct {
	Route
	prefix   string // without a trailing slash, unless it is "/"
	subtree  bool   // prefix ended in "/": match anything below
	methods  []string
	plan     *plan // nil: the caller's plan
	upstream *upstream
}

func compile(cfg Config, ups map[string]*upstream) (*state, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	st := &state{
		cfg:   cfg,
		plans: make(map[string]*plan, len(cfg.Plans)),
		keys:  make(map[uint64][]*apiKey, len(cfg.APIKeys)),
	}
	for name, p := range cfg.Plans {
		st.plans[name] = compilePlan(name, p.Rules, cfg)
	}
	st.anonymous = st.plans[cfg.AnonymousPlan]
	st.user = st.plans[cfg.UserPlan]
	switch cfg.AuthFailurePlan {
	case "-":
	case "":
		st.authFailure = compilePlan(DefaultAuthFailureRule.Name, []Rule{{Rule: DefaultAuthFailureRule}}, cfg)
	default:
		st.authFailure = st.plans[cfg.AuthFailurePlan]
	}
	for _, k := range cfg.APIKeys {
		sum := strings.ToLower(k.SHA256)
		ak := &apiKey{id: k.ID, name: k.ID, plan: st.plans[k.Plan]}
		if ak.id == "" {
			ak.id = sum[:16]
		}
		_, _ = hex.Decode(ak.sum[:], []byte(sum))
		if len(k.Overrides) > 0 {
			rules := slices.Clone(cfg.Plans[k.Plan].Rules)
			for i, r := range rules {
				if o, ok := k.Overrides[r.Name]; ok {
					rules[i] = o.Apply(r)
				}
			}
			ak.plan = compilePlan(k.Plan, rules, cfg)
		}
		b := binary.BigEndian.Uint64(ak.sum[:8])
		st.keys[b] = append(st.keys[b], ak)
	}
	for _, r := range cfg.Routes {
		rt := &route{Route: r, plan: st.plans[r.Plan], upstream: ups[r.Upstream]}
		rt.prefix = r.PathPrefix
		if cfg.Paths.IgnoreCase {
			rt.prefix = strings.ToLower(rt.prefix)
		}
		if len(rt.prefix) > 1 && strings.HasSuffix(rt.prefix, "/") {
			rt.prefix = strings.TrimSuffix(rt.prefix, "/")
			rt.subtree = true
		}
		for _, m := range r.Methods {
			rt.methods = append(rt.methods, strings.ToUpper(m))
		}
		st.routes = append(st.routes, rt)
	}
	headAtGet(st.routes)
	slices.SortStableFunc(st.routes, func(a, b *route) int {
		if len(a.prefix) != len(b.prefix) {
			return len(b.prefix) - len(a.prefix)
		}
		// Method-specific routes before any-method ones.
		return len(b.methods) - len(a.methods)
	})
	for _, p := range cfg.TrustedProxies {
		n, _ := parseCIDR(p)
		st.trusted = append(st.trusted, n)
	}
	st.keyParams = keyParams(cfg)
	st.bodyNames = append(slices.Clone(bodyscan.OverrideParams), st.keyParams...)
	st.strip = newHeaderSet(append(slices.Clone(cfg.StripHeaders), cfg.UserHeader, ProxySecretHeader)...)
	st.jitter = cfg.RetryJitter
	return st, nil
}

func compilePlan(name string, rules []Rule, cfg Config) *plan {
	p := &plan{name: name, rules: make([]limiter.Rule, 0, len(rules)), policies: make([]FailurePolicy, 0, len(rules))}
	for _, r := range rules {
		pol := r.FailurePolicy
		if pol == "" {
			pol = cfg.FailurePolicy
		}
		lr := r.Limiter()
		p.rules = append(p.rules, lr)
		p.policies = append(p.policies, pol)
		if lr.Shadow {
			continue // a shadow rule never denies, so it needs no fallback
		}
		switch pol {
		case FailClosed:
			p.closed = true
		case FailLocal:
			p.local = true
		}
	}
	p.policy = policyHeader(p.rules)
	planVariants(p, rules, cfg)
	return p
}

// lookupKey finds a raw API key. The map is indexed by the first 8 bytes
// of the key's SHA-256, so the lookup's timing reveals at most whether some
// known key's hash starts like the presented key's hash, which without a
// preimage is worthless; the full hash is compared in constant time.
func (st *state) lookupKey(raw string) *apiKey {
	sum := sha256.Sum256([]byte(raw))
	var found *apiKey
	for _, k := range st.keys[binary.BigEndian.Uint64(sum[:8])] {
		if subtle.ConstantTimeCompare(k.sum[:], sum[:]) == 1 {
			found = k
		}
	}
	return found
}

// match finds the route of a request by its normalised path (see
// normalizePath): the path the upstream will be sent.
func (st *state) match(method, p string) *route {
	clean := routePath(p, st.cfg.Paths)
	for _, rt := range st.routes {
		if !rt.matchPath(clean) {
			continue
		}
		if len(rt.methods) == 0 || rt.allowsMethod(method) {
			return rt
		}
	}
	return nil
}

// headAtGet lets each route that lists GET take HEAD too, unless a route
// at its path lists HEAD itself: Go's ServeMux, Express, Rails and Django
// run a HEAD with the GET handler, so a HEAD charged on a cheaper route
// would run the GET route's work (all but the body) at that price.
func headAtGet(routes []*route) {
	var own []string // the paths of routes listing HEAD
	for _, rt := range routes {
		if slices.Contains(rt.methods, http.MethodHead) {
			own = append(own, rt.PathPrefix)
		}
	}
	for _, rt := range routes {
		if slices.Contains(rt.methods, http.MethodGet) && !slices.Contains(own, rt.PathPrefix) {
			rt.methods = append(rt.methods, http.MethodHead)
		}
	}
}

// allowsMethod matches methods regardless of case. RFC 9110 makes them
// case-sensitive, but Django and Werkzeug upper-case the method before
// dispatching: "post" run as a POST must be charged as one, not fall to a
// cheaper any-method route.
func (rt *route) allowsMethod(method string) bool {
	for _, m := range rt.methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

func (rt *route) matchPath(p string) bool {
	if rt.prefix == "/" {
		return true
	}
	if !strings.HasPrefix(p, rt.prefix) {
		return false
	}
	rest := p[len(rt.prefix):]
	if rt.subtree {
		return strings.HasPrefix(rest, "/")
	}
	return rest == "" || rest[0] == '/'
}
