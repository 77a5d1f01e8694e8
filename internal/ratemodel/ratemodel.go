// Package ratemodel is the reference model of the limiter's algorithms:
// one exact model of each, in plain Go with exact rationals and the time
// passed in, written from the documented semantics and sharing no code
// with the stores. It is the oracle of the randomized model tests
// (limiter.TestModel for the stores, gateway.TestGatewayModel for the
// gateway's paths) and is imported only by tests.
//
// It imports nothing of the module (limiter's own tests use it, so it
// cannot import limiter): a Rule here is the few numbers a model needs.
package ratemodel

import (
	"math/big"
	"time"
)

// Rule is what a model needs of a limiter rule.
type Rule struct {
	Limit  int64
	Period time.Duration
	// Capacity is the token bucket's burst (the limiter's
	// Rule.Capacity()); a sliding window's is its Limit.
	Capacity int64
	// Sliding selects the sliding window counter.
	Sliding bool
	// Share marks a split's share of a limit (the limiter's Rule.Share):
	// a raised capacity keeps the tokens instead of adding the difference,
	// unless the bucket is full, and a lowered one clamps them.
	Share bool
}

// Model is either algorithm's model of one key under one rule. Times are
// in microseconds.
type Model interface {
	// Room is how many units would be left after cost at now; negative:
	// the model denies.
	Room(now, cost int64) *big.Rat
	// Take consumes cost at now.
	Take(now, cost int64)
	// Change switches to rule r at now, as a store does at a key's first
	// check under the new rule.
	Change(r Rule, now int64)
}

// New returns a fresh model of r (a full bucket, an empty window).
func New(r Rule, now int64) Model {
	if r.Sliding {
		return NewWindow(r)
	}
	return NewBucket(r, now)
}

// Int is n as a rational.
func Int(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

// Bucket is a continuous-time token bucket.
type Bucket struct {
	Rule   Rule
	tokens *big.Rat // at ts
	ts     int64    // µs
}

// NewBucket returns a full bucket at now.
func NewBucket(r Rule, now int64) *Bucket {
	return &Bucket{Rule: r, tokens: Int(r.Capacity), ts: now}
}

// At returns the tokens at now: tokens + elapsed × Limit/Period, at most
// the capacity (tokens may be negative: overdrawn by a lowered capacity);
// time never runs backwards.
func (b *Bucket) At(now int64) *big.Rat {
	elapsed := max(0, now-b.ts)
	refill := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(elapsed), big.NewInt(b.Rule.Limit)), big.NewInt(b.Rule.Period.Microseconds()))
	t := new(big.Rat).Add(b.tokens, refill)
	if c := Int(b.Rule.Capacity); t.Cmp(c) > 0 {
		return c
	}
	return t
}

// Change refills at the old rate up to now, then carries what was used
// into the new capacity: the tokens move by the capacity's difference,
// either way, so a lowered capacity may leave them negative (overdrawn).
// A share is the exception: one that grows keeps its tokens unless it is
// full (its units moved from another gateway's), one that shrinks clamps.
func (b *Bucket) Change(r Rule, now int64) {
	t := b.At(now)
	d := r.Capacity - b.Rule.Capacity
	if !r.Share || (d > 0 && t.Cmp(Int(b.Rule.Capacity)) >= 0) {
		t.Add(t, Int(d))
	}
	if c := Int(r.Capacity); t.Cmp(c) > 0 {
		t = c
	}
	b.Rule, b.tokens, b.ts = r, t, max(now, b.ts)
}

// Room is how many tokens would be left after cost at now.
func (b *Bucket) Room(now, cost int64) *big.Rat {
	return new(big.Rat).Sub(b.At(now), Int(cost))
}

// Take consumes cost tokens at now (the model may go negative: a store
// that over-admitted is then judged on from there).
func (b *Bucket) Take(now, cost int64) {
	b.tokens, b.ts = b.Room(now, cost), max(now, b.ts)
}

// Window is the documented sliding window counter: units admitted per
// fixed window (aligned to the Unix epoch), the previous one weighted by
// how much of it the sliding Period still covers.
type Window struct {
	Rule    Rule
	counts  map[int64]int64 // window index → units admitted
	carried map[int64]bool  // windows holding use carried from another period
}

// NewWindow returns an empty window counter.
func NewWindow(r Rule) *Window {
	return &Window{Rule: r, counts: map[int64]int64{}, carried: map[int64]bool{}}
}

// Used is the weighted count at now, the previous window's count, and
// whether the current window holds use carried from another period.
func (m *Window) Used(now int64) (used *big.Rat, prev int64, carried bool) {
	p := m.Rule.Period.Microseconds()
	w := now / p
	prev = m.counts[w-1]
	weight := new(big.Rat).SetFrac64(p-(now-w*p), p)
	u := new(big.Rat).Mul(Int(prev), weight)
	return u.Add(u, Int(m.counts[w])), prev, m.carried[w]
}

// Change applies a changed limit to the counts as they are; a changed
// period carries what was used (rounded up) into the new period's
// current window.
func (m *Window) Change(r Rule, now int64) {
	if r.Period == m.Rule.Period {
		m.Rule = r
		return
	}
	u, _, _ := m.Used(now)
	carry := new(big.Int).Div(new(big.Int).Add(u.Num(), new(big.Int).Sub(u.Denom(), big.NewInt(1))), u.Denom()).Int64() // ceil
	m.Rule, m.counts, m.carried = r, map[int64]int64{}, map[int64]bool{}
	w := now / r.Period.Microseconds()
	m.counts[w], m.carried[w] = carry, carry > 0
}

// Room is how many units would be left after cost at now.
func (m *Window) Room(now, cost int64) *big.Rat {
	u, _, _ := m.Used(now)
	return u.Sub(Int(m.Rule.Limit-cost), u)
}

// Take counts cost units at now.
func (m *Window) Take(now, cost int64) {
	m.counts[now/m.Rule.Period.Microseconds()] += cost
}

// Fixed is the documented calendar rule: units admitted per fixed window,
// at most Limit plus the window's grants. The windows come from Bounds,
// which a test writes from the calendar dates it expects (not from the
// limiter's arithmetic): the window holding now, its start and end in µs.
type Fixed struct {
	Limit  int64
	Bounds func(now int64) (start, end int64)
	counts map[int64]int64 // window start → units admitted
	grants map[int64]int64 // window start → units granted
}

// NewFixed returns an empty calendar counter.
func NewFixed(limit int64, bounds func(now int64) (start, end int64)) *Fixed {
	return &Fixed{Limit: limit, Bounds: bounds, counts: map[int64]int64{}, grants: map[int64]int64{}}
}

// Room is how many units would be left in now's window after cost.
func (f *Fixed) Room(now, cost int64) *big.Rat {
	w, _ := f.Bounds(now)
	return Int(f.Limit + f.grants[w] - f.counts[w] - cost)
}

// Take counts cost units at now.
func (f *Fixed) Take(now, cost int64) {
	w, _ := f.Bounds(now)
	f.counts[w] += cost
}

// Grant adds units to now's window's allowance (negative takes back, never
// below no grant).
func (f *Fixed) Grant(now, units int64) {
	w, _ := f.Bounds(now)
	f.grants[w] = max(0, f.grants[w]+units)
}

// Change keeps the counts (in units) under a changed limit.
func (f *Fixed) Change(r Rule, _ int64) { f.Limit = r.Limit }
