package limiter

import (
	"slices"
	"sync"
	"time"
)

const denyShards = 16

// maxDenialsPerKey bounds the denials one key keeps under different rules
// (a route's rules beside its plan's, each route its own set).
const maxDenialsPerKey = 4

// denyCache remembers keys that Redis denied until a known time, so a hot
// key's denials are answered from memory. It is exact: an entry ends at
// send time + retry-after, and Redis decided after the send, so the cache
// stops denying no later than Redis would. Only refill can make a denied
// key allowed again, and no other gateway can refill it faster. The waits
// it reports count from the reply's arrival instead, which is after Redis
// decided, so a client that waits them is admitted: counted from the
// send, they would come short by the call's whole latency.
//
// A check of the key under other settings of a rule it holds (a NAT
// directive raised the limits, a split divided them) makes Redis convert
// that rule's state and refill it at the new rate: a denial made under
// the old settings is then no longer Redis' answer, should they return.
// So denials are kept by key, and a check that meets its key's denial
// under a conflicting setting drops it (see conflicts).
type denyCache struct {
	shards [denyShards]denyShard
	per    int // keys per shard
}

type denyShard struct {
	mu sync.RWMutex
	m  map[uint64]*keyDenials // by the key's hash
}

// keyDenials are one key's cached denials, each under other rules.
type keyDenials struct {
	key string // guards against hash collisions
	e   []denyEntry
}

type denyEntry struct {
	fp      uint64    // the key's and the rules' fingerprint
	rules   []ruleSig // what each rule was when Redis denied
	until   time.Time // send time + retry-after: deny no longer
	at      time.Time // when the reply arrived: waits count from here
	minCost int64     // other costs have other retry times
	d       Decision
}

// ruleSig is one rule of a cached denial: which state in Redis it is (id)
// and the settings it was checked with (set).
type ruleSig struct{ id, set uint64 }

func newDenyCache(size int) *denyCache {
	c := &denyCache{per: max(1, size/denyShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[uint64]*keyDenials)
	}
	return c
}

// get answers a check of key under rules at cost from a denial that still
// holds. A denial of key under conflicting settings of one of rules is
// dropped on the way.
func (c *denyCache) get(key string, rules []Rule, cost int64, now time.Time) (Decision, bool) {
	kh := keyHash(key)
	s := &c.shards[kh%denyShards]
	s.mu.RLock()
	kd := s.m[kh]
	if kd == nil || kd.key != key {
		s.mu.RUnlock()
		return Decision{}, false
	}
	fp := rulesHash(kh, rules)
	var (
		e           denyEntry
		found, drop bool
	)
	var sigs []ruleSig // rules', made only if the key holds other denials
	for i := range kd.e {
		if kd.e[i].fp == fp {
			e, found = kd.e[i], true
			continue
		}
		if sigs == nil {
			sigs = signatures(rules)
		}
		drop = drop || conflicts(kd.e[i].rules, sigs)
	}
	s.mu.RUnlock()
	if drop {
		s.mu.Lock()
		s.remove(kh, key, func(e denyEntry) bool { return e.fp != fp && conflicts(e.rules, sigs) })
		s.mu.Unlock()
	}
	if !found || cost != e.minCost || !now.Before(e.until) {
		return Decision{}, false
	}
	since := now.Sub(e.at)
	d := e.d
	d.Cached = true
	d.Time = now
	d.Seq, d.SeqEpoch = 0, time.Time{} // no store decision: no number
	d.Rules = make([]RuleResult, len(e.d.Rules))
	for i, r := range e.d.Rules {
		r.RetryAfter = max(0, r.RetryAfter-since)
		r.ResetAfter = max(0, r.ResetAfter-since)
		d.Rules[i] = r
	}
	return d, true
}

// remove drops key's denials for which del holds, and the key with its
// last. The caller holds s.mu.
func (s *denyShard) remove(kh uint64, key string, del func(denyEntry) bool) {
	kd := s.m[kh]
	if kd == nil || kd.key != key {
		return
	}
	kd.e = slices.DeleteFunc(kd.e, del)
	if len(kd.e) == 0 {
		delete(s.m, kh)
	}
}

// conflicts reports whether checked names a rule's state that held names
// too, with other settings.
func conflicts(held, checked []ruleSig) bool {
	for _, c := range checked {
		for _, h := range held {
			if h.id == c.id && h.set != c.set {
				return true
			}
		}
	}
	return false
}

// signatures are rules' ruleSigs. A rule's id is what names its state in
// Redis (name, bucket, tag); everything else a check sends of it is its
// settings.
func signatures(rules []Rule) []ruleSig {
	sigs := make([]ruleSig, len(rules))
	for i, r := range rules {
		h := newHash()
		h.str(r.Name)
		h.str(r.Bucket)
		h.str(r.Tag)
		h.str(r.container())
		sigs[i].id = h.sum
		h = newHash()
		r.settings(h)
		sigs[i].set = h.sum
	}
	return sigs
}

// ForgetDenial drops the denial cached for key under rules, if any. A
// caller that starts checking key under other rules (a directive raised
// them) may call it with the rules it no longer uses; the cache also
// drops such a denial itself on the first check under the new rules (see
// denyCache). It costs a fingerprint and a map lookup.
func (r *Redis) ForgetDenial(key string, rules []Rule) {
	if r.deny == nil {
		return
	}
	r.deny.drop(key, rules)
}

// forget drops every denial of key.
func (c *denyCache) forget(key string) {
	kh := keyHash(key)
	s := &c.shards[kh%denyShards]
	s.mu.Lock()
	s.remove(kh, key, func(denyEntry) bool { return true })
	s.mu.Unlock()
}

func (c *denyCache) drop(key string, rules []Rule) {
	kh, fp := fingerprint(key, rules)
	s := &c.shards[kh%denyShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(kh, key, func(e denyEntry) bool { return e.fp == fp })
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
		if !rr.Allowed && rr.Rule.Algorithm == InFlight {
			// A slot frees whenever an answer ends, on any gateway: such
			// a denial is not cached.
			return 0
		}
	}
	return hold
}

// put caches d, which Redis gave a check of key under rules at cost, sent
// at sent and answered at recv, for hold at most (see denyHold). Redis
// has just converted key's state to rules: the key's denials under
// conflicting settings go.
func (c *denyCache) put(key string, rules []Rule, cost int64, sent, recv time.Time, d Decision, hold time.Duration) {
	until := sent.Add(hold)
	if !until.After(recv) {
		return
	}
	kh, fp := fingerprint(key, rules)
	sigs := signatures(rules)
	s := &c.shards[kh%denyShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	kd := s.m[kh]
	if kd == nil || kd.key != key {
		if kd == nil && len(s.m) >= c.per {
			s.evict(recv, c.per)
		}
		kd = &keyDenials{key: key}
		s.m[kh] = kd
	}
	kd.e = slices.DeleteFunc(kd.e, func(e denyEntry) bool {
		return e.fp == fp || !recv.Before(e.until) || conflicts(e.rules, sigs)
	})
	if len(kd.e) >= maxDenialsPerKey {
		kd.e = kd.e[1:] // the oldest
	}
	kd.e = append(kd.e, denyEntry{fp: fp, rules: sigs, until: until, at: recv, minCost: cost, d: d})
}

// evict makes room for a key: keys whose denials all ended go, then
// arbitrary ones. Forgetting a denial only costs a Redis call, never a
// wrong answer. The caller holds s.mu.
func (s *denyShard) evict(now time.Time, per int) {
	for k, kd := range s.m {
		if !slices.ContainsFunc(kd.e, func(e denyEntry) bool { return now.Before(e.until) }) {
			delete(s.m, k)
		}
	}
	for k := range s.m {
		if len(s.m) < per {
			break
		}
		delete(s.m, k)
	}
}
