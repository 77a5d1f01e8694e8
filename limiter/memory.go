package limiter

import (
	"container/heap"
	"context"
	"math"
	"math/bits"
	"sync"
	"time"
)

// Memory checks rules in this process's memory with the same semantics as
// Redis: all-or-nothing, micro-token buckets, sliding window counters and
// state that expires when idle. It serves the embedded default and the
// gateway's local failure policy.
type Memory struct {
	now func() time.Time
	max int

	mu    sync.Mutex
	state map[string]*memState
	// ids lists each key's states, for Clear.
	ids map[string][]*memState
	// byExpiry orders states by when they read as full again, so expired
	// states are dropped a few per call (no call pays for a sweep of the
	// whole map) and, over capacity, the state closest to full goes first.
	// It is lazy: a write that moves a state's expiry later (the usual
	// case) leaves its entry alone, and the entry is requeued when it
	// reaches the top, so a write to a held state costs no heap work.
	byExpiry expiryHeap
}

// memState is one rule's state for one key. It remembers the rule it was
// written under, so a changed rule converts it instead of misreading it.
type memState struct {
	limit, period, capacity int64 // period in µs
	// token bucket: micro-tokens (negative while a lowered capacity is
	// overdrawn), last update in µs
	tokens, ts int64
	// sliding window: window index (in periods), counts in it and the one
	// before; calendar: the window's start (µs), its count, and period is
	// the window's length
	window, cur, prev int64
	// granted is what Grant added to a calendar window
	granted int64
	// leases are an in-flight rule's: their expiries (µs) by lease id
	leases  map[uint64]int64
	expires int64 // µs: from then on the state reads as full

	key    string
	id     string // the limiter key it belongs to
	queued int64  // the expiry its byExpiry entry carries; ≤ expires
}

// sweepPerCall bounds the expired states one call drops, so no call
// stalls; memory is handed back a few states per call. Churn beyond that
// is bounded by maxKeys, whose eviction takes expired states first anyway.
const sweepPerCall = 4

// NewMemory returns an in-memory store holding at most maxKeys rule states
// (default 1<<20 when maxKeys ≤ 0); now defaults to time.Now.
func NewMemory(now func() time.Time, maxKeys int) *Memory {
	if now == nil {
		now = time.Now
	}
	if maxKeys <= 0 {
		maxKeys = 1 << 20
	}
	return &Memory{now: now, max: maxKeys, state: make(map[string]*memState), ids: make(map[string][]*memState)}
}

// Allow checks cost units of key against every rule, atomically; a rule
// with a Cost of its own is charged that instead.
func (m *Memory) Allow(_ context.Context, key string, rules []Rule, cost int64) (Decision, error) {
	if err := validate(key, rules, cost); err != nil {
		return Decision{}, err
	}
	if err := leased(rules); err != nil {
		return Decision{}, err
	}
	if d, ok := overCapacity(rules, cost); ok {
		d.Time = m.now()
		return d, nil
	}
	return m.allow(key, rules, cost, false), nil
}

// allow is Allow's check of valid rules; over makes it a settlement
// (see Redis.Settle): every charge admits, overdrawing.
func (m *Memory) allow(key string, rules []Rule, cost int64, over bool) Decision {
	// A split's check is decided with each share's whole (see
	// Directives.Split), whose state is the key's own.
	check, owner := rules, make([]string, 0, 2*len(rules))
	whole, split := wholeKey(key, rules)
	if split {
		check = withWholes(rules)
	}
	keys := make([]string, len(check))
	for i, rule := range check {
		owner = append(owner, key)
		if i >= len(rules) {
			owner[i] = whole
		}
		keys[i] = ruleKey("mem", owner[i], rule)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The clock is read under the lock: a caller that waited for it must
	// not write a timestamp older than the last one, or the next caller
	// would refill that interval a second time.
	at := m.now()
	now := at.UnixMicro()
	m.dropExpired(now, sweepPerCall)
	evals := make([]eval, len(check))
	sts := make([]*memState, len(check))
	others := make([]*memState, len(check))
	for i, rule := range check {
		sts[i], others[i] = m.lookup(owner[i], rule, now)
	}
	allowed := true
	for i, rule := range check {
		st, other := sts[i], others[i]
		c := rule.charge(cost)
		switch rule.algorithm() {
		case FixedWindow:
			evals[i] = fixedWindow(st, rule, c, now, over)
			if other != nil {
				evals[i].converted, evals[i].convExpires = true, evals[i].next.expires
			}
		case InFlight:
			evals[i] = inFlight(st, rule, c, now)
		case SlidingWindow:
			evals[i] = slidingWindow(st, rule, c, now, over)
			if other != nil {
				evals[i].converted, evals[i].convExpires = true, evals[i].next.expires
			}
		default:
			evals[i] = tokenBucket(st, rule, c, now, over)
			if other != nil && c <= rule.Capacity() {
				evals[i].converted, evals[i].convExpires = true, now+evals[i].before.reset+micro
			}
		}
		if !evals[i].ok && !rule.Shadow {
			allowed = false
		}
	}
	rr := make([]RuleResult, len(check))
	for i, rule := range check {
		rr[i] = evals[i].result(rule, allowed)
	}
	d := decide(rr)
	d.Time = at
	for i := range check {
		switch {
		case d.Allowed && rr[i].Allowed:
			m.put(owner[i], keys[i], evals[i].next)
		case evals[i].converted:
			// A state read under another rule is written back converted
			// (consuming nothing), so the rule change takes effect once and
			// the RetryAfter just given holds.
			m.put(owner[i], keys[i], evals[i].unconsumed(check[i]))
		default:
			// Nothing is written: a denied request consumes nothing, nor
			// does a shadow rule that denied.
			continue
		}
		if others[i] != nil {
			// replaced by the state converted from it
			m.drop(others[i])
		}
	}
	// Over capacity, forget the states closest to full: each reads as full
	// once forgotten, so this mints the fewest tokens, and never those of a
	// drained key while any state nearer to full is held.
	for len(m.state) > m.max {
		if st := m.first(); st != nil {
			m.evict(st)
		}
	}
	if split {
		d = joinWholes(d, rules)
	}
	return d
}

// lookup returns rule's state for key at now; nil when it has none. A
// rule whose algorithm changed has its state under another one
// converted, as allow.lua does: what that state had used at now, in units
// by the rule it was written under and rounded up, carries into the
// current window of a sliding window or a calendar rule, or out of a full
// token bucket. other is then that state, to be dropped once the
// converted one is written.
func (m *Memory) lookup(key string, rule Rule, now int64) (st, other *memState) {
	algo := rule.algorithm()
	if st = m.state[ruleKey("mem", key, rule)]; st != nil && st.expires > now {
		return st, nil
	}
	if algo == InFlight {
		return nil, nil // leases convert to nothing, nor from anything
	}
	var used int64
	for _, oa := range families {
		if oa == algo {
			continue
		}
		o := m.state[legacyKey("mem", key, rule.bucket(), oa)]
		if o == nil || o.expires <= now {
			continue
		}
		switch oa {
		case TokenBucket:
			used = ceilDiv(o.capacity*micro-refilled(o, now), micro)
		case SlidingWindow:
			used = windowUse(o, now)
		case FixedWindow:
			// (an unexpired calendar state's window is still running)
			used = o.cur
		}
		other = o
		break
	}
	if other == nil {
		return nil, nil
	}
	var conv memState
	switch algo {
	case FixedWindow:
		start, end := rule.Calendar.Bounds(time.UnixMicro(now))
		ws := start.UnixMicro()
		conv = memState{limit: rule.Limit, period: end.UnixMicro() - ws, capacity: rule.Limit, window: ws, cur: used}
	case SlidingWindow:
		period := rule.Period.Microseconds()
		conv = memState{limit: rule.Limit, period: period, capacity: rule.Limit, window: now / period, cur: used}
	default:
		// overdrawn when a lowered limit's window had used more
		tokens := (rule.Capacity() - used) * micro
		conv = memState{limit: rule.Limit, period: rule.Period.Microseconds(), capacity: rule.Capacity(), tokens: tokens, ts: now}
	}
	return &conv, other
}

func (m *Memory) put(id, key string, next memState) {
	st := m.state[key]
	if st == nil {
		st = &memState{key: key, id: id, queued: math.MaxInt64}
		m.state[key] = st
		m.ids[id] = append(m.ids[id], st)
	}
	next.key, next.id, next.queued = st.key, st.id, st.queued
	*st = next
	if st.expires < st.queued {
		// Earlier than its entry says (a new state, or a rule lowered):
		// queue it afresh; the old entry is stale and will be skipped.
		st.queued = st.expires
		heap.Push(&m.byExpiry, expiryEntry{at: st.expires, st: st})
	}
}

// first returns the state that expires first, or nil when the top entry
// was stale or requeued (each such step is one unit of work).
func (m *Memory) first() *memState {
	e := m.byExpiry[0]
	st := e.st
	switch {
	case m.state[st.key] != st || e.at != st.queued:
		heap.Pop(&m.byExpiry) // stale: evicted, or queued again since
		return nil
	case st.expires > e.at:
		m.byExpiry[0].at, st.queued = st.expires, st.expires
		heap.Fix(&m.byExpiry, 0)
		return nil
	}
	return st
}

// dropExpired does at most n steps of dropping states that read as full
// anyway.
func (m *Memory) dropExpired(now int64, n int) {
	for ; n > 0 && len(m.byExpiry) > 0 && m.byExpiry[0].at <= now; n-- {
		if st := m.first(); st != nil {
			m.evict(st)
		}
	}
}

// evict forgets st; its entry must be the heap's top.
func (m *Memory) evict(st *memState) {
	heap.Pop(&m.byExpiry)
	m.drop(st)
}

// drop forgets st; its heap entries, if any are left, read as stale.
func (m *Memory) drop(st *memState) {
	delete(m.state, st.key)
	ids := m.ids[st.id]
	for i, s := range ids {
		if s == st {
			ids[i] = ids[len(ids)-1]
			ids[len(ids)-1] = nil
			ids = ids[:len(ids)-1]
			break
		}
	}
	if len(ids) == 0 {
		delete(m.ids, st.id)
	} else {
		m.ids[st.id] = ids
	}
}

// Len reports how many rule states are held, expired or not.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.state)
}

// expiryEntry queues a state at the expiry it had when queued.
type expiryEntry struct {
	at int64
	st *memState
}

// expiryHeap is a min-heap of entries by expiry.
type expiryHeap []expiryEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiryEntry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = expiryEntry{}
	*h = old[:len(old)-1]
	return e
}

const micro = 1_000_000

// maxWait caps retry and reset times (2^53 µs, about 285 years), where
// allow.lua's doubles stop counting microseconds exactly.
const maxWait = 1 << 53

// eval is one rule's verdict on one request: whether it admits it, how
// long until it would, and its state if nothing or the request is consumed.
type eval struct {
	ok            bool
	retry         int64 // µs
	before, after struct{ remaining, reset int64 }
	next          memState // the state once the request is consumed
	// converted is set when the stored state was written under another
	// rule; convExpires is when it reads as full, nothing consumed.
	converted   bool
	convExpires int64
	// used is what next took: micro-tokens, or units of a sliding
	// window's current count; negative for a give-back.
	used int64
}

// unconsumed is the state converted to the current rule, without what the
// request took or gave back.
func (e eval) unconsumed(r Rule) memState {
	st := e.next
	if r.algorithm() != TokenBucket {
		st.cur -= e.used
	} else {
		st.tokens += e.used
	}
	st.expires = e.convExpires
	return st
}

// result reports the rule's state after the call: consumed only when the
// whole request was allowed and the rule admitted it.
func (e eval) result(r Rule, allowed bool) RuleResult {
	st := e.before
	if allowed && e.ok {
		st = e.after
	}
	return RuleResult{
		Rule:       r,
		Allowed:    e.ok,
		Remaining:  st.remaining,
		RetryAfter: time.Duration(e.retry) * time.Microsecond,
		ResetAfter: time.Duration(st.reset) * time.Microsecond,
	}
}

// mulDiv returns a×b/c rounded down (or up), exactly, for a, b ≥ 0 and
// c > 0, saturating at maxWait-sized results rather than overflowing.
func mulDiv(a, b, c int64, up bool) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if up && r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// waitMicros is mulDiv rounded up and capped at maxWait.
func waitMicros(a, b, c int64) int64 { return min(maxWait, mulDiv(a, b, c, true)) }

// refilled is a token bucket state's micro-tokens at now, refilled at the
// rate it was written under, at most its capacity. The refill is capped at
// what fills the bucket (more than its capacity when it is overdrawn), so
// the sum cannot overflow.
func refilled(st *memState, now int64) int64 {
	room := st.capacity*micro - st.tokens
	return st.tokens + min(room, mulDiv(max(0, now-st.ts), st.limit*micro, st.period, false))
}

// tokenBucket mirrors allow.lua's token bucket. A state written under
// another rule refills at that rule's rate up to now, then takes the new
// capacity carrying what was used, as GCRA does: a raised capacity adds
// its difference to the tokens, a lowered one takes it away, which may
// leave the bucket overdrawn (negative tokens: denied until it refills to
// the cost). Clamped instead, a key checked under both capacities
// (gateways mid reload) was held to neither. A split's share (Rule.Share)
// that grows adds nothing unless it reads as full (a full state is no
// state: forgotten, it would start full at the new capacity): the units
// moved from another gateway's share. A share that shrinks clamps: its
// growth added nothing, so nothing is taken back.
func tokenBucket(st *memState, r Rule, cost, now int64, over bool) eval {
	limit, period := r.Limit, r.Period.Microseconds()
	capu := r.Capacity() * micro
	tokens, ts := capu, now
	if st != nil {
		oldCap := st.capacity * micro
		tokens = refilled(st, now)
		if !r.Share || (capu > oldCap && tokens >= oldCap) {
			tokens += capu - oldCap
		}
		tokens = min(tokens, capu)
		// A clock stepping back never rewinds the timestamp, so no
		// interval is refilled twice.
		ts = max(now, st.ts)
	}
	var e eval
	if cost > r.Capacity() && !over {
		// Only a shadow rule gets here (overCapacity answers the others);
		// no wait helps, and cost × 10^6 might not fit.
		e.before.remaining, e.before.reset = max(0, tokens)/micro, waitMicros(capu-tokens, period, limit*micro)
		return e
	}
	need := cost * micro
	if cost < 0 {
		// A give-back fills up to the capacity, never past it, and so
		// never needs more than the capacity's worth (-cost × 10^6 might
		// not fit).
		need = max(tokens-capu, min(-cost, r.Capacity())*-micro)
	}
	rate := limit * micro
	if tokens >= need || over {
		e.ok = true
	} else {
		e.retry = waitMicros(need-tokens, period, rate)
	}
	rest := tokens - need
	if over && rest < -capu {
		// A settlement's debt stops at one capacity, or where it was.
		rest = min(tokens, -capu)
	}
	need = tokens - rest
	e.used = need
	e.before.remaining = max(0, tokens) / micro
	e.before.reset = waitMicros(capu-tokens, period, rate)
	e.after.remaining = max(0, rest) / micro
	e.after.reset = waitMicros(capu-rest, period, rate)
	e.next = memState{limit: limit, period: period, capacity: r.Capacity(), tokens: rest, ts: ts, expires: now + e.after.reset + micro}
	if st != nil && (st.limit != limit || st.period != period || st.capacity != r.Capacity()) {
		e.converted, e.convExpires = true, now+e.before.reset+micro
	}
	return e
}

// inFlight mirrors allow.lua's in-flight rule: at most r.Limit leases
// running at once; cost 1 takes r.Lease (renews it, when the key holds
// it), -1 releases it.
func inFlight(st *memState, r Rule, cost, now int64) eval {
	live := map[uint64]int64{}
	if st != nil {
		for id, exp := range st.leases {
			if exp > now {
				live[id] = exp
			}
		}
	}
	state := func() (rem, reset int64) {
		for _, exp := range live {
			reset = max(reset, exp-now)
		}
		return max(0, r.Limit-int64(len(live))), reset
	}
	var e eval
	e.before.remaining, e.before.reset = state()
	first := int64(math.MaxInt64)
	for _, exp := range live {
		first = min(first, exp)
	}
	_, mine := live[r.Lease]
	switch {
	case cost < 0:
		e.ok = true
		delete(live, r.Lease)
	case cost == 0:
		e.ok = int64(len(live)) < r.Limit || mine
	case mine || int64(len(live)) < r.Limit:
		e.ok = true
		live[r.Lease] = now + r.Period.Microseconds()
	default:
		// a slot frees when an answer ends, or at the first expiry
		e.retry = min(first-now, micro)
	}
	e.after.remaining, e.after.reset = state()
	e.next = memState{limit: r.Limit, period: r.Period.Microseconds(), capacity: r.Limit, leases: live, expires: now + e.after.reset + micro}
	return e
}

// swDenom is the resolution of the previous window's weight: 2^20, so
// counts (≤ 2^32) times weights stay below 2^53, exact in Lua's doubles.
const swDenom = 1 << 20

// prevWeight is the previous window's weight, in 1/swDenom, when left µs
// of the current window remain: left/period rounded up (so the counter
// errs by at most prev/2^20 units, in the limiter's favour). allow.lua
// computes the same expression in the same IEEE doubles, so both agree.
func prevWeight(left, period int64) int64 {
	return min(swDenom, int64(math.Floor(float64(left)*swDenom/float64(period)))+1)
}

// maxWeight is the largest weight k with prev×k ≤ room×swDenom.
func maxWeight(prev, room int64) int64 {
	k := min(swDenom, int64(math.Floor(float64(room)*swDenom/float64(prev))))
	for k > 0 && prev*k > room*swDenom {
		k--
	}
	for k < swDenom && prev*(k+1) <= room*swDenom {
		k++
	}
	return k
}

// lastLeft is the most µs left in a window at which the previous window's
// weight is at most k (k ≥ 1).
func lastLeft(k, period int64) int64 {
	l := min(period, int64(math.Ceil(float64(k)*float64(period)/swDenom))-1)
	for l < period && prevWeight(l+1, period) <= k {
		l++
	}
	for l > 0 && prevWeight(l, period) > k {
		l--
	}
	return l
}

// windowUse is what a sliding window state has used at now, in units, by
// the period it was written under; the counts of a window that Redis'
// clock stepped back across are kept whole.
func windowUse(st *memState, now int64) int64 {
	w := now / st.period
	switch {
	case st.window == w:
		return st.cur + ceilDiv(st.prev*prevWeight(st.period-(now-w*st.period), st.period), swDenom)
	case st.window == w-1:
		return ceilDiv(st.cur*prevWeight(st.period-(now-w*st.period), st.period), swDenom)
	case st.window > w:
		return st.cur + st.prev
	}
	return 0
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// slidingWindow mirrors allow.lua's sliding window counter. A state
// written under another period carries what it had used at now into the
// current window of the new period; a changed limit needs nothing, counts
// are in units.
func slidingWindow(st *memState, r Rule, cost, now int64, over bool) eval {
	limit, period := r.Limit, r.Period.Microseconds()
	w := now / period
	into := now - w*period
	var cur, prev int64
	if st != nil {
		switch {
		case st.period != period:
			cur = windowUse(st, now)
		case st.window == w:
			cur, prev = st.cur, st.prev
		case st.window == w-1:
			prev = st.cur
		case st.window > w:
			// Redis' clock stepped back across a window: keep the newer counts.
			w, into = st.window, 0
			cur, prev = st.cur, st.prev
		}
	}
	left := period - into
	k := prevWeight(left, period)
	state := func(c int64) (rem, reset int64) {
		rem = max(0, limit-c-ceilDiv(prev*k, swDenom))
		switch {
		case c > 0:
			reset = left + period
		case prev > 0:
			reset = left
		}
		return rem, reset
	}
	var e eval
	e.before.remaining, e.before.reset = state(cur)
	giveBack := cost < 0
	if giveBack {
		// A give-back lowers the current window's count, not below 0; the
		// previous window's is history.
		cost = -min(-cost, cur)
	}
	e.used = cost
	room := limit - cur - cost
	switch {
	case giveBack:
		e.ok = true
		e.after.remaining, e.after.reset = state(cur + cost)
	case room >= 0 && prev*k <= room*swDenom:
		e.ok = true
		e.after.remaining, e.after.reset = state(cur + cost)
	case over:
		// A settlement overdraws, its debt stopping at the limit again.
		cost = max(cur, min(cur+cost, 2*limit)) - cur
		e.used, e.ok = cost, true
		e.after.remaining, e.after.reset = state(cur + cost)
	case cost > limit:
		// only a shadow rule gets here; no wait helps
	case room >= 0 && maxWeight(prev, room) >= 1:
		// wait until the previous window has decayed enough
		e.retry = left - lastLeft(maxWeight(prev, room), period)
	case cur <= limit-cost:
		// the next window, where cur becomes prev at full weight
		e.retry = left
	case maxWeight(cur, limit-cost) >= 1:
		e.retry = left + period - lastLeft(maxWeight(cur, limit-cost), period)
	default:
		e.retry = left + period
	}
	e.next = memState{limit: limit, period: period, capacity: limit, window: w, cur: cur + cost, prev: prev, expires: now + left + period + micro}
	if st != nil && st.period != period {
		e.converted, e.convExpires = true, e.next.expires
	}
	return e
}

// fixedWindow mirrors allow.lua's calendar rule: a fixed window of the
// rule's calendar at the store's clock, admitting Limit plus the window's
// grant. A state is keyed by its window's start: one of an earlier window
// that has ended reads as none; one of a later window (the clock stepped
// back across the boundary) is kept as the window; one of an earlier
// window still running by its own length (the rule's calendar changed)
// carries its count and grant into the window that holds now.
func fixedWindow(st *memState, r Rule, cost, now int64, over bool) eval {
	start, end := r.Calendar.Bounds(time.UnixMicro(now))
	ws, wl := start.UnixMicro(), end.UnixMicro()-start.UnixMicro()
	var cur, granted int64
	conv := false
	if st != nil {
		switch {
		case st.window == ws:
			cur, granted, conv = st.cur, st.granted, st.period != wl
		case st.window > ws:
			ws, wl, cur, granted = st.window, st.period, st.cur, st.granted
		case st.window+st.period > now:
			cur, granted, conv = st.cur, st.granted, true
		}
	}
	room := r.Limit + granted
	left := ws + wl - now
	state := func(c int64) (rem, reset int64) {
		if c > 0 {
			reset = left
		}
		return max(0, room-c), reset
	}
	var e eval
	e.before.remaining, e.before.reset = state(cur)
	giveBack := cost < 0
	if giveBack {
		// A give-back lowers the window's count, not below 0.
		cost = -min(-cost, cur)
	}
	e.used = cost
	switch {
	case giveBack || cur+cost <= room:
		e.ok = true
		e.after.remaining, e.after.reset = state(cur + cost)
	case over:
		// A settlement overdraws, its debt stopping at the limit again.
		cost = max(cur, min(cur+cost, room+r.Limit)) - cur
		e.used, e.ok = cost, true
		e.after.remaining, e.after.reset = state(cur + cost)
	case cost <= r.Limit:
		// the next window admits a cost up to the limit
		e.retry = left
	}
	e.next = memState{limit: r.Limit, period: wl, capacity: r.Limit, window: ws, cur: cur + cost, granted: granted, expires: ws + wl}
	if conv {
		e.converted, e.convExpires = true, ws+wl
	}
	return e
}
