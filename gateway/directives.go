package gateway

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/gateway/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// directiveSource hands out the directives in force, e.g. a
// *limiter.Watcher that analytics' writes reach in the background. The
// request path only reads memory.
type directiveSource interface {
	Current() *limiter.Directives
}

// denialForgetter is a store whose deny cache can drop one denial
// (*limiter.Redis).
type denialForgetter interface {
	ForgetDenial(key string, rules []limiter.Rule)
}

// currentDirectives are the directives in force, nil without a source.
func (g *Gateway) currentDirectives() *limiter.Directives {
	if g.directives == nil {
		return nil
	}
	return g.directives.Current()
}

// applyDirectives adjusts the limits of one request to the directives in
// force: a NAT-shared IP gets its IP-keyed limit raised; a hot key under a
// split is checked in this gateway's own bucket with this gateway's share
// of every rule. Analytics names keys as "<kind>:<key id>", the key id
// being the HMAC the decision events carry.
func (g *Gateway) applyDirectives(st *state, id *identity, l *limits) {
	d := g.currentDirectives()
	if d == nil || (len(d.Splits) == 0 && len(d.NATs) == 0) {
		return // without reading the clock: the usual case
	}
	key, rules := l.key, l.rules
	nat, split := g.directed(st, id, l, d, g.now())
	if f, ok := g.store.(denialForgetter); ok && split {
		// A split checks the key's share, under another key, so the
		// store's cached denial of the undirected check would outlive
		// the directive while the key refills in its shares. (Rules a
		// NAT raise changes under the same key, the store's cache drops
		// by itself.)
		f.ForgetDenial(key, rules)
	}
	if nat {
		g.directivesApplied.WithLabelValues("nat").Inc()
	}
	if split {
		g.directivesApplied.WithLabelValues("split").Inc()
	}
}

// directed applies d to l as of now and says which directives applied; the
// admin API asks it too, so what it shows is what requests get.
func (g *Gateway) directed(st *state, id *identity, l *limits, d *limiter.Directives, now time.Time) (nat, split bool) {
	if d == nil || (len(d.Splits) == 0 && len(d.NATs) == 0) {
		return false, false
	}
	if id.kind == event.KindIP && len(d.NATs) > 0 {
		if rules, ok := d.NAT(id.key, l.rules, now); ok {
			l.rules, nat = rules, true
		}
	}
	if len(d.Splits) > 0 && (st.cfg.SplitMaxPeriod <= 0 || longestPeriod(l.rules) <= st.cfg.SplitMaxPeriod) {
		dk := limiter.DirectiveKey(id.kind.String(), g.keyID(id))
		if sk, rules, ok := d.Split(dk, g.gatewayID, l.rules, now); ok {
			// "/gw:<this gateway>", or "/gw:*": the gateways a split does
			// not name check the reserve in one bucket together.
			l.key += strings.TrimPrefix(sk, dk)
			l.rules, l.split = rules, true
			l.reserve = strings.HasSuffix(sk, "/gw:"+limiter.OtherGateways)
			split = true
		}
	}
	return nat, split
}

func newDirectivesApplied(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "edgelimit_gateway", Name: "directives_applied_total",
		Help: "Requests whose limits a directive changed, by kind (split, nat).",
	}, []string{"kind"})
	reg.MustRegister(c)
	for _, k := range []string{"split", "nat"} {
		c.WithLabelValues(k)
	}
	return c
}

// longestPeriod is the longest period among rules; a calendar rule's is
// the longest limiter.MaxPeriod, so that a split never shares out a
// calendar quota (its windows are counted in the shared bucket only).
func longestPeriod(rules []limiter.Rule) time.Duration {
	var p time.Duration
	for _, r := range rules {
		if r.Calendar != nil {
			return limiter.MaxPeriod
		}
		p = max(p, r.Period)
	}
	return p
}
