package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
)

// publisher takes decision events. Publish must never block: the request
// path calls it once per decision.
type publisher interface {
	Publish(event.Decision)
}

// keyHasher turns limiter keys into event key ids: a keyed hash, so the
// events never hold a raw key or an identity anyone could look up.
type keyHasher struct {
	pool sync.Pool // *keyHash
}

// keyHash is one HMAC with the buffers it writes and sums into, pooled
// together so that hashing a key allocates only its result.
type keyHash struct {
	mac hash.Hash
	in  []byte
	sum [sha256.Size]byte
}

func newKeyHasher(secret []byte) *keyHasher {
	return &keyHasher{pool: sync.Pool{New: func() any { return &keyHash{mac: hmac.New(sha256.New, secret)} }}}
}

// id returns the hex of the first 16 bytes of HMAC-SHA256(secret, key).
func (k *keyHasher) id(key string) string {
	h := k.pool.Get().(*keyHash)
	h.mac.Reset()
	h.in = append(h.in[:0], key...)
	h.mac.Write(h.in)
	h.mac.Sum(h.sum[:0])
	var out [32]byte
	hex.Encode(out[:], h.sum[:16])
	if cap(h.in) <= 1024 { // keep the pooled buffers small
		k.pool.Put(h)
	}
	return string(out[:])
}

func userAgentHash(ua string) uint64 {
	if ua == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(ua))
	return h.Sum64()
}

// keyID is the keyed hash of id's limiter key: what events carry and what
// analytics' directives name the key by. Computed at most once per request.
func (g *Gateway) keyID(id *identity) string {
	if id.keyID == "" {
		id.keyID = g.keys.id(id.key)
	}
	return id.keyID
}

// publish sends the decision event of one call; a no-op when events are off
// or there was no decision.
func (g *Gateway) publish(c *call, v verdict) {
	if g.pub == nil || v.canceled || v.err != nil {
		return
	}
	now := g.now()
	// The event's time is when the decision was made: the store's clock
	// (Redis' TIME, to the microsecond), the same for every gateway, so a
	// replay orders and times a key's decisions as the store did.
	decided := now
	if v.known && !v.d.Time.IsZero() {
		decided = v.d.Time
	}
	ev := g.callEvent(c, now)
	ev.Time, ev.Allowed, ev.Cost, ev.StoreStatus, ev.Mode, ev.CheckLatency = decided, v.allowed, c.cost, v.store, v.mode, v.latency
	ev.Domain, ev.Descriptor = c.domain, g.eventDescriptor(c.descriptor)
	if v.known && len(v.d.Rules) > 0 {
		b := v.d.BindingRule()
		ev.BindingRule, ev.Limit, ev.Remaining = b.Rule.Name, b.Rule.Limit, b.Remaining
		ev.Seq, ev.SeqEpoch = v.d.Seq, v.d.SeqEpoch
	}
	ev.NATFactor, ev.Split = c.limits.natFactor, eventShares(c.limits.shares)
	if c.reserved > 0 {
		// On a token route the cost counts tokens: the reservation here,
		// the settlement record the rest.
		ev.Cost = c.reserved
	}
	g.pub.Publish(ev)
}

// callEvent is the part of an event of call c that names the caller and
// the request; now names the event.
func (g *Gateway) callEvent(c *call, now time.Time) event.Decision {
	return event.Decision{
		ID:            event.NewID(now),
		Time:          now,
		GatewayID:     g.gatewayID,
		KeyID:         g.keyID(&c.id),
		KeyKind:       c.id.kind,
		ClientIP:      c.id.clientIP,
		UserAgentHash: userAgentHash(c.userAgent),
		Route:         c.route,
		Method:        c.method,
		Plan:          c.limits.plan.name,
		KeyName:       c.id.name,
	}
}

// eventShares are a split's shares as the event carries them, by gateway
// name; nil for none. A directive has at most a few, one per gateway.
func eventShares(shares map[string]float64) []event.SplitShare {
	if len(shares) == 0 {
		return nil
	}
	out := make([]event.SplitShare, 0, len(shares))
	for _, gw := range slices.Sorted(maps.Keys(shares)) {
		out = append(out, event.SplitShare{Gateway: gw, Share: shares[gw]})
	}
	return out[:min(len(out), event.MaxSplitShares)]
}

// eventMethods are the methods events name (RFC 9110's and PATCH).
var eventMethods = [...]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}

// eventMethod is a client's method m as events carry it: one of
// eventMethods, in any case, else "OTHER" ("" stays ""). net/http takes
// any token as a method, and the check API any string: a method over
// event.MaxFieldLen made the decision's event unencodable, so it was
// dropped and the caller unseen by analytics, and every new spelling was a
// row of its own in ClickHouse's per-key rollups. The HTTP entry points
// apply it; Enforce's callers name their calls themselves.
func eventMethod(m string) string {
	if m == "" {
		return ""
	}
	for _, k := range eventMethods {
		if strings.EqualFold(m, k) {
			return k
		}
	}
	return "OTHER"
}
