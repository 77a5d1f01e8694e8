package analytics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
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
	"keys are replayed under their plan's rules (per-key overrides are not in the stored decisions), with the split (hot key) and NAT directives the gateways applied",
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
}

// kindNames are the event's key kinds by number, as the query gives them.
var kindNames = [...]string{"unknown", "api_key", "user", "ip"}

// noRoute stands first in the routes a query looks up, so the list is
// never empty; no route is named so (route names hold no spaces).
const noRoute = " none"

// proposalIndex is a proposal in the query's terms: plans and routes by
// 1-based place in names the query was given (names), a plan the
// proposal does not hold nil.
type proposalIndex struct {
	plans  [][]limiter.Rule
	routes []ProposedRoute
	// routePlan is, per route, its plan's place (0: the stored plan's).
	routePlan []uint32
}

// queryNames are the plan and route names a replay's query looks up:
// those of every rule set it replays, so one read serves them all.
type queryNames struct {
	plans, routes []string
}

func namesOf(ps ...*Proposal) queryNames {
	plans, routes := map[string]bool{}, map[string]bool{}
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
	}
	return queryNames{plans: sortedNames(plans), routes: append([]string{noRoute}, sortedNames(routes)...)}
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
	return x
}

// WhatIf replays the stored decisions of q's range through q.Proposal with
// the limiter's own model (limiter.Replay), one key at a time in time
// order, and compares. Memory holds one key's buckets, the report's
// counters and its top lists, never the range: rows stream from
// ClickHouse in key order, in chunks of whole keys that the server sorts
// one at a time (the next one while this one is replayed). The replay ends
// at WhatIfTimeout or when ctx does (a client that went away).
func (r *Reader) WhatIf(ctx context.Context, q WhatIfQuery) (WhatIfReport, error) {
	start := time.Now()
	if q.Top == 0 {
		q.Top = 20
	}
	if err := q.Validate(); err != nil {
		return WhatIfReport{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, WhatIfTimeout)
	defer cancel()
	// The server stops too, not only this side. Blocks of 8192 rows, not
	// 65536: the driver decodes a block whole, and two queries' blocks
	// (this chunk's and the next's) are what the replay's memory is; a
	// quarter of it, for a few more round trips.
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"max_execution_time": int(WhatIfTimeout / time.Second),
		"max_block_size":     8192,
	}))
	warmFrom := q.warmFrom()
	chunks, err := r.whatIfChunks(ctx, q.Range, warmFrom, cmp.Or(q.chunkRows, whatIfChunkRows))
	if err != nil {
		return WhatIfReport{}, err
	}

	run := newReplayRun(q, warmFrom)
	full := make(chan []replayRow, whatIfBatches)
	empty := make(chan []replayRow, whatIfBatches+1)
	for range whatIfBatches + 1 {
		empty <- make([]replayRow, 0, whatIfBatch)
	}
	scanErr := make(chan error, 1)
	go func() {
		defer close(full)
		scanErr <- r.streamChunks(ctx, q.Range, warmFrom, run.names, chunks, full, empty)
	}()
	var runErr error
	for batch := range full {
		if runErr == nil {
			for i := range batch {
				if runErr = run.add(&batch[i]); runErr != nil {
					cancel() // stops the scanner; drain what it sent
					break
				}
			}
		}
		empty <- batch[:0]
	}
	if err := <-scanErr; runErr == nil && err != nil {
		runErr = err
	}
	if runErr != nil {
		return WhatIfReport{}, runErr
	}
	rep := run.report()
	rep.Duration = time.Since(start)
	return rep, nil
}

// whatIfChunkRows is about how many decisions one chunk holds: what
// ClickHouse sorts at once (about 100 MB on the server), twice over while
// the next chunk is sorted. A key with more decisions is a chunk of its own.
const whatIfChunkRows = 1 << 19

// keyRange is a chunk: the keys in [lo, hi).
type keyRange struct{ lo, hi string }

// whatIfChunks cuts rg's keys into ranges of about whatIfChunkRows
// decisions, reading the keys as a stream and keeping only the cuts.
func (r *Reader) whatIfChunks(ctx context.Context, rg Range, warmFrom time.Time, chunkRows int64) ([]keyRange, error) {
	rows, err := r.ch.Query(ctx, qWhatIfChunks, append(rg.args(), clickhouse.Named("warm_from", warmFrom.UTC().Truncate(time.Second)))...)
	if err != nil {
		return nil, fmt.Errorf("query what-if chunks: %w", err)
	}
	defer rows.Close()
	var out []keyRange
	var key, last string
	var n, sum int64
	for rows.Next() {
		if err := rows.Scan(&key, &n); err != nil {
			return nil, fmt.Errorf("scan what-if chunks: %w", err)
		}
		if len(out) == 0 || sum >= chunkRows {
			if len(out) > 0 {
				out[len(out)-1].hi = key
			}
			out = append(out, keyRange{lo: key})
			sum = 0
		}
		sum += n
		last = key
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read what-if chunks: %w", err)
	}
	if len(out) > 0 {
		// The smallest string after the last key: the bound stays a
		// plain comparison the primary key can serve.
		out[len(out)-1].hi = last + "\x00"
	}
	return out, nil
}

// streamChunks queries each chunk's decisions and sends them in batches
// taken from empty to full, until the chunks end or ctx does. The next
// chunk's query is sent while this one is read, so the server sorts it in
// the meantime.
func (r *Reader) streamChunks(ctx context.Context, rg Range, warmFrom time.Time, names queryNames, chunks []keyRange, full chan<- []replayRow, empty <-chan []replayRow) error {
	type opened struct {
		rows driver.Rows
		err  error
	}
	open := func(c keyRange) <-chan opened {
		ch := make(chan opened, 1)
		go func() {
			rows, err := r.ch.Query(ctx, qWhatIf, append(rg.args(), clickhouse.Named("warm_from", warmFrom.UTC().Truncate(time.Second)), clickhouse.Named("lo", c.lo), clickhouse.Named("hi", c.hi),
				clickhouse.Named("plans", names.plans), clickhouse.Named("routes", names.routes))...)
			ch <- opened{rows, err}
		}()
		return ch
	}
	var next <-chan opened
	defer func() {
		// A query sent ahead and not read: wait for it (ctx ends it
		// soon) and close it, so no goroutine or connection outlives us.
		if next != nil {
			if o := <-next; o.err == nil {
				o.rows.Close()
			}
		}
	}()
	if len(chunks) > 0 {
		next = open(chunks[0])
	}
	batch := <-empty
	for i := range chunks {
		o := <-next
		next = nil
		if o.err != nil {
			return fmt.Errorf("query what-if decisions: %w", o.err)
		}
		if i+1 < len(chunks) {
			next = open(chunks[i+1])
		}
		var err error
		if batch, err = scanChunk(ctx, o.rows, batch, full, empty); err != nil {
			return err
		}
	}
	if len(batch) > 0 {
		select {
		case full <- batch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return ctx.Err()
}

// scanChunk reads one chunk's rows into batch, sending each full batch
// and taking the next from empty; it returns the batch being filled.
func scanChunk(ctx context.Context, rows driver.Rows, batch []replayRow, full chan<- []replayRow, empty <-chan []replayRow) ([]replayRow, error) {
	defer rows.Close()
	for rows.Next() {
		batch = batch[:len(batch)+1]
		d := &batch[len(batch)-1]
		if err := rows.Scan(&d.key, &d.kind, &d.plan, &d.route, &d.counted, &d.rule, &d.atUS, &d.cost, &d.allowed, &d.store, &d.inRange, &d.nat, &d.split); err != nil {
			return batch, fmt.Errorf("scan what-if decisions: %w", err)
		}
		if len(batch) == cap(batch) {
			select {
			case full <- batch:
			case <-ctx.Done():
				return batch, ctx.Err()
			}
			batch = <-empty
		}
	}
	if err := rows.Err(); err != nil {
		return batch, fmt.Errorf("read what-if decisions: %w", err)
	}
	return batch, nil
}
