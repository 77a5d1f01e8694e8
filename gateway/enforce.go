package gateway

import (
	"context"
	"net/http"
	"strconv"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// call is one question to the enforcement step, whichever entry point
// (proxied traffic, POST /v1/check) asks it.
type call struct {
	id     identity
	limits limits
	cost   int64
	// reserved is a token route's reservation (see tokens.go), which its
	// events count as the cost; 0 elsewhere.
	reserved int64
	// route names the route in metrics and events ("check" for a decision
	// API call that names none).
	route     string
	method    string
	userAgent string
	// domain and descriptor: Envoy's rate limit API only (see Call).
	domain     string
	descriptor []DescriptorEntry
}

// enforce is the one enforcement step behind every entry point: the
// directives in force, one limiter call (or the failure policy when the
// store fails), the decision event and the decision metrics. A behaviour
// fixed here is fixed for every door; an entry point only turns its
// request into a call and the verdict into its response (answerFor).
func (g *Gateway) enforce(ctx context.Context, st *state, c *call) verdict {
	g.applyDirectives(st, &c.id, &c.limits)
	v := g.decide(ctx, st, c.limits, c.cost)
	if p := c.limits.plan; p != nil && sameRules(v.rules, p.rules) {
		v.policy = p.policy
	}
	g.publish(c, v)
	switch {
	case v.canceled:
	case v.err != nil:
		g.log.Error("limiter refused its input", "route", c.route, "error", v.err.Error())
	default:
		g.count(v)
	}
	return v
}

// sameRules reports whether a and b are one slice, not just equal ones:
// rules a directive or the failure policy changed are a slice of their own.
func sameRules(a, b []limiter.Rule) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// statusClientClosed is nginx's code for a client that went away before
// the answer; it only ever reaches metrics and logs.
const statusClientClosed = 499

// answer is how an entry point answers a verdict.
type answer struct {
	// status is 200 when the request may proceed.
	status int
	// problem is the body of a refusal; nil when allowed or canceled.
	problem *problem
	// retryAfter is the Retry-After value sent, in seconds; 0: none.
	retryAfter int64
}

// answerFor writes the verdict's rate-limit headers, and Retry-After when
// it refuses, into h, and returns the answer every entry point gives.
func answerFor(h http.Header, v verdict, st *state) answer {
	switch {
	case v.canceled:
		return answer{status: statusClientClosed}
	case v.err != nil:
		return answer{status: http.StatusInternalServerError, problem: &problem{Type: probInternal, Status: http.StatusInternalServerError}}
	}
	setRateHeaders(h, v)
	if v.allowed {
		return answer{status: http.StatusOK}
	}
	p, after := denial(v, st.jitter)
	// Set here, not only when written: the check API embeds the problem.
	p.Title = http.StatusText(p.Status)
	if after > 0 {
		h[hRetryAfter] = []string{strconv.FormatInt(after, 10)}
	}
	return answer{status: p.Status, problem: &p, retryAfter: after}
}

// write sends a refusal: its problem, or the bare status without one.
func (a answer) write(w http.ResponseWriter) {
	if a.problem == nil {
		w.WriteHeader(a.status)
		return
	}
	writeProblem(w, *a.problem)
}

// failedAuth answers a caller that failed authentication. It is first
// limited by its address under the auth failure plan, through enforce
// like any decision (event, metrics, rate-limit headers into h), so API
// keys cannot be guessed at line rate: over that limit the answer is the
// 429, else the refusal (401). The bucket is the address's own, apart
// from its anonymous traffic's.
func (g *Gateway) failedAuth(ctx context.Context, h http.Header, st *state, e identifyError, c call) problem {
	if e == errBadForwardedFor || e == errAmbiguousKey || e == errAmbiguousUser {
		return g.refusal(e)
	}
	if p := g.chargeFailure(ctx, h, st, c); p != nil {
		return *p
	}
	return g.refusal(e)
}

// chargeFailure charges one unit to the address c.id.clientIP under the
// auth failure plan, through enforce, writing its rate-limit headers into
// h: the refusal to send instead when that bucket refuses (429, or 503
// failed closed), else nil. Without an auth failure plan it charges
// nothing.
func (g *Gateway) chargeFailure(ctx context.Context, h http.Header, st *state, c call) *problem {
	if st.authFailure == nil {
		return nil
	}
	c.id.kind, c.id.key, c.id.plan = event.KindIP, ipKey(c.id.clientIP), st.authFailure
	c.limits = limits{key: c.id.key + "|auth", plan: st.authFailure, rules: st.authFailure.rules}
	c.cost = 1
	if a := answerFor(h, g.enforce(ctx, st, &c), st); a.status != http.StatusOK && a.problem != nil {
		return a.problem
	}
	return nil
}

// refuse answers with p a request the gateway refuses before deciding it
// (no route matches; its path, body or upgrade is one it will not pass
// on; guard's: it is no call at all), after chargeRefused: over that
// limit the answer is its 429 instead, and p, like failedAuth's 401, is
// not counted in rejected_total under reason ("": not counted at all).
// route is the matched route's name ("" for none), for events.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, st *state, reason, route string, p problem) {
	if d := g.chargeRefused(w.Header(), r, st, route); d != nil {
		writeProblem(w, *d)
		return
	}
	if reason != "" {
		g.m.rejected.WithLabelValues(reason).Inc()
	}
	writeProblem(w, p)
}

// chargeRefused charges a request refused before its decision to its
// address's auth failure bucket, like a failed authentication, writing
// its rate-limit headers into h: otherwise such requests were free, a
// client could send them at line rate (probing for routes), and their
// answers had no rate-limit headers. It returns the answer to send
// instead when that bucket refuses; nil to send the refusal.
func (g *Gateway) chargeRefused(h http.Header, r *http.Request, st *state, route string) *problem {
	// An X-Forwarded-For a trusted hop garbled leaves no address to
	// charge; identify refuses such a request on every route anyway.
	ip, ok := st.clientIP(r)
	if !ok {
		return nil
	}
	c := call{id: identity{clientIP: ip, peerTrusted: st.peerTrusted(r)}, route: route, method: eventMethod(r.Method), userAgent: r.UserAgent()}
	return g.chargeFailure(r.Context(), h, st, c)
}

// refusal is the answer to a caller that could not be identified, counted
// by its reason.
func (g *Gateway) refusal(e identifyError) problem {
	r, ok := refusals[e]
	if !ok {
		r = refusals[errKeyRequired]
	}
	g.m.rejected.WithLabelValues(r.reason).Inc()
	return r.problem
}

// refusals are the answers to callers that could not be identified, with
// the rejected_total reason of each.
var refusals = map[identifyError]struct {
	reason string
	problem
}{
	errBadForwardedFor: {"bad_forwarded_for", problem{Type: probBadRequest, Status: http.StatusBadRequest,
		Detail: "X-Forwarded-For holds an entry that is not an IP address where a trusted proxy names the client."}},
	errAmbiguousKey: {"ambiguous_key", problem{Type: probBadRequest, Status: http.StatusBadRequest,
		Detail: "The request carries more than one API key (X-API-Key fields, or X-API-Key and Authorization: Bearer, that differ); send one."}},
	errAmbiguousUser: {"ambiguous_user", problem{Type: probBadRequest, Status: http.StatusBadRequest,
		Detail: "The user header holds two different users; the trusted proxy must replace the client's, not add its own."}},
	errUnknownKey: {"unknown_key", problem{Type: probUnknownKey, Status: http.StatusUnauthorized,
		Detail: "The API key is not known to this gateway."}},
	errKeyRequired: {"key_required", problem{Type: probKeyRequired, Status: http.StatusUnauthorized,
		Detail: "This gateway needs an API key (X-API-Key or Authorization: Bearer)."}},
}
