package limiter

import (
	"context"
	"math"
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
}

type memState struct {
	// token bucket
	tokens, ts int64
	// sliding window
	window, cur, prev int64
	expires           int64 // µs
}

// NewMemory returns an in-memory store holding at most maxKeys rule states
// (default 1<<20 when maxKeys ≤ 0); now defaults to time.Now.
func NewMemory(now func() time.Time, maxKeys int) *Memory {
	if now == nil {
		now = time.Now
	}
	if maxKeys <= 0 {
		maxKeys = 1 << 20
	}
	return &Memory{now: now, max: maxKeys, state: make(map[string]*memState)}
}

// Allow checks cost units of key against every rule, atomically.
func (m *Memory) Allow(_ context.Context, key string, rules []Rule, cost int64) (Decision, error) {
	if err := validate(key, rules, cost); err != nil {
		return Decision{}, err
	}
	if d, ok := overCapacity(rules, cost); ok {
		return d, nil
	}
	now := m.now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	evals := make([]eval, len(rules))
	keys := make([]string, len(rules))
	allowed := true
	for i, rule := range rules {
		keys[i] = ruleKey("mem", key, rule)
		st := m.state[keys[i]]
		if st != nil && st.expires <= now {
			st = nil
		}
		if rule.algorithm() == SlidingWindow {
			evals[i] = slidingWindow(st, rule, cost, now)
		} else {
			evals[i] = tokenBucket(st, rule, cost, now)
		}
		if !evals[i].ok && !rule.Shadow {
			allowed = false
		}
	}
	rr := make([]RuleResult, len(rules))
	for i, rule := range rules {
		rr[i] = evals[i].result(rule, allowed)
	}
	d := decide(rr)
	if !d.Allowed {
		return d, nil
	}
	if len(m.state)+len(rules) > m.max {
		m.sweep(now)
	}
	for i := range rules {
		if !rr[i].Allowed {
			continue // a shadow rule that denied does not consume
		}
		st := evals[i].next
		m.state[keys[i]] = &st
	}
	return d, nil
}

// sweep drops expired states and, if still too full, arbitrary ones:
// forgetting state only ever makes the limiter more lenient, once.
func (m *Memory) sweep(now int64) {
	for k, st := range m.state {
		if st.expires <= now {
			delete(m.state, k)
		}
	}
	for k := range m.state {
		if len(m.state) < m.max*9/10 {
			break
		}
		delete(m.state, k)
	}
}

// Len reports how many rule states are held, expired or not.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.state)
}

const micro = 1_000_000

// eval is one rule's verdict on one request: whether it admits it, how
// long until it would, and its state if nothing or the request is consumed.
type eval struct {
	ok            bool
	retry         int64 // µs
	before, after struct{ remaining, reset int64 }
	next          memState
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

// tokenBucket mirrors allow.lua's token bucket.
func tokenBucket(st *memState, r Rule, cost, now int64) eval {
	limit, period := float64(r.Limit), float64(r.Period.Microseconds())
	capu := r.Capacity() * micro
	tokens := capu
	if st != nil {
		elapsed := max(0, now-st.ts)
		tokens = min(capu, st.tokens+int64(math.Floor(float64(elapsed)*limit*micro/period)))
	}
	need := cost * micro
	rate := limit * micro
	var e eval
	if tokens >= need {
		e.ok = true
	} else {
		e.retry = int64(math.Ceil(float64(need-tokens) * period / rate))
	}
	rest := tokens - need
	e.before.remaining = tokens / micro
	e.before.reset = int64(math.Ceil(float64(capu-tokens) * period / rate))
	e.after.remaining = max(0, rest) / micro
	e.after.reset = int64(math.Ceil(float64(capu-rest) * period / rate))
	e.next = memState{tokens: rest, ts: now, expires: now + e.after.reset + 1_000_000}
	return e
}

// slidingWindow mirrors allow.lua's sliding window counter.
func slidingWindow(st *memState, r Rule, cost, now int64) eval {
	limit, period := r.Limit, r.Period.Microseconds()
	w := now / period
	into := now - w*period
	var cur, prev int64
	if st != nil {
		switch {
		case st.window == w:
			cur, prev = st.cur, st.prev
		case st.window == w-1:
			prev = st.cur
		case st.window > w:
			w, into = st.window, 0
			cur, prev = st.cur, st.prev
		}
	}
	left := period - into
	used := prev*left + cur*period
	state := func(c, u int64) (rem, reset int64) {
		rem = max(0, (limit*period-u)/period)
		switch {
		case c > 0:
			reset = left + period
		case prev > 0:
			reset = left
		}
		return rem, reset
	}
	var e eval
	e.before.remaining, e.before.reset = state(cur, used)
	switch {
	case used+cost*period <= limit*period:
		e.ok = true
		e.after.remaining, e.after.reset = state(cur+cost, used+cost*period)
	case cur+cost <= limit:
		// wait until the previous window has decayed enough
		need := prev*left - (limit-cur-cost)*period
		e.retry = int64(math.Ceil(float64(need) / float64(prev)))
	default:
		// wait for the next window, where cur becomes prev
		var extra int64
		if cur > 0 {
			extra = max(0, period-int64(math.Floor(float64((limit-cost)*period)/float64(cur))))
		}
		e.retry = left + extra
	}
	e.next = memState{window: w, cur: cur + cost, prev: prev, expires: now + left + period + 1_000_000}
	return e
}
