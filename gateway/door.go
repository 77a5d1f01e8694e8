package gateway

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// Call is one question an entry point outside this package (the Envoy rate
// limit service, gateway/envoyrls) asks the enforcement step: the rules to
// check, all-or-nothing, under one key, in one limiter call when they are
// at most limiter.MaxRules, else in several, an earlier one's charge
// given back when a later one refuses (see decide). It goes through
// the same step as proxied traffic and POST /v1/check: directives, the
// store deadline and circuit breaker, the failure policies, the deny
// cache, the decision event and the decision metrics.
type Call struct {
	// Key is the limiter key: every rule's bucket lives under it (one hash
	// tag, so one Redis Cluster slot).
	Key string
	// Identity names the caller in events and directives: the event's key
	// id is its keyed hash, never the value itself. Default Key.
	Identity string
	// Kind is the identity's kind in events; default event.KindUnknown.
	Kind event.KeyKind
	// ClientIP is the caller's address, when known.
	ClientIP string
	// Plan names the rules in events.
	Plan string
	// Rules are checked together; a rule without a failure policy takes the
	// configuration's default. Rules that give back (negative Cost) go
	// last: of more than limiter.MaxRules, only the charges are given
	// back when a later call refuses.
	Rules []Rule
	// Cost is how many units the call uses; at least 1.
	Cost int64
	// Route and Method label the call in metrics and events.
	Route, Method string
	// UserAgent is hashed into the event.
	UserAgent string
	// Domain and Descriptor are the Envoy rate limit request's, for the
	// event: bounded by the caller (MaxDescriptorEntries, the lengths
	// the event allows), values that may be secrets marked.
	Domain     string
	Descriptor []DescriptorEntry
}

// Outcome is what became of a Call, for an entry point that answers in
// another protocol than HTTP (the Envoy door maps it to gRPC).
type Outcome int

// Outcomes of a Call.
const (
	// Allowed: the request may proceed (shadow rules and failing open
	// included).
	Allowed Outcome = iota
	// OverLimit: a rule denied it, or it could not be decided as sent
	// (Refuse).
	OverLimit
	// FailedClosed: the store was unavailable and a rule's failure policy
	// refused it.
	FailedClosed
	// Canceled: the caller went away before a decision.
	Canceled
	// Refused: the limiter refused the call's input (its rules or cost).
	Refused
)

// Verdict is the enforcement step's answer to a Call.
type Verdict struct {
	// Outcome is what became of the call; Status says the same in HTTP.
	Outcome Outcome
	// Status is what an HTTP entry point would answer: 200 allowed, 429
	// over a limit, 503 failed closed, 499 the caller went away, 500 the
	// limiter refused its input.
	Status int
	// Allowed is true when the request may proceed (shadow rules and
	// failing open included).
	Allowed bool
	// Decision holds one result per rule, in Call.Rules order, when a store
	// decided (Known). Under local fallback its rules are this gateway's
	// shares of the local rules only.
	Decision limiter.Decision
	Known    bool
	// Rules are the rules in force, as directives left them.
	Rules []limiter.Rule
	// Mode and Store are the event's.
	Mode  event.Mode
	Store event.StoreStatus
	// RetryAfter is the Retry-After value in seconds, jitter included; 0:
	// none.
	RetryAfter int64
	// Detail explains a refusal in words.
	Detail string
	// Problem is the application/problem+json body an HTTP entry point
	// sends with a refusal (naming the violated rules); nil when allowed.
	Problem []byte
}

// Enforce decides c with the enforcement step every entry point shares and
// writes into h the headers an HTTP entry point would send for it (the
// rate-limit headers, and Retry-After on a refusal).
func (g *Gateway) Enforce(ctx context.Context, c Call, h http.Header) Verdict {
	st := g.st.Load()
	q := c.call(st)
	v := g.enforce(ctx, st, &q)
	a := answerFor(h, v, st)
	out := Verdict{Status: a.status, Allowed: v.allowed && !v.canceled && v.err == nil, Decision: v.d, Known: v.known,
		Rules: v.rules, Mode: v.mode, Store: v.store, RetryAfter: a.retryAfter}
	switch {
	case v.canceled:
		out.Outcome = Canceled
	case v.err != nil:
		out.Outcome = Refused
	case out.Allowed:
		out.Outcome = Allowed
	case a.status == http.StatusServiceUnavailable:
		out.Outcome = FailedClosed
	default:
		out.Outcome = OverLimit
	}
	if a.problem != nil {
		p := *a.problem
		if p.Title == "" {
			p.Title = http.StatusText(p.Status)
		}
		out.Detail = p.Detail
		out.Problem, _ = json.Marshal(p)
	}
	return out
}

// call is c as the enforcement step takes it.
func (c Call) call(st *state) call {
	p := compilePlan(c.Plan, c.Rules, st.cfg)
	id := c.Identity
	if id == "" {
		id = c.Key
	}
	return call{
		id:     identity{kind: c.Kind, key: id, plan: p, clientIP: c.ClientIP},
		limits: limits{key: c.Key, plan: p, rules: p.rules},
		cost:   max(1, c.Cost), route: c.Route, method: c.Method, userAgent: c.UserAgent,
		domain: c.Domain, descriptor: c.Descriptor,
	}
}

// Refuse answers c over the limit without asking the store: for a request
// an entry point cannot decide as sent (the Envoy door's: more
// descriptors or entries than it checks, a message over its size), which
// an error would hand to a caller that may let it through. The refusal
// is a decision like any: a decision event (mode enforced, store status
// unknown, no store having been asked, no binding rule) and a denial in
// decisions_total (rule "none"). detail says why; there is no
// Retry-After, since waiting does not help. c's Rules may be empty.
func (g *Gateway) Refuse(c Call, detail string) Verdict {
	q := c.call(g.st.Load())
	v := verdict{mode: event.ModeEnforced, store: event.StoreUnknown}
	g.publish(&q, v)
	g.count(v)
	p := problem{Type: probUndecidable, Status: http.StatusTooManyRequests, Title: http.StatusText(http.StatusTooManyRequests), Detail: detail}
	body, _ := json.Marshal(p)
	return Verdict{Outcome: OverLimit, Status: p.Status, Mode: v.mode, Store: v.store, Detail: detail, Problem: body}
}
