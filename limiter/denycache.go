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
// key allowed again, and no other gateway can refill it faster. The waits
// it reports count from the reply's arrival instead, which is after Redis
// decided, so a client that waits them is admitted: counted from the
// send, they would come short by the call's whole latency.
type denyCache struct {
	shards [denyShards]denyShard
	per    int
}

type denyShard struct {
	mu sync.RWMutex
	m  map[uint64]denyEntry
}

type denyEntry struct {
	key     string    // guards against fingerprint collisions
	until   time.Time // send time + retry-after: deny no longer
	at      time.Time // when the reply arrived: waits count from here
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
	return d, true
}

// ForgetDenial drops the denial cached for key under rules, if any. A
// caller that starts checking key under other rules (a directive raised
// them) calls it with the rules it no longer uses: Redis converts key's
// state to the new rules and refills it at their rate, so should the old
// rules return (the directive lapses), their cached denial could refuse
// what Redis admits. It costs a fingerprint and a map lookup.
func (r *Redis) ForgetDenial(key string, rules []Rule) {
	if r.deny == nil {
		return
	}
	r.deny.drop(fingerprint(key, rules), key)
}

func (c *denyCache) drop(fp uint64, key string) {
	s := &c.shards[fp%denyShards]
	s.mu.RLock()
	e, ok := s.m[fp]
	s.mu.RUnlock()
	if !ok || e.key != key {
		return
	}
	s.mu.Lock()
	if e, ok := s.m[fp]; ok && e.key == key {
		delete(s.m, fp)
	}
	s.mu.Unlock()
}

// calendarDenyHold is the longest a denial by a calendar rule is cached.
// Such a denial lasts until the window ends (days), but a grant (Grant)
// or a reset on any gateway lifts it in Redis: every gateway's cache then
// follows within this.
const calendarDenyHold = time.Second

// denyHold is how long d may be cached at most: its retry, or
// calendarDenyHold when a calendar rule denied.
func denyHold(d Decision) time.Duration {
	hold := d.RetryAfter()
	for _, rr := range d.Rules {
		if !rr.Allowed && rr.Rule.Calendar != nil {
			hold = min(hold, calendarDenyHold)
		}
	}
	return hold
}

// put caches d, which Redis gave a call sent at sent and answered at recv,
// for hold at most (see denyHold).
func (c *denyCache) put(fp uint64, key string, cost int64, sent, recv time.Time, d Decision, hold time.Duration) {
	until := sent.Add(hold)
	if !until.After(recv) {
		return
	}
	s := &c.shards[fp%denyShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[fp]; !ok && len(s.m) >= c.per {
		for k, e := range s.m {
			if !recv.Before(e.until) {
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
	s.m[fp] = denyEntry{key: key, until: until, at: recv, minCost: cost, d: d}
}
