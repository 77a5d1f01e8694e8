package limiter

import (
	"sync"
	"time"
)

const denyShards = 16

// denyCache remembers keys that Redis denied until a known time, so a hot
// key's denials are answered from memory. It is exact: an entry ends at
// send time + retry-after, and Redis decided after the send, so the cache
// stops denying no later than Redis would. Only refill can make a denied
// key allowed again, and no other gateway can refill it faster.
type denyCache struct {
	shards [denyShards]denyShard
	per    int
}

type denyShard struct {
	mu sync.RWMutex
	m  map[uint64]denyEntry
}

type denyEntry struct {
	key     string // guards against fingerprint collisions
	until   time.Time
	at      time.Time // when the decision was cached
	minCost int64     // other costs have other retry times
	d       Decision
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{per: max(1, size/denyShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[uint64]denyEntry)
	}
	return c
}

func (c *denyCache) get(fp uint64, key string, cost int64, now time.Time) (Decision, bool) {
	s := &c.shards[fp%denyShards]
	s.mu.RLock()
	e, ok := s.m[fp]
	s.mu.RUnlock()
	if !ok || e.key != key || cost != e.minCost || !now.Before(e.until) {
		return Decision{}, false
	}
	since := now.Sub(e.at)
	d := e.d
	d.Cached = true
	d.Time = now
	d.Rules = make([]RuleResult, len(e.d.Rules))
	for i, r := range e.d.Rules {
		r.RetryAfter = max(0, r.RetryAfter-since)
		r.ResetAfter = max(0, r.ResetAfter-since)
		d.Rules[i] = r
	}
	d.Rules[d.Binding].RetryAfter = e.until.Sub(now)
	return d, true
}

func (c *denyCache) put(fp uint64, key string, cost int64, until time.Time, d Decision) {
	now := until.Add(-d.RetryAfter())
	if !until.After(now) {
		return
	}
	s := &c.shards[fp%denyShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[fp]; !ok && len(s.m) >= c.per {
		for k, e := range s.m {
			if !now.Before(e.until) {
				delete(s.m, k)
			}
		}
		// Still full: drop an arbitrary entry. Forgetting a denial only
		// costs a Redis call, never a wrong answer.
		for k := range s.m {
			if len(s.m) < c.per {
				break
			}
			delete(s.m, k)
		}
	}
	s.m[fp] = denyEntry{key: key, until: until, at: now, minCost: cost, d: d}
}
