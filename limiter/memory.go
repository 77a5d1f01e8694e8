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
	expires int64 // µs
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
	rr := make([]RuleResult, len(rules))
	next := make([]memState, len(rules))
	for i, rule := range rules {
		k := ruleKey("mem", key, rule)
		st := m.state[k]
		if st != nil && st.expires <= now {
			st = nil
		}
		if rule.algorithm() == SlidingWindow {
			rr[i], next[i] = slidingWindow(st, rule, cost, now)
		} else {
			rr[i], next[i] = tokenBucket(st, rule, cost, now)
		}
	}
	d := decide(rr)
	if !d.Allowed {
		return d, nil
	}
	if len(m.state)+len(rules) > m.max {
		m.sweep(now)
	}
	for i, rule := range rules {
		if !rr[i].Allowed {
			continue // a shadow rule that denied does not consume
		}
		st := next[i]
		m.state[ruleKey("mem", key, rule)] = &st
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

// tokenBucket mirrors allow.lua's token bucket.
func tokenBucket(st *memState, r Rule, cost, now int64) (RuleResult, memState) {
	limit, period := float64(r.Limit), float64(r.Period.Microseconds())
	capu := r.Capacity() * micro
	tokens := capu
	if st != nil {
		elapsed := max(0, now-st.ts)
		tokens = min(capu, st.tokens+int64(math.Floor(float64(elapsed)*limit*micro/period)))
	}
	need := cost * micro
	res := RuleResult{Rule: r}
	after := tokens
	if tokens >= need {
		res.Allowed = true
		after = tokens - need
	} else {
		res.RetryAfter = usec(math.Ceil(float64(need-tokens) * period / (limit * micro)))
	}
	res.Remaining = after / micro
	reset := math.Ceil(float64(capu-after) * period / (limit * micro))
	res.ResetAfter = usec(reset)
	return res, memState{tokens: after, ts: now, expires: now + int64(reset) + 1_000_000}
}

// slidingWindow mirrors allow.lua's sliding window counter.
func slidingWindow(st *memState, r Rule, cost, now int64) (RuleResult, memState) {
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
	res := RuleResult{Rule: r}
	if used+cost*period <= limit*period {
		res.Allowed = true
		cur += cost
		used += cost * period
	} else if cur+cost <= limit {
		need := prev*left - (limit-cur-cost)*period
		res.RetryAfter = usec(math.Ceil(float64(need) / float64(prev)))
	} else {
		var extra int64
		if cur > 0 {
			extra = max(0, period-int64(math.Floor(float64((limit-cost)*period)/float64(cur))))
		}
		res.RetryAfter = time.Duration(left+extra) * time.Microsecond
	}
	res.Remaining = max(0, (limit*period-used)/period)
	switch {
	case cur > 0:
		res.ResetAfter = time.Duration(left+period) * time.Microsecond
	case prev > 0:
		res.ResetAfter = time.Duration(left) * time.Microsecond
	}
	return res, memState{window: w, cur: cur, prev: prev, expires: now + left + period + 1_000_000}
}

func usec(f float64) time.Duration { return time.Duration(f) * time.Microsecond }
