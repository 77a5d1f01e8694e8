package analytics

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// replayRun is one replay's state: the key in flight and the report's
// counters.
type replayRun struct {
	q  WhatIfQuery
	x  proposalIndex
	rp *limiter.Replay

	rep   WhatIfReport
	rules map[string]*WhatIfRule
	hours map[int64]*WhatIfCounts

	cur    WhatIfKey // the key in flight
	bucket struct {
		plan, route uint32
		key         string
	}

	top, blocked, freed keyHeap
}

func newReplayRun(q WhatIfQuery) *replayRun {
	run := &replayRun{
		q:     q,
		x:     indexProposal(q.Proposal),
		rp:    limiter.NewReplay(0),
		rules: map[string]*WhatIfRule{},
		hours: map[int64]*WhatIfCounts{},
		rep:   WhatIfReport{Span: Span{From: q.From.UTC(), To: q.To.UTC()}, Plan: q.Plan, Route: q.Route, Key: q.KeyID},
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
		run.rp.Reset()
		kind := kindNames[0]
		if int(d.kind) < len(kindNames) {
			kind = kindNames[d.kind]
		}
		run.cur = WhatIfKey{KeyID: d.key, KeyKind: kind}
		run.bucket.key = ""
	}
	run.rep.Read++
	was := d.allowed == 0
	would, err := run.decide(d)
	if err != nil {
		return err
	}
	if d.counted == 0 {
		return nil
	}
	run.rep.Counted++
	if d.store == 0 {
		run.rep.NotByStore++
	}
	if was {
		run.rule(d.rule).WasBinding++
	}
	run.rep.Totals.add(was, would)
	run.cur.add(was, would)
	hour := d.atMS / 3_600_000
	h := run.hours[hour]
	if h == nil {
		h = &WhatIfCounts{}
		run.hours[hour] = h
	}
	h.add(was, would)
	return nil
}

// decide replays d and reports whether the proposal denies it; a decision
// the proposal cannot replay keeps its stored verdict.
func (run *replayRun) decide(d *replayRow) (bool, error) {
	was := d.allowed == 0
	plan, cost, perRoute := d.plan, d.cost, false
	if d.route > 0 && int(d.route) <= len(run.x.routes) {
		rt := run.x.routes[d.route-1]
		if p := run.x.routePlan[d.route-1]; p > 0 {
			plan, perRoute = p, true
		}
		if rt.Cost > 0 {
			cost = rt.Cost
		}
	}
	if plan == 0 || int(plan) > len(run.x.plans) {
		run.rep.Kept++
		return was, nil
	}
	if cost <= 0 {
		run.rep.Unreplayable++
		return was, nil
	}
	dec, err := run.rp.Allow(time.UnixMilli(d.atMS), run.bucketKey(d.key, plan, d.route, perRoute), run.x.plans[plan-1], cost)
	if errors.Is(err, limiter.ErrInput) {
		run.rep.Unreplayable++
		return was, nil
	}
	if err != nil {
		return false, fmt.Errorf("replay: %w", err)
	}
	if d.counted != 0 {
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
	return !dec.Allowed, nil
}

// bucketKey names the limiter key a decision spends, as the gateway keys
// it: one bucket set per key and plan, and per key and route for a route
// with a plan of its own. The last one is kept, since a key's decisions
// mostly share one.
func (run *replayRun) bucketKey(key string, plan, route uint32, perRoute bool) string {
	b := &run.bucket
	if !perRoute {
		route = 0
	}
	if b.key == "" || b.plan != plan || b.route != route {
		b.plan, b.route = plan, route
		if perRoute {
			b.key = key + "|r:" + run.x.routeNames[route-1]
		} else {
			b.key = key + "|p:" + run.x.planNames[plan-1]
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
