package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/edgelimit/edgelimit/gateway/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// checker is what the gateway needs of a limiter store: *limiter.Redis and
// *limiter.Memory both fit.
type checker interface {
	Allow(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error)
}

// denialCache is a store's memory of its own recent denials
// (*limiter.Redis has one), asked while the store is unavailable.
type denialCache interface {
	CachedDenial(key string, rules []limiter.Rule, cost int64) (limiter.Decision, bool)
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

// decide makes exactly one limiter call for all rules of l, bounded by the
// store deadline and guarded by the circuit breaker; when the shared store
// fails, the failure policy decides.
func (g *Gateway) decide(ctx context.Context, st *state, l limits, cost int64) verdict {
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
	budget, short := storeBudget(ctx, st.cfg.StoreDeadline)
	cctx, cancel := context.WithTimeout(ctx, budget)
	d, err := g.store.Allow(cctx, l.key, l.rules, cost)
	cancel()
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
