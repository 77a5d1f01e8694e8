package gateway

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// In-flight limits (a plan rule with in_flight: N): a proxied request
// takes a slot with the key's other rules in the one atomic call, holds it
// while its answer lasts (renewing its lease every lease/3), and gives it
// back when the answer ends, streams and upgraded connections included. A
// gateway that dies holding slots leaves them to expire with their lease.
// The check API and the Envoy door leave in-flight rules out: they have
// no answer whose end they would see.

// Lease bounds (a rule's lease).
const (
	minLease = time.Second
	maxLease = time.Hour
)

// validateInFlight checks an in-flight rule's fields.
func validateInFlight(bad func(field, format string, args ...any), field string, r Rule) {
	switch {
	case r.InFlight < 0 || r.InFlight > limiter.MaxInFlight:
		bad(field+".in_flight", "%d must be from 1 to %d", r.InFlight, limiter.MaxInFlight)
	case r.Limit != 0 || r.Period != 0 || r.Burst != 0 || r.Calendar != nil || r.Algorithm != "":
		bad(field, "an in-flight rule counts requests at once: it has no limit, period, burst, calendar or algorithm")
	case r.Unit != "":
		bad(field+".unit", "an in-flight rule counts requests at once, not %s", r.Unit)
	case r.Lease != 0 && (r.Lease < minLease || r.Lease > maxLease):
		bad(field+".lease", "%v must be from %v to %v", r.Lease, minLease, maxLease)
	}
}

// inFlight says whether r is an in-flight rule.
func inFlight(r limiter.Rule) bool { return r.Algorithm == limiter.InFlight }

// hold gives l's in-flight rules a lease of their own for this request.
func (l *limits) hold() {
	if len(l.plan.inflight) == 0 {
		return
	}
	if sameRules(l.rules, l.plan.rules) {
		l.rules = append([]limiter.Rule(nil), l.rules...)
	}
	for _, i := range l.plan.inflight {
		l.rules[i].Lease = newLease()
	}
}

// newLease is a random lease id: 56 bits, never 0.
func newLease() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])&(1<<56-1) | 1
}

// leaser is a store that holds leases (*limiter.Redis, *limiter.Memory).
type leaser interface {
	Renew(ctx context.Context, key string, rules []limiter.Rule) (limiter.Decision, error)
	Release(ctx context.Context, key string, rules []limiter.Rule) (limiter.Decision, error)
}

// holding is the slots one proxied request holds.
type holding struct {
	g        *Gateway
	store    leaser
	key      string
	rules    []limiter.Rule
	deadline time.Duration // of each store call
	stop     chan struct{}
	done     chan struct{}
}

// hold starts holding the slots v's decision took for call c: nil when it
// took none (no in-flight rule, or the failure policy let it through
// without a store).
func (g *Gateway) hold(st *state, c *call, v verdict) *holding {
	if len(c.limits.plan.inflight) == 0 || !v.known || !v.d.Allowed {
		return nil // (every proxied request asks: the usual answer first)
	}
	var rules []limiter.Rule
	for _, rr := range v.d.Rules {
		if inFlight(rr.Rule) && rr.Allowed {
			rules = append(rules, rr.Rule)
		}
	}
	if len(rules) == 0 {
		return nil
	}
	ls, ok := g.chargedBy(v).(leaser)
	if !ok {
		return nil
	}
	h := &holding{g: g, store: ls, key: c.limits.key, rules: rules, deadline: st.cfg.StoreDeadline,
		stop: make(chan struct{}), done: make(chan struct{})}
	lease := rules[0].Period
	for _, r := range rules {
		lease = min(lease, r.Period)
	}
	go h.renew(lease / 3)
	return h
}

// renew renews the leases every period until release.
func (h *holding) renew(every time.Duration) {
	defer close(h.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), h.deadline)
			d, err := h.store.Renew(ctx, h.key, h.rules)
			cancel()
			switch {
			case err != nil:
				h.g.m.leases.WithLabelValues("renew_failed").Inc()
			case !d.Allowed:
				// Reclaimed (a renewal missed its lease) and every slot
				// taken since: the answer goes on beyond the limit.
				h.g.m.leases.WithLabelValues("renew_lost").Inc()
			default:
				h.g.m.leases.WithLabelValues("renewed").Inc()
			}
		}
	}
}

// release stops the renewals and gives the slots back: the answer ended.
// A release the store fails leaves the slots to expire with their lease.
func (h *holding) release() {
	if h == nil {
		return
	}
	close(h.stop)
	<-h.done
	ctx, cancel := context.WithTimeout(context.Background(), h.deadline)
	defer cancel()
	if _, err := h.store.Release(ctx, h.key, h.rules); err != nil {
		h.g.m.leases.WithLabelValues("release_failed").Inc()
		h.g.log.Warn("release in-flight slots", "error", err.Error())
		return
	}
	h.g.m.leases.WithLabelValues("released").Inc()
}
