package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// checker is what the gateway needs of a limiter store: *limiter.Redis and
// *limiter.Memory both fit.
type checker interface {
	Allow(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error)
}

// denialCache is a store's memory of its own recent denials
// (*limiter.Redis has one), asked before the store's deadline is set up
// and while the store is unavailable.
type denialCache interface {
	CachedDenial(key string, rules []limiter.Rule, cost int64) (limiter.Decision, bool)
	// AllowUncachedWithin is Allow without asking the cache again, given
	// within to answer in (no context and timer of its own per request).
	AllowUncachedWithin(ctx context.Context, within time.Duration, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error)
}

// verdict is the outcome of one request's limit check, whichever store or
// policy made it.
type verdict struct {
	// d is the limiter's decision; valid only when known.
	d     limiter.Decision
	known bool
	// rules are the rules in force: the plan's, or this gateway's local
	// shares in local fallback.
	rules []limiter.Rule
	// policy is the RateLimit-Policy of rules when known ahead (the
	// plan's own rules); "": render it from rules.
	policy  string
	allowed bool
	mode    event.Mode
	store   event.StoreStatus
	latency time.Duration
	// retry is when to come back after a fail-closed 503, or after a local
	// fallback denial no wait for the local share can lift.
	retry time.Duration
	// canceled: the client went away before a decision.
	canceled bool
	// err is a bug: input the limiter refused. It answers 500.
	err error
}

// decide is the decision: l's rules checked and charged in one limiter
// call (decideOne) when they fit in one (limiter.MaxRules), else in calls
// of at most MaxRules rules each, in order, until one refuses. Each call is all-or-nothing, and
// what the calls before a refusal charged is given back before the
// answer, so the request stays all-or-nothing as seen from outside: it
// never admits more than any rule allows, and a refused request keeps
// nothing. Between the charge and its give-back, a concurrent request
// may be refused by the units held for that moment (under-admission,
// never over). Rules that give back (negative Cost) are never given
// back in turn: they belong last, where only an admitted request
// reaches them.
func (g *Gateway) decide(ctx context.Context, st *state, l limits, cost int64) verdict {
	if l.rules == nil {
		l.rules = l.plan.rules
	}
	if len(l.rules) <= limiter.MaxRules {
		return g.decideOne(ctx, st, l, cost)
	}
	var parts []verdict
	var scopes []limits
	for lo := 0; lo < len(l.rules); lo += limiter.MaxRules {
		hi := min(lo+limiter.MaxRules, len(l.rules))
		part := l
		part.plan, part.rules = l.plan.part(lo, hi), l.rules[lo:hi]
		v := g.decideOne(ctx, st, part, cost)
		parts, scopes = append(parts, v), append(scopes, part)
		if !v.allowed || v.canceled || v.err != nil {
			break
		}
	}
	last := parts[len(parts)-1]
	if !last.allowed || last.canceled || last.err != nil {
		for i := range parts[:len(parts)-1] {
			g.giveBack(ctx, st, scopes[i], &parts[i], cost)
		}
	}
	return merge(parts)
}

// decideOne makes exactly one limiter call for all rules of l, bounded by
// the store deadline and guarded by the circuit breaker; when the shared
// store fails, the failure policy decides.
func (g *Gateway) decideOne(ctx context.Context, st *state, l limits, cost int64) verdict {
	if l.rules == nil {
		l.rules = l.plan.rules
	}
	start := g.now()
	if !g.shared {
		d, err := g.store.Allow(ctx, l.key, l.rules, cost)
		lat := g.now().Sub(start)
		g.m.localOK.Observe(lat.Seconds())
		if err != nil {
			return verdict{err: err}
		}
		return enforced(d, l.rules, event.StoreOK, lat)
	}
	ok, probe := g.breaker.allow(start)
	if !ok {
		g.m.storeUnavailable.WithLabelValues("circuit_open").Inc()
		return g.fallback(ctx, st, l, cost, event.StoreUnavailable, start)
	}
	dc, asked := g.store.(denialCache)
	if asked {
		// The store's own deny cache, asked before the store's deadline
		// is set up (a context and a timer): the abusive client's answer
		// is the cheap one, and the store's Allow would answer the same.
		if d, ok := dc.CachedDenial(l.key, l.rules, cost); ok {
			g.breaker.abandon(probe) // answered without asking the store
			lat := g.now().Sub(start)
			g.m.sharedOK.Observe(lat.Seconds())
			return enforced(d, l.rules, event.StoreLocalCache, lat)
		}
	}
	budget, short := storeBudget(ctx, st.cfg.StoreDeadline)
	var d limiter.Decision
	var err error
	if asked {
		d, err = dc.AllowUncachedWithin(ctx, budget, l.key, l.rules, cost)
	} else {
		cctx, cancel := context.WithTimeout(ctx, budget)
		d, err = g.store.Allow(cctx, l.key, l.rules, cost)
		cancel()
	}
	lat := g.now().Sub(start)
	if err == nil {
		if d.Cached || d.Reason != "" {
			g.breaker.abandon(probe) // answered without asking the store
		} else {
			g.breaker.success()
		}
		status := event.StoreOK
		if d.Cached {
			status = event.StoreLocalCache
		}
		g.m.sharedOK.Observe(lat.Seconds())
		return enforced(d, l.rules, status, lat)
	}
	if ctx.Err() != nil {
		g.breaker.abandon(probe)
		return verdict{canceled: true}
	}
	if isInputError(err) {
		g.breaker.abandon(probe)
		return verdict{err: err}
	}
	status, reason := event.StoreUnavailable, "error"
	switch {
	case short && isTimeout(err):
		// The caller's time ran out, not the store's: its answer is the
		// failure policy's, but a caller's impatience is no sign the store
		// is down, so the breaker is not told.
		g.breaker.abandon(probe)
		status, reason = event.StoreTimeout, "caller_deadline"
	case errors.Is(err, limiter.ErrMigrating):
		// One Cluster slot was moving past the deadline: the store is up,
		// and opening the circuit would hand every key, not just this
		// slot's, to the failure policy.
		g.breaker.abandon(probe)
		reason = "migrating"
	case isTimeout(err):
		g.breaker.failure(start, g.now())
		status, reason = event.StoreTimeout, "timeout"
	default:
		g.breaker.failure(start, g.now())
	}
	g.m.checkLatency.WithLabelValues("shared", reason).Observe(lat.Seconds())
	g.m.storeUnavailable.WithLabelValues(reason).Inc()
	v := g.fallback(ctx, st, l, cost, status, start)
	v.latency = lat
	return v
}

// storeBudget is how long the store call may take: the store deadline, or
// less when the caller has a deadline of its own that comes sooner (a gRPC
// client's: Envoy's default is 20ms, below the default store deadline),
// leaving it the time to get the failure policy's answer (short) rather
// than none, which Envoy would let through whatever the policy.
func storeBudget(ctx context.Context, deadline time.Duration) (budget time.Duration, short bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return deadline, false
	}
	left := time.Until(dl)
	left -= left / 5 // to answer in
	if left >= deadline {
		return deadline, false
	}
	return max(left, 0), true
}

func enforced(d limiter.Decision, rules []limiter.Rule, status event.StoreStatus, lat time.Duration) verdict {
	v := verdict{d: d, known: true, rules: rules, allowed: d.Allowed, mode: event.ModeEnforced, store: status, latency: lat}
	if d.Allowed {
		for _, r := range d.Rules {
			if r.Rule.Shadow && !r.Allowed {
				v.mode = event.ModeShadow
				break
			}
		}
	}
	return v
}

// fallback applies the failure policy of l's rules while the shared store
// is unavailable: any enforced rule that fails closed refuses the request;
// otherwise rules that fail locally are checked at this gateway's share in
// memory; rules that fail open are skipped.
func (g *Gateway) fallback(ctx context.Context, st *state, l limits, cost int64, status event.StoreStatus, now time.Time) verdict {
	if l.rules == nil {
		l.rules = l.plan.rules
	}
	if dc, ok := g.store.(denialCache); ok {
		// A denial the store gave still holds whatever the policy: failing
		// open must not let through a caller known to be over its limit.
		if d, ok := dc.CachedDenial(l.key, l.rules, cost); ok {
			return enforced(d, l.rules, event.StoreLocalCache, g.now().Sub(now))
		}
	}
	p := l.plan
	v := verdict{rules: l.rules, store: status}
	switch {
	case p.closed:
		v.mode = event.ModeFailClosed
		v.retry = max(time.Second, g.breaker.retryIn(now))
		g.m.failClosed.Inc()
	case p.local:
		rules := st.localRules(l)
		start := g.now()
		d, err := g.local.Allow(ctx, l.key, rules, cost)
		g.m.localOK.Observe(g.now().Sub(start).Seconds())
		if err != nil {
			return verdict{err: err}
		}
		v.d, v.known, v.allowed, v.mode, v.rules = d, true, d.Allowed, event.ModeLocalFallback, rules
		if d.Reason != "" {
			// The cost exceeds this gateway's share though maybe not the
			// shared limit: it may pass once the store is back.
			v.retry = max(time.Second, g.breaker.retryIn(now))
		}
	default:
		v.allowed, v.mode = true, event.ModeFailOpen
		g.m.failOpen.Inc()
	}
	return v
}

// giveBack returns what v, an admitted part of a refused request, charged
// to l's rules: in the store that decided it (the local fallback's
// memory, or the shared store), with a deadline of its own, since the
// caller may have gone. v's results then read as after the give-back. A
// part the failure policy let through without a store charged nothing. A
// give-back that fails leaves the charge: under-admission, logged.
func (g *Gateway) giveBack(ctx context.Context, st *state, l limits, v *verdict, cost int64) {
	if !v.known || !v.d.Allowed {
		return
	}
	var rules []limiter.Rule
	var at []int
	for i, rr := range v.d.Rules {
		c := rr.Rule.Cost
		if c == 0 {
			c = cost
		}
		if !rr.Allowed || c < 0 {
			continue // not charged (a shadow rule over its limit), or a give-back itself
		}
		r := rr.Rule
		r.Cost = -c
		rules, at = append(rules, r), append(at, i)
	}
	if len(rules) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.cfg.StoreDeadline)
	defer cancel()
	d, err := g.chargedBy(*v).Allow(ctx, l.key, rules, 1)
	if err != nil {
		g.m.giveBackFailed.Inc()
		g.log.Warn("give back the charge of a refused request", "rules", len(rules), "error", err.Error())
		return
	}
	out := append([]limiter.RuleResult(nil), v.d.Rules...)
	for j, rr := range d.Rules {
		out[at[j]].Remaining, out[at[j]].ResetAfter = rr.Remaining, rr.ResetAfter
	}
	v.d.Rules = out
}

// chargedBy is the store that decided v, and charged what it admitted:
// the local fallback's memory, or the shared store; nil when no store
// decided (the failure policy let it through or refused it).
func (g *Gateway) chargedBy(v verdict) checker {
	switch {
	case !v.known:
		return nil
	case v.mode == event.ModeLocalFallback:
		return g.local
	}
	return g.store
}

// merge is the verdict of a request decided in parts (decide): the
// last part's decision, with the results of every part that was decided,
// in order; its mode and store status those of the first part that was
// not plainly enforced by the store, or the refusing part's.
func merge(parts []verdict) verdict {
	last := parts[len(parts)-1]
	if last.canceled || last.err != nil {
		return last
	}
	v := verdict{known: true, allowed: last.allowed, mode: event.ModeEnforced, store: event.StoreOK, retry: last.retry}
	offset, binding := 0, -1
	for _, p := range parts {
		v.rules = append(v.rules, p.rules...)
		v.latency += p.latency
		if v.mode == event.ModeEnforced {
			v.mode = p.mode
		}
		if v.store == event.StoreOK {
			v.store = p.store
		}
		if !p.known {
			v.known = false
			continue
		}
		v.d.Rules = append(v.d.Rules, p.d.Rules...)
		if b := offset + p.d.Binding; binding < 0 || binds(v.d.Rules[b], v.d.Rules[binding]) {
			binding = b
		}
		offset += len(p.d.Rules)
	}
	if !last.allowed {
		v.mode, v.store = last.mode, last.store
	}
	if !v.known {
		v.d = limiter.Decision{}
		return v
	}
	v.d.Allowed, v.d.Reason, v.d.Cached, v.d.Time = last.allowed, last.d.Reason, last.d.Cached, last.d.Time
	v.d.Binding = binding
	if !last.allowed {
		v.d.Binding = offset - len(last.d.Rules) + last.d.Binding
	}
	return v
}

// binds reports whether a, a binding rule of one admitted part, binds more
// tightly than b, another's, as the limiter picks a binding rule: an
// enforced rule before a shadow one, then the fewest remaining, then the
// longest until full.
func binds(a, b limiter.RuleResult) bool {
	if a.Rule.Shadow != b.Rule.Shadow {
		return !a.Rule.Shadow
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// part is the plan of rules[lo:hi], with their failure policies.
func (p *plan) part(lo, hi int) *plan {
	q := &plan{name: p.name, rules: p.rules[lo:hi], policies: p.policies[lo:hi]}
	for i, r := range q.rules {
		if r.Shadow {
			continue
		}
		switch q.policies[i] {
		case FailClosed:
			q.closed = true
		case FailLocal:
			q.local = true
		}
	}
	return q
}

// isInputError tells the limiter refusing its input (a bug here) from the
// store failing (the failure policy's business).
func isInputError(err error) bool { return errors.Is(err, limiter.ErrInput) }

// count records a verdict in the decision metrics.
func (g *Gateway) count(v verdict) {
	result := "allowed"
	if !v.allowed {
		result = "denied"
	}
	rule := "none"
	if v.known && len(v.d.Rules) > 0 {
		rule = v.d.BindingRule().Rule.Name
	}
	g.m.decisions.WithLabelValues(result, rule, v.mode.String()).Inc()
}
