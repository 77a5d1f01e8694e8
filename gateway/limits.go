package gateway

import (
	"math"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// limits is what one limiter call checks: the key, the rules and their
// failure policies.
type limits struct {
	key  string
	plan *plan
	// split: a split directive gave this gateway its own share of rules.
	split bool
	// reserve: under the split, this gateway is one the split does not
	// name, sharing the reserve with every other such gateway.
	reserve bool
	// rules are the plan's rules as directives leave them.
	rules []limiter.Rule
	// natFactor and shares are the directives that changed rules, for
	// the decision event (what-if replays apply them as the gateway did).
	natFactor float64
	shares    map[string]float64
}

// limitsFor computes the limiter key and the effective rules of a request
// (of the check API: check).
// It is the one place where the identity, the route and the plan meet, so
// split and NAT directives (hot keys checked per gateway share, NAT-shared
// IPs with raised limits) plug in here.
func (st *state) limitsFor(id identity, rt *route, check bool) limits {
	l := limits{key: id.key, plan: id.plan.forRoute(rt, check)}
	if rt != nil && rt.plan != nil {
		l.plan = rt.plan.forRoute(rt, check)
		l.key = id.key + "|r:" + rt.Name
	}
	l.rules = l.plan.rules
	return l
}

// directiveSource hands out the directives in force, e.g. a
// *limiter.Watcher that analytics' writes reach in the background. The
// request path only reads memory.
type directiveSource interface {
	Current() *limiter.Directives
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
			l.rules, l.natFactor, nat = rules, d.NATs[id.key].Factor, true
		}
	}
	if len(d.Splits) > 0 && (st.cfg.SplitMaxPeriod <= 0 || longestPeriod(l.rules) <= st.cfg.SplitMaxPeriod) {
		dk := limiter.DirectiveKey(id.kind.String(), g.keyID(id))
		if sk, rules, ok := d.Split(dk, g.gatewayID, l.rules, now); ok {
			// "/gw:<this gateway>", or "/gw:*": the gateways a split does
			// not name check the reserve in one bucket together.
			l.key += strings.TrimPrefix(sk, dk)
			l.rules, l.split, l.shares = rules, true, d.Splits[dk].Shares
			l.reserve = strings.HasSuffix(sk, "/gw:"+limiter.OtherGateways)
			split = true
		}
	}
	return nat, split
}

// denialForgetter is a store whose deny cache can drop one denial
// (*limiter.Redis).
type denialForgetter interface {
	ForgetDenial(key string, rules []limiter.Rule)
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

// localRules are the rules this gateway enforces in memory while the
// shared store is unavailable: those of l's rules (as directives left them)
// whose policy is local, each at this gateway's share. Under a split the
// rules already are this gateway's share, but for the reserve of the
// gateways the split does not name: they share it, so each enforces its
// local share of it.
func (st *state) localRules(l limits) []limiter.Rule {
	var out []limiter.Rule
	for i, r := range l.rules {
		if r.Shadow || l.plan.policies[i] != FailLocal {
			continue
		}
		if !l.split || l.reserve {
			r = localShare(r, int64(st.cfg.ExpectedGateways))
		}
		// This gateway's memory holds no fleet-wide bucket to check a
		// share's whole against: the share alone is its part.
		r.Whole = limiter.Whole{}
		out = append(out, r)
	}
	return out
}

// localShare is one gateway's share of r when n gateways enforce it apart:
// r's rate divided by n exactly, by stretching the period rather than
// rounding the limit (2/min over 5 gateways is 2 per 5 min each, not 1/min
// each), so the fleet never refills faster than r. Its capacity is
// capacity/n rounded down, at least 1: when r's capacity is below n, the
// first moment of an outage can admit n units over the fleet, at most n −
// capacity more than r, and the rate holds from then on.
func localShare(r limiter.Rule, n int64) limiter.Rule {
	if n <= 1 {
		return r
	}
	capacity := max(1, r.Capacity()/n)
	if inFlight(r) {
		// Slots, not a rate: each gateway holds its share at once (at
		// least one), for as long as its answers last.
		r.Limit = max(1, r.Limit/n)
		return r
	}
	if r.Calendar != nil {
		// Each counts its share of the window's quota from the outage on;
		// the window itself cannot be stretched.
		r.Limit = max(1, r.Limit/n)
		return r
	}
	if r.Algorithm == limiter.SlidingWindow {
		// k per period·k·n/limit each: the fleet admits limit per period.
		// It is compared in nanoseconds as a float: over hundreds of
		// gateways a long period passes what a Duration holds, and the
		// conversion would wrap to a negative period. k·n may fall short
		// of the limit, so the period may also shrink; the limiter refuses
		// one under a millisecond (limit 3 per 1ms over 2 gateways: 1 per
		// 0.67ms), which failed every check of the outage with a 500. A
		// period raised to 1ms admits less, never more.
		k := max(1, r.Limit/n)
		period := math.Ceil(float64(r.Period) * float64(k*n) / float64(r.Limit))
		if period <= float64(limiter.MaxPeriod) {
			r.Limit, r.Period = k, max(time.Millisecond, time.Duration(period))
			return r
		}
	} else if r.Period <= limiter.MaxPeriod/time.Duration(n) {
		r.Period *= time.Duration(n)
		r.Burst = capacity
		return r
	}
	// The stretched period is too long for the limiter: round the limit
	// down instead, which under-admits rather than over.
	r.Limit = max(1, r.Limit/n)
	if r.Algorithm != limiter.SlidingWindow {
		r.Burst = capacity
	}
	return r
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
