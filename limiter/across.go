package limiter

import (
	"context"
	"fmt"
	"time"
)

// A check whose rules lie in several Redis Cluster slots (buckets under
// tags of their own, Rule.Tag) cannot be one script call: a script's keys
// share a slot. It is decided slot by slot instead, each slot's rules in
// one atomic call, all of them at once; if any slot denies, what the
// others charged is given back before the answer. No rule ever admits
// over its limit (each is charged atomically before the request is
// allowed), and a denied request leaves nothing charged once its answer
// is given. Between a charge and its give-back, concurrent checks of the
// same buckets see less than is there and may be denied: the price of
// exactness across slots, paid only by requests whose slots disagree.

// slotGroups returns the indexes of rules grouped by the Cluster slot of
// their containers, in the order the slots first appear.
func (r *Redis) slotGroups(key string, rules []Rule) [][]int {
	var groups [][]int
	var slots []uint16
	for i, rule := range rules {
		slot := keySlot(containerKey(r.cfg.Prefix, key, rule))
		g := 0
		for g < len(slots) && slots[g] != slot {
			g++
		}
		if g == len(slots) {
			slots = append(slots, slot)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// mixed reports whether rules both charge and give back (a negative Cost).
func mixed(rules []Rule) bool {
	gives := 0
	for _, r := range rules {
		if r.Cost < 0 {
			gives++
		}
	}
	return gives > 0 && gives < len(rules)
}

// chargeThenGiveBack decides a check of rules in several slots of which
// some give back: the give-backs apply only once the charges are admitted,
// as in one call, since a give-back made beside a denial could not be
// taken back (the bucket may have been used meanwhile).
func (r *Redis) chargeThenGiveBack(ctx context.Context, key string, rules []Rule, cost int64) (Decision, error) {
	var charges, gives []Rule
	var at []int
	for i, rule := range rules {
		if rule.Cost >= 0 {
			charges = append(charges, rule)
			at = append(at, i)
		}
	}
	for i, rule := range rules {
		if rule.Cost < 0 {
			gives = append(gives, rule)
			at = append(at, i)
		}
	}
	d, _, err := r.decide(ctx, key, charges, cost, 0)
	if err != nil {
		return Decision{}, err
	}
	rr := make([]RuleResult, len(rules))
	for j, res := range d.Rules {
		rr[at[j]] = res
	}
	if d.Allowed {
		g, _, err := r.decide(ctx, key, gives, cost, 0)
		if err != nil {
			// The charges stand for an admitted request; what was to be
			// given back was not: the limiter's favour.
			r.giveBackFailed.Add(1)
		}
		for j := range gives {
			res := RuleResult{Rule: gives[j], Allowed: true}
			if err == nil {
				res = g.Rules[j]
			}
			rr[at[len(charges)+j]] = res
		}
		if g.Time.After(d.Time) {
			d.Time = g.Time
		}
	} else {
		for j := range gives {
			rr[at[len(charges)+j]] = RuleResult{Rule: gives[j], Allowed: true}
		}
	}
	out := decide(rr)
	out.Time = d.Time
	return out, nil
}

// allowAcross decides a check of rules in several slots (groups, from
// slotGroups); it also returns when its calls were sent, for the deny
// cache.
func (r *Redis) allowAcross(ctx context.Context, key string, rules []Rule, cost int64, groups [][]int) (Decision, time.Time, error) {
	r.across.Add(1)
	parts := make([][]Rule, len(groups))
	calls := make([]*call, len(groups))
	for g, idx := range groups {
		for _, i := range idx {
			parts[g] = append(parts[g], rules[i])
		}
		calls[g] = r.slotCall(ctx, key, parts[g], scriptArgs(parts[g], cost, r.cfg.Now()))
	}
	sent := r.cfg.Now()
	r.await(ctx, calls)
	ds := make([]Decision, len(groups))
	var err error
	allowed := true
	for g, c := range calls {
		if c.err == nil {
			ds[g], c.err = parseReply(c.res, parts[g], false)
		}
		if c.err != nil {
			if err == nil {
				err = c.err
			}
			continue
		}
		allowed = allowed && ds[g].Allowed
	}
	if err != nil || !allowed {
		r.giveBack(ctx, key, parts, cost, calls, ds)
	}
	if err != nil {
		if isTryAgain(err) {
			return Decision{}, sent, fmt.Errorf("run limiter script: %w: %w", ErrMigrating, err)
		}
		return Decision{}, sent, fmt.Errorf("run limiter script: %w", err)
	}
	rr := make([]RuleResult, len(rules))
	var at time.Time
	for g, idx := range groups {
		for j, i := range idx {
			rr[i] = ds[g].Rules[j]
		}
		if ds[g].Time.After(at) {
			at = ds[g].Time
		}
	}
	d := decide(rr)
	d.Time = at
	return d, sent, nil
}

// giveBack returns what the admitting slots of a denied (or failed)
// check charged: each of their rules that consumed gets its charge back,
// a sliding window into the window it was charged in. ds[g] is valid
// where calls[g] has no error; the results of the rules given back are
// updated to their state after it.
func (r *Redis) giveBack(ctx context.Context, key string, parts [][]Rule, cost int64, calls []*call, ds []Decision) {
	var back []*call
	var of [][]int // back[k]'s rules, as indexes into its part
	var group []int
	for g, c := range calls {
		if c.err != nil || !ds[g].Allowed {
			continue
		}
		var give []Rule
		var idx []int
		for j, rr := range ds[g].Rules {
			if !rr.Allowed {
				continue // a shadow rule's denial: nothing was charged
			}
			rule := parts[g][j]
			rule.Cost = -rule.charge(cost)
			give = append(give, rule)
			idx = append(idx, j)
		}
		if len(give) == 0 {
			continue
		}
		back = append(back, r.slotCall(ctx, key, give, giveBackArgs(give, ds[g].Time)))
		of = append(of, idx)
		group = append(group, g)
	}
	if len(back) == 0 {
		return
	}
	// The give-back must run even when the caller gave up: the charge
	// would otherwise stay for a request that was never admitted.
	bctx := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		bctx, cancel = context.WithDeadline(bctx, dl.Add(time.Second))
		defer cancel()
	}
	for _, c := range back {
		c.ctx = bctx
	}
	r.await(bctx, back)
	r.givenBack.Add(1)
	for k, c := range back {
		var d Decision
		if c.err == nil {
			d, c.err = parseReply(c.res, rulesAt(parts[group[k]], of[k]), false)
		}
		if c.err != nil {
			r.giveBackFailed.Add(1)
			continue
		}
		for n, j := range of[k] {
			res := &ds[group[k]].Rules[j]
			res.Remaining, res.ResetAfter = d.Rules[n].Remaining, d.Rules[n].ResetAfter
		}
	}
}

func rulesAt(rules []Rule, idx []int) []Rule {
	out := make([]Rule, len(idx))
	for n, j := range idx {
		out[n] = rules[j]
	}
	return out
}

// slotCall is a check of rules, all in one slot, with the script's args.
func (r *Redis) slotCall(ctx context.Context, key string, rules []Rule, args []any) *call {
	keys := r.Keys(key, rules)
	_, m := layout(rules)
	return &call{ctx: ctx, keys: keys, containers: m, args: args, sent: r.cfg.Now(), done: make(chan struct{}, 1)}
}

// await sends calls at once and waits for each to be answered or for ctx
// to end; a call left unanswered gets ctx's error.
func (r *Redis) await(ctx context.Context, calls []*call) {
	sent := make([]bool, len(calls))
	for i, c := range calls {
		sent[i] = r.submit(c, nil)
	}
	for i, c := range calls {
		if !sent[i] {
			c.err = ctx.Err()
			continue
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			// The sender still owns c; its result is no longer read.
			calls[i] = &call{err: ctx.Err()}
		}
	}
}

// giveBackArgs is scriptArgs for rules that give back (negative Cost)
// what a check charged at: a sliding window's give-back names the window
// it was charged in (in the pn field, which a window does not use), so
// that one charged before its window turned comes off the previous one;
// a calendar rule's names it by the windows around at (see allow.lua).
func giveBackArgs(rules []Rule, at time.Time) []any {
	args := scriptArgs(rules, 1, at)
	nameWindows(rules, args, at)
	return args
}

// nameWindows has each sliding window of rules that gives back (negative
// Cost) in args (packArgs') name the window at holds (see giveBackArgs).
func nameWindows(rules []Rule, args []any, at time.Time) {
	b := args[3].([]byte)
	for i, rule := range rules {
		if rule.algorithm() == SlidingWindow && rule.Cost < 0 {
			w := at.UnixMicro() / rule.Period.Microseconds()
			copy(b[ruleSize*i+17:], le(nil, w, 6))
		}
	}
}
