package analytics

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// replayRun is one replay's state: the key in flight and the report's
// counters.
type replayRun struct {
	q     WhatIfQuery
	names queryNames
	// prop replays the proposal; ran the rules that ran, for the
	// self-check (nil without them).
	prop, ran *replayer

	rep   WhatIfReport
	check WhatIfSelfCheck
	rules map[string]*WhatIfRule
	hours map[int64]*WhatIfCounts

	cur WhatIfKey // the key in flight

	top, blocked, freed keyHeap
}

func newReplayRun(q WhatIfQuery, warmFrom time.Time) *replayRun {
	run := &replayRun{
		q:     q,
		names: namesOf(&q.Proposal, q.Ran),
		rules: map[string]*WhatIfRule{},
		hours: map[int64]*WhatIfCounts{},
		rep: WhatIfReport{Span: Span{From: q.From.UTC(), To: q.To.UTC()}, Plan: q.Plan, Route: q.Route, Key: q.KeyID,
			WarmFrom: warmFrom.UTC().Truncate(time.Second)},
	}
	run.prop = newReplayer(q.Proposal, &run.names)
	if q.Ran != nil {
		run.ran = newReplayer(*q.Ran, &run.names)
	}
	run.top.less = func(a, b *WhatIfKey) bool {
		return a.WouldDeny < b.WouldDeny || a.WouldDeny == b.WouldDeny && a.KeyID > b.KeyID
	}
	run.blocked.less = run.top.less
	run.freed.less = func(a, b *WhatIfKey) bool {
		return a.WasDenied < b.WasDenied || a.WasDenied == b.WasDenied && a.KeyID > b.KeyID
	}
	for _, name := range sortedNames(q.Proposal.Plans) {
		for _, rule := range q.Proposal.Plans[name] {
			run.rule(rule.Name)
		}
	}
	return run
}

// rule returns the counters of a rule, bounded in number.
func (run *replayRun) rule(name string) *WhatIfRule {
	if r, ok := run.rules[name]; ok {
		return r
	}
	if len(run.rules) >= maxWhatIfRules {
		name = OtherSeries
		if r, ok := run.rules[name]; ok {
			return r
		}
	}
	r := &WhatIfRule{Rule: name}
	run.rules[name] = r
	return r
}

// add replays one stored decision. Rows come grouped by key, in time
// order within each.
func (run *replayRun) add(d *replayRow) error {
	if d.key != run.cur.KeyID {
		run.endKey()
		run.prop.reset()
		if run.ran != nil {
			run.ran.reset()
		}
		kind := kindNames[0]
		if int(d.kind) < len(kindNames) {
			kind = kindNames[d.kind]
		}
		run.cur = WhatIfKey{KeyID: d.key, KeyKind: kind}
	}
	if d.grant != 0 {
		return run.grant(d)
	}
	if d.inRange == 0 {
		run.rep.Warmed++
	} else {
		run.rep.Read++
	}
	was := d.allowed == 0
	would, dec, how, err := run.prop.decide(d)
	if err != nil {
		return err
	}
	var ranWould bool
	ranHow := kept
	if run.ran != nil {
		if ranWould, _, ranHow, err = run.ran.decide(d); err != nil {
			return err
		}
	}
	if d.inRange == 0 {
		return nil
	}
	switch how {
	case kept:
		run.rep.Kept++
	case unreplayable:
		run.rep.Unreplayable++
	}
	if d.counted == 0 {
		return nil
	}
	run.rep.Counted++
	if how == replayed {
		for _, rr := range dec.Rules {
			if !rr.Allowed {
				if rr.Rule.Shadow {
					run.rule(rr.Rule.Name).ShadowWouldDeny++
				} else {
					run.rule(rr.Rule.Name).WouldDeny++
				}
			}
		}
	}
	if run.ran != nil {
		if ranHow == replayed {
			run.check.add(was, ranWould)
		} else {
			run.check.NotReplayed++
		}
	}
	if d.store == 0 {
		run.rep.NotByStore++
	}
	if was {
		run.rule(d.rule).WasBinding++
	}
	run.rep.Totals.add(was, would)
	run.cur.add(was, would)
	hour := d.atUS / 3_600_000_000
	h := run.hours[hour]
	if h == nil {
		h = &WhatIfCounts{}
		run.hours[hour] = h
	}
	h.add(was, would)
	return nil
}

// grant replays an admin grant: the window's allowance after it, less
// the rule's limit as it ran (the self-check's rules, else the
// proposal's), is what the window had been granted in all, and each
// rule set's window gets as much, if its rule of that name is a calendar
// rule.
func (run *replayRun) grant(d *replayRow) error {
	ran := run.ran
	if ran == nil {
		ran = run.prop
	}
	_, rules, ok := ran.rules(d)
	i := slices.IndexFunc(rules, func(r limiter.Rule) bool { return r.Name == d.rule && r.Calendar != nil })
	if !ok || i < 0 {
		return nil
	}
	granted := d.grantLimit - rules[i].Limit
	for _, p := range []*replayer{run.prop, run.ran} {
		if p != nil {
			if err := p.grant(d, granted); err != nil {
				return err
			}
		}
	}
	run.rep.Grants++
	return nil
}

// replayer replays one rule set (the proposal, or the rules that ran)
// through its own model of the store.
type replayer struct {
	x      proposalIndex
	names  *queryNames
	rp     *limiter.Replay
	bucket struct {
		plan, route uint32
		key         string
	}
	// last is directed's last result, for the input it had.
	last struct {
		inKey      string
		inRules    []limiter.Rule
		nat        float64
		split, key string
		rules      []limiter.Rule
	}
}

func newReplayer(p Proposal, names *queryNames) *replayer {
	return &replayer{x: indexProposal(p, *names), names: names, rp: limiter.NewReplay(0)}
}

// How a replayer decided a stored decision.
const (
	replayed     = iota
	kept         // of a plan the rule set does not name: as decided
	unreplayable // no usable cost or key: as decided
)

// reset starts the next key with every bucket full.
func (p *replayer) reset() {
	p.rp.Reset()
	p.bucket.key = ""
	p.last.inKey = ""
}

// decide replays d and reports whether the rule set denies it, with the
// limiter's decision when it replayed it; a decision it cannot replay
// keeps its stored verdict.
func (p *replayer) decide(d *replayRow) (bool, limiter.Decision, int, error) {
	was := d.allowed == 0
	key, rules, ok := p.rules(d)
	if !ok {
		return was, limiter.Decision{}, kept, nil
	}
	cost := d.cost
	if d.route > 0 && int(d.route) <= len(p.x.routes) && p.x.routes[d.route-1].Cost > 0 {
		cost = p.x.routes[d.route-1].Cost
	}
	if cost <= 0 {
		return was, limiter.Decision{}, unreplayable, nil
	}
	at := time.UnixMicro(d.atUS)
	key, rules = p.directed(d, key, rules, at)
	dec, err := p.rp.Allow(at, key, rules, cost)
	if errors.Is(err, limiter.ErrInput) {
		return was, limiter.Decision{}, unreplayable, nil
	}
	if err != nil {
		return false, limiter.Decision{}, 0, fmt.Errorf("replay: %w", err)
	}
	return !dec.Allowed, dec, replayed, nil
}

// rules is the bucket key and the rules the rule set checks d under, as
// the gateway chose them: a route's own plan in a bucket per key and
// route, else the key's plan (the key's own rules, if it has them); not
// ok when the rule set does not name the plan.
func (p *replayer) rules(d *replayRow) (string, []limiter.Rule, bool) {
	plan, perRoute := d.plan, false
	if d.route > 0 && int(d.route) <= len(p.x.routes) {
		if i := p.x.routePlan[d.route-1]; i > 0 {
			plan, perRoute = i, true
		}
	}
	if plan == 0 || int(plan) > len(p.x.plans) || p.x.plans[plan-1] == nil {
		return "", nil, false
	}
	rules := p.x.plans[plan-1]
	if d.keyName > 0 && int(d.keyName) <= len(p.x.keys) && !perRoute {
		if k := p.x.keys[d.keyName-1]; k.rules != nil && k.plan == plan {
			rules = k.rules
		}
	}
	return p.bucketKey(d.key, plan, d.route, perRoute), rules, true
}

// grant gives d's window of its calendar rule granted units in all, as
// the gateway's grant did to the key's shared bucket (a split never
// applies to a calendar rule).
func (p *replayer) grant(d *replayRow, granted int64) error {
	key, rules, ok := p.rules(d)
	i := slices.IndexFunc(rules, func(r limiter.Rule) bool { return r.Name == d.rule && r.Calendar != nil })
	if !ok || i < 0 {
		return nil
	}
	if err := p.rp.Grant(time.UnixMicro(d.atUS), key, rules[i], granted); err != nil && !errors.Is(err, limiter.ErrInput) {
		return fmt.Errorf("replay grant: %w", err)
	}
	return nil
}

// directed applies to rules the directive the gateway applied to d, as
// the gateway did (limiter.Directives: a NAT raise scales them; a split
// checks this gateway's share in a bucket of its own, with the key's
// whole), and returns the key and rules to check. The last result is
// kept: a directed key's decisions mostly carry the same directive.
func (p *replayer) directed(d *replayRow, key string, rules []limiter.Rule, at time.Time) (string, []limiter.Rule) {
	if d.nat == 0 && d.split == "" {
		return key, rules
	}
	c := &p.last
	if c.inKey == key && c.nat == d.nat && c.split == d.split && len(c.inRules) == len(rules) && (len(rules) == 0 || &c.inRules[0] == &rules[0]) {
		return c.key, c.rules
	}
	c.inKey, c.inRules, c.nat, c.split = key, rules, d.nat, d.split
	never := time.Unix(1<<40, 0)
	if d.nat > 0 {
		ds := limiter.Directives{NATs: map[string]limiter.NATDirective{key: {Key: key, Factor: d.nat, Expires: never}}}
		rules, _ = ds.NAT(key, rules, at)
	}
	if gateway, list, ok := strings.Cut(d.split, "\n"); ok {
		shares := map[string]float64{}
		for _, e := range strings.Split(list, "\t") {
			name, v, _ := strings.Cut(e, " ")
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				shares[name] = f
			}
		}
		ds := limiter.Directives{Splits: map[string]limiter.SplitDirective{key: {Key: key, Shares: shares, Expires: never}}}
		key, rules, _ = ds.Split(key, gateway, rules, at)
	}
	c.key, c.rules = key, rules
	return key, rules
}

// bucketKey names the limiter key a decision spends, as the gateway keys
// it: one bucket set per key and plan, and per key and route for a route
// with a plan of its own. The last one is kept, since a key's decisions
// mostly share one.
func (p *replayer) bucketKey(key string, plan, route uint32, perRoute bool) string {
	b := &p.bucket
	if !perRoute {
		route = 0
	}
	if b.key == "" || b.plan != plan || b.route != route {
		b.plan, b.route = plan, route
		if perRoute {
			b.key = key + "|r:" + p.names.routes[route-1]
		} else {
			b.key = key + "|p:" + p.names.plans[plan-1]
		}
	}
	return b.key
}

// endKey files the key in flight.
func (run *replayRun) endKey() {
	k := run.cur
	if k.Requests == 0 {
		return
	}
	run.rep.Keys++
	run.top.offer(k, run.q.Top, k.WouldDeny > 0)
	if k.WouldDeny > 0 && k.WasDenied == 0 {
		run.rep.KeysNewlyBlocked++
		run.blocked.offer(k, run.q.Top, true)
	}
	if k.WasDenied > 0 && k.WouldDeny == 0 {
		run.rep.KeysNewlyFreed++
		run.freed.offer(k, run.q.Top, true)
	}
}

// report finishes the run.
func (run *replayRun) report() WhatIfReport {
	run.endKey()
	run.cur = WhatIfKey{}
	rep := run.rep
	for _, r := range run.rules {
		rep.Rules = append(rep.Rules, *r)
	}
	slices.SortFunc(rep.Rules, func(a, b WhatIfRule) int { return strings.Compare(a.Rule, b.Rule) })
	for h, c := range run.hours {
		rep.Hours = append(rep.Hours, WhatIfHour{Hour: time.UnixMilli(h * 3_600_000).UTC(), WhatIfCounts: *c})
	}
	slices.SortFunc(rep.Hours, func(a, b WhatIfHour) int { return a.Hour.Compare(b.Hour) })
	rep.TopKeys, rep.NewlyBlocked, rep.NewlyFreed = run.top.sorted(), run.blocked.sorted(), run.freed.sorted()
	rep.Caveats = slices.Clone(whatIfCaveats)
	if warm := rep.From.Sub(rep.WarmFrom); warm < maxWhatIfWarm {
		rep.Caveats = append(rep.Caveats, fmt.Sprintf("each key's buckets start full at %s, the longest rule's memory before the range, and are warmed by the %d decisions since",
			rep.WarmFrom.Format(time.RFC3339), rep.Warmed))
	} else {
		rep.Caveats = append(rep.Caveats, fmt.Sprintf("each key's buckets start full at %s, %v before the range (rules that remember longer than that are not warmed further), and are warmed by the %d decisions since",
			rep.WarmFrom.Format(time.RFC3339), maxWhatIfWarm, rep.Warmed))
	}
	if rep.Grants > 0 {
		rep.Caveats = append(rep.Caveats, fmt.Sprintf("%d admin grants were replayed where they were made", rep.Grants))
	}
	if run.ran != nil {
		c := run.check
		if c.Requests > 0 {
			c.Agreement = float64(c.Requests-c.NewlyDenied-c.NewlyAllowed) / float64(c.Requests)
		}
		if c.WasDenied > 0 {
			c.DenialError = float64(c.WouldDeny-c.WasDenied) / float64(c.WasDenied)
		}
		rep.SelfCheck = &c
	} else {
		rep.Caveats = append(rep.Caveats, "the rules that ran were not given, so the replay did not check itself against what happened: give them (ran), or give the proposal as a changed rule (change) on them")
	}
	if rep.Kept > 0 {
		rep.Caveats = append(rep.Caveats, fmt.Sprintf("%d decisions were of plans the proposal does not name and are counted as decided", rep.Kept))
	}
	if rep.Unreplayable > 0 {
		rep.Caveats = append(rep.Caveats, fmt.Sprintf("%d decisions had no usable cost or key and are counted as decided", rep.Unreplayable))
	}
	if rep.NotByStore > 0 {
		rep.Caveats = append(rep.Caveats, fmt.Sprintf("%d decisions were made without the shared store (fail open, fail closed, local fallback); the replay decides them as if it had answered", rep.NotByStore))
	}
	return rep
}

// keyHeap keeps the top keys by less: a min-heap of at most n, whose
// root is the first to go.
type keyHeap struct {
	keys []WhatIfKey
	less func(a, b *WhatIfKey) bool
}

func (h *keyHeap) Len() int { return len(h.keys) }

func (h *keyHeap) Less(i, j int) bool { return h.less(&h.keys[i], &h.keys[j]) }

func (h *keyHeap) Swap(i, j int) { h.keys[i], h.keys[j] = h.keys[j], h.keys[i] }

func (h *keyHeap) Push(x any) { h.keys = append(h.keys, x.(WhatIfKey)) }

func (h *keyHeap) Pop() any {
	k := h.keys[len(h.keys)-1]
	h.keys = h.keys[:len(h.keys)-1]
	return k
}

// offer keeps k if it is among the top n (and ok).
func (h *keyHeap) offer(k WhatIfKey, n int, ok bool) {
	switch {
	case !ok || n <= 0:
	case len(h.keys) < n:
		heap.Push(h, k)
	case h.less(&h.keys[0], &k):
		h.keys[0] = k
		heap.Fix(h, 0)
	}
}

// sorted returns the kept keys, the top first.
func (h *keyHeap) sorted() []WhatIfKey {
	out := slices.Clone(h.keys)
	slices.SortFunc(out, func(a, b WhatIfKey) int {
		if h.less(&b, &a) {
			return -1
		}
		if h.less(&a, &b) {
			return 1
		}
		return 0
	})
	if out == nil {
		out = []WhatIfKey{}
	}
	return out
}
