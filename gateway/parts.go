package gateway

import (
	"context"

	"github.com/edgelimit/edgelimit/gateway/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// decideParts decides l's rules like decide, in one limiter call when they
// fit in one (limiter.MaxRules), else in calls of at most MaxRules rules
// each, in order, until one refuses. Each call is all-or-nothing, and
// what the calls before a refusal charged is given back before the
// answer, so the request stays all-or-nothing as seen from outside: it
// never admits more than any rule allows, and a refused request keeps
// nothing. Between the charge and its give-back, a concurrent request
// may be refused by the units held for that moment (under-admission,
// never over). Rules that give back (negative Cost) are never given
// back in turn: they belong last, where only an admitted request
// reaches them.
func (g *Gateway) decideParts(ctx context.Context, st *state, l limits, cost int64) verdict {
	if l.rules == nil {
		l.rules = l.plan.rules
	}
	if len(l.rules) <= limiter.MaxRules {
		return g.decide(ctx, st, l, cost)
	}
	var parts []verdict
	var scopes []limits
	for lo := 0; lo < len(l.rules); lo += limiter.MaxRules {
		hi := min(lo+limiter.MaxRules, len(l.rules))
		part := l
		part.plan, part.rules = l.plan.part(lo, hi), l.rules[lo:hi]
		v := g.decide(ctx, st, part, cost)
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
	var store checker = g.store
	if v.mode == event.ModeLocalFallback {
		store = g.local
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.cfg.StoreDeadline)
	defer cancel()
	d, err := store.Allow(ctx, l.key, rules, 1)
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

// merge is the verdict of a request decided in parts (decideParts): the
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
