package analytics

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

var (
	qWhatIf       = mustSQL("whatif_decisions")
	qWhatIfChunks = mustSQL("whatif_chunks")
)

// Bounds of one what-if replay.
const (
	// MaxWhatIfRange is the longest time range one replay reads.
	MaxWhatIfRange = 31 * 24 * time.Hour
	// WhatIfTimeout bounds one replay, ClickHouse's part included.
	WhatIfTimeout = 5 * time.Minute
	// MaxWhatIfTop is the most keys a report lists per list.
	MaxWhatIfTop = 1000
	// maxWhatIfRules bounds the rules a report counts by name: the
	// proposal's and the stored binding rules; the rest count as OtherSeries.
	maxWhatIfRules = 256
	// whatIfBatch is how many rows the reader hands the replay at once;
	// whatIfBatches how many such batches may wait, so the reader stays
	// ahead of the replay on another core with bounded memory.
	whatIfBatch   = 4096
	whatIfBatches = 4
)

// Proposal is a set of rules to replay stored decisions through: plans in
// the gateway's sense (a named list of rules) and, optionally, routes that
// give requests a plan (and a bucket per key and route) or a cost of their
// own. It is read from the gateway's YAML syntax by the caller (cmd's
// parser uses the gateway's own configuration types).
type Proposal struct {
	// Plans replace the plans of the same name. A decision of a plan the
	// proposal does not name is counted as it was decided.
	Plans map[string][]limiter.Rule
	// Routes, by route name, override what the stored decisions say.
	Routes map[string]ProposedRoute
	// Keys, by key name (an API key's configured id, the decisions'
	// key_name), are the keys with rules of their own: their plan's rules
	// with the key's overrides applied. As in the gateway, they replace
	// the plan's rules where the key's own plan limits it, not under a
	// route's plan. Apply does not change them: give them after a change.
	Keys map[string]ProposedKey
}

// ProposedKey is one key's own rules.
type ProposedKey struct {
	// Plan is the key's plan, whose rules Rules replace for it.
	Plan  string
	Rules []limiter.Rule
}

// ProposedRoute is what a proposal says about one route.
type ProposedRoute struct {
	// Plan, when set, limits every caller of the route by this plan, in a
	// bucket of its own per caller and route, as the gateway does.
	Plan string
	// Cost, when positive, replaces the stored cost of the route's requests.
	Cost int64
}

// RuleChange changes one rule of a proposal's plan: the rule of the same
// name is replaced, or the rule is added.
type RuleChange struct {
	Plan string
	Rule limiter.Rule
}

// Apply returns p with c applied; p itself is not changed.
func (p Proposal) Apply(c RuleChange) (Proposal, error) {
	rules, ok := p.Plans[c.Plan]
	if !ok {
		return p, fmt.Errorf("%w: changed rule: plan %q is not in the proposal; a change needs its plan's other rules, since all of them decide together", ErrBadQuery, c.Plan)
	}
	rules = slices.Clone(rules)
	if i := slices.IndexFunc(rules, func(r limiter.Rule) bool { return r.Name == c.Rule.Name }); i >= 0 {
		rules[i] = c.Rule
	} else {
		rules = append(rules, c.Rule)
	}
	plans := make(map[string][]limiter.Rule, len(p.Plans))
	for name, rs := range p.Plans {
		plans[name] = rs
	}
	plans[c.Plan] = rules
	p.Plans = plans
	return p, nil
}

// Validate reports what is wrong with the proposal, each problem wrapping
// ErrBadQuery.
func (p Proposal) Validate() error {
	var errs []error
	if len(p.Plans) == 0 {
		errs = append(errs, fmt.Errorf("%w: the proposal has no plans", ErrBadQuery))
	}
	for _, name := range sortedNames(p.Plans) {
		rules := p.Plans[name]
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("%w: a plan has no name", ErrBadQuery))
		case len(rules) == 0:
			errs = append(errs, fmt.Errorf("%w: plan %q has no rules", ErrBadQuery, name))
		case len(rules) > limiter.MaxRules:
			errs = append(errs, fmt.Errorf("%w: plan %q has %d rules, at most %d", ErrBadQuery, name, len(rules), limiter.MaxRules))
		}
		seen := map[string]bool{}
		for i, r := range rules {
			if err := r.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%w: plan %q rule %d: %v", ErrBadQuery, name, i, err))
			}
			if seen[r.Name] {
				errs = append(errs, fmt.Errorf("%w: plan %q: duplicate rule %q", ErrBadQuery, name, r.Name))
			}
			seen[r.Name] = true
		}
	}
	for _, name := range sortedNames(p.Keys) {
		k := p.Keys[name]
		if _, ok := p.Plans[k.Plan]; !ok {
			errs = append(errs, fmt.Errorf("%w: key %q: plan %q is not in the proposal", ErrBadQuery, name, k.Plan))
		}
		if name == "" || name == noKey {
			errs = append(errs, fmt.Errorf("%w: a key with rules of its own has no name", ErrBadQuery))
		}
		for i, r := range k.Rules {
			if err := r.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%w: key %q rule %d: %v", ErrBadQuery, name, i, err))
			}
		}
	}
	for _, name := range sortedNames(p.Routes) {
		rt := p.Routes[name]
		if _, ok := p.Plans[rt.Plan]; rt.Plan != "" && !ok {
			errs = append(errs, fmt.Errorf("%w: route %q: plan %q is not in the proposal", ErrBadQuery, name, rt.Plan))
		}
		if rt.Cost < 0 {
			errs = append(errs, fmt.Errorf("%w: route %q: cost %d is negative", ErrBadQuery, name, rt.Cost))
		}
	}
	return errors.Join(errs...)
}

func sortedNames[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// WhatIfQuery asks how a proposal would have decided the stored decisions
// of a range. Range.KeyID and Range.Plan narrow what is replayed;
// Range.Route narrows what is counted (every route of a key is replayed,
// since they spend the same buckets); Rule and Gateway must be empty.
type WhatIfQuery struct {
	Range
	Proposal Proposal
	// Ran, when set, is the rules that ran: replayed over the same
	// decisions beside the proposal and compared with what happened
	// (WhatIfReport.SelfCheck).
	Ran *Proposal
	// Top is how many keys each key list holds; default 20, at most
	// MaxWhatIfTop.
	Top int

	chunkRows int64 // default whatIfChunkRows; tests cut smaller chunks
}

// Validate reports a query that must not run.
func (q WhatIfQuery) Validate() error {
	if err := q.Range.validate(); err != nil {
		return err
	}
	if q.To.Sub(q.From) > MaxWhatIfRange {
		return fmt.Errorf("%w: a what-if replays at most %v of decisions; narrow the range", ErrBadQuery, MaxWhatIfRange)
	}
	if q.Rule != "" || q.Gateway != "" {
		return fmt.Errorf("%w: a what-if filters by plan, route and key only", ErrBadQuery)
	}
	if q.Top < 0 || q.Top > MaxWhatIfTop {
		return fmt.Errorf("%w: top %d outside [0, %d]", ErrBadQuery, q.Top, MaxWhatIfTop)
	}
	if q.Ran != nil {
		if err := q.Ran.Validate(); err != nil {
			return fmt.Errorf("the rules that ran: %w", err)
		}
	}
	return q.Proposal.Validate()
}

// WhatIfCounts compares the stored decisions with the replayed ones.
type WhatIfCounts struct {
	Requests int64 `json:"requests"`
	// WasDenied were denied when they happened; WouldDeny would be under
	// the proposal.
	WasDenied int64 `json:"was_denied"`
	WouldDeny int64 `json:"would_deny"`
	// NewlyDenied would be denied but were not; NewlyAllowed the reverse.
	NewlyDenied  int64 `json:"newly_denied"`
	NewlyAllowed int64 `json:"newly_allowed"`
}

func (c *WhatIfCounts) add(was, would bool) {
	c.Requests++
	if was {
		c.WasDenied++
	}
	if would {
		c.WouldDeny++
	}
	switch {
	case would && !was:
		c.NewlyDenied++
	case was && !would:
		c.NewlyAllowed++
	}
}

// WhatIfRule is one rule's part in the denials.
type WhatIfRule struct {
	Rule string `json:"rule"`
	// WasBinding counts stored denials that named this rule binding.
	WasBinding int64 `json:"was_binding"`
	// WouldDeny counts replayed requests this enforced rule denied (a
	// request denied by two rules counts for both).
	WouldDeny int64 `json:"would_deny"`
	// ShadowWouldDeny counts replayed requests this shadow rule would
	// have denied had it been enforced.
	ShadowWouldDeny int64 `json:"shadow_would_deny"`
}

// WhatIfHour is one hour of the comparison.
type WhatIfHour struct {
	Hour time.Time `json:"hour"`
	WhatIfCounts
}

// WhatIfSelfCheck is the rules that ran, replayed over the same decisions
// and compared with what happened: how far to trust the proposal's
// answer. Its counts are of the decisions the replay decided: WouldDeny
// what it denied, NewlyDenied and NewlyAllowed where it disagrees.
type WhatIfSelfCheck struct {
	WhatIfCounts
	// NotReplayed were of plans the rules that ran do not name, or had
	// no usable cost or key.
	NotReplayed int64 `json:"not_replayed"`
	// Agreement is the share of the decisions replayed that came out as
	// they were decided; DenialError how far the replayed denials are
	// from the real ones, as a share of them (0.02: 2 % more).
	Agreement   float64 `json:"agreement"`
	DenialError float64 `json:"denial_error"`
}

// WhatIfKey is one key's comparison.
type WhatIfKey struct {
	KeyID   string `json:"key_id"`
	KeyKind string `json:"key_kind"`
	WhatIfCounts
}

// WhatIfReport is the answer to a WhatIfQuery.
type WhatIfReport struct {
	Span
	Plan  string `json:"plan,omitempty"`
	Route string `json:"route,omitempty"`
	Key   string `json:"key,omitempty"`
	// Read is how many stored decisions were read; Counted how many of
	// them the route filter kept, all in Totals.
	Read    int64 `json:"read"`
	Counted int64 `json:"counted"`
	// Kept were decided by plans the proposal does not name: counted as
	// they were decided. Unreplayable had no usable cost or key and are
	// counted as they were, too.
	Kept         int64 `json:"kept"`
	Unreplayable int64 `json:"unreplayable"`
	// Warmed were decided before the range, since WarmFrom: replayed to
	// fill the buckets as they were when the range began, not counted.
	WarmFrom time.Time `json:"warm_from"`
	Warmed   int64     `json:"warmed"`
	// Grants are the admin grants replayed (from WarmFrom on): each
	// gives its window the allowance it gave the real one.
	Grants int64 `json:"grants"`
	// NotByStore were decided without the shared store (it was
	// unavailable: fail open, fail closed or the local fallback); the
	// replay decides them as if it had answered.
	NotByStore int64        `json:"not_by_store"`
	Totals     WhatIfCounts `json:"totals"`
	Rules      []WhatIfRule `json:"rules"`
	Hours      []WhatIfHour `json:"hours"`
	// Keys, KeysNewlyBlocked and KeysNewlyFreed count distinct keys:
	// blocked are keys with denials under the proposal and none as
	// decided, freed the reverse.
	Keys             int64 `json:"keys"`
	KeysNewlyBlocked int64 `json:"keys_newly_blocked"`
	KeysNewlyFreed   int64 `json:"keys_newly_freed"`
	// TopKeys are the keys with the most denials under the proposal;
	// NewlyBlocked and NewlyFreed the top of those lists.
	TopKeys      []WhatIfKey `json:"top_keys"`
	NewlyBlocked []WhatIfKey `json:"newly_blocked"`
	NewlyFreed   []WhatIfKey `json:"newly_freed"`
	// SelfCheck is the rules that ran, replayed and compared with what
	// happened; nil when the query did not give them.
	SelfCheck *WhatIfSelfCheck `json:"self_check,omitempty"`
	// Caveats says what this replay could not know.
	Caveats  []string      `json:"caveats"`
	Duration time.Duration `json:"duration_ns"`
}

// whatIfCaveats are true of every replay; report adds the ones its
// counts show.
var whatIfCaveats = []string{
	"clients are replayed as they behaved: one denied more often might have backed off, one freed might have sent more",
	"keys are replayed under their plan's rules with their own overrides (an API key without an id has no name in the decisions, so its overrides cannot apply), the split (hot key) and NAT directives the gateways applied, and the admin grants made; admin resets are not replayed",
	"a token route's requests are replayed by what they reserved (their decisions' cost, charged to every rule of their plan), not by what their answers used: token budgets (unit: tokens) and the settlements after the answers are not replayed",
	"in-flight limits (in_flight: N) are not replayed: the decisions do not say how long their answers lasted",
}

// maxWhatIfWarm bounds how far before its range a replay reads to warm
// the buckets: a rule of a longer period starts that far back, full.
const maxWhatIfWarm = MaxWhatIfRange

// warmFrom is where the replay starts reading: as far before the range
// as the longest rule it replays remembers (a calendar rule: its longest
// window), at most maxWhatIfWarm, so that a key drained at the range's
// start is drained in the replay too.
func (q WhatIfQuery) warmFrom() time.Time {
	var longest time.Duration
	for _, p := range []*Proposal{&q.Proposal, q.Ran} {
		if p == nil {
			continue
		}
		for _, rules := range p.Plans {
			for _, r := range rules {
				longest = max(longest, memory(r))
			}
		}
	}
	return q.From.Add(-min(longest, maxWhatIfWarm))
}

// memory is how long before a decision a rule's state can reach: its
// period, or its calendar's longest window.
func memory(r limiter.Rule) time.Duration {
	if r.Calendar == nil {
		return r.Period
	}
	switch r.Calendar.Unit() {
	case limiter.Day:
		return 25 * time.Hour // a day with a DST hour more
	case limiter.Week:
		return 8 * 24 * time.Hour
	case limiter.Month:
		return 32 * 24 * time.Hour
	}
	return 367 * 24 * time.Hour
}

// replayRow is one stored decision as the replay reads it (see
// whatif_decisions.sql): plan and route by their place in the proposal.
type replayRow struct {
	key, rule                     string
	atUS, cost                    int64
	plan, route                   uint32
	kind, counted, allowed, store uint8
	inRange                       uint8 // 0: before the range, read to warm the buckets
	// nat and split are the directive the gateway applied (see
	// whatif_decisions.sql): 0 and "" for none.
	nat   float64
	split string
	// keyName is the key's place in the query's key names (0: none).
	keyName uint32
	// grant marks an admin grant of rule's window: grantLimit is the
	// window's allowance after it.
	grant      uint8
	grantLimit int64
}

// kindNames are the event's key kinds by number, as the query gives them.
var kindNames = [...]string{"unknown", "api_key", "user", "ip"}

// noRoute and noKey stand first in the routes and key names a query
// looks up, so the lists are never empty; no route or key is named so
// (their names hold no spaces).
const (
	noRoute = " none"
	noKey   = " none"
)

// proposalIndex is a proposal in the query's terms: plans and routes by
// 1-based place in names the query was given (names), a plan the
// proposal does not hold nil.
type proposalIndex struct {
	plans  [][]limiter.Rule
	routes []ProposedRoute
	// routePlan is, per route, its plan's place (0: the stored plan's).
	routePlan []uint32
	// keys are, per key name, its plan's place and its own rules (nil:
	// the plan's).
	keys []indexedKey
}

type indexedKey struct {
	plan  uint32
	rules []limiter.Rule
}

// queryNames are the plan and route names a replay's query looks up:
// those of every rule set it replays, so one read serves them all.
type queryNames struct {
	plans, routes, keys []string
}

func namesOf(ps ...*Proposal) queryNames {
	plans, routes, keys := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, p := range ps {
		if p == nil {
			continue
		}
		for n := range p.Plans {
			plans[n] = true
		}
		for n := range p.Routes {
			routes[n] = true
		}
		for n := range p.Keys {
			keys[n] = true
		}
	}
	return queryNames{plans: sortedNames(plans), routes: append([]string{noRoute}, sortedNames(routes)...),
		keys: append([]string{noKey}, sortedNames(keys)...)}
}

func indexProposal(p Proposal, names queryNames) proposalIndex {
	var x proposalIndex
	for _, n := range names.plans {
		x.plans = append(x.plans, p.Plans[n])
	}
	for _, n := range names.routes {
		rt := p.Routes[n]
		x.routes = append(x.routes, rt)
		x.routePlan = append(x.routePlan, uint32(slices.Index(names.plans, rt.Plan)+1))
	}
	for _, n := range names.keys {
		k, ok := p.Keys[n]
		if !ok {
			x.keys = append(x.keys, indexedKey{})
			continue
		}
		x.keys = append(x.keys, indexedKey{plan: uint32(slices.Index(names.plans, k.Plan) + 1), rules: k.Rules})
	}
	return x
}
