package gateway

import (
	stdcmp "cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/ratemodel"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestGatewayModel is the gateway half of the reference-model test (the
// stores' half is limiter.TestModel, which replays every decision of the
// memory store, Redis and Redis Cluster through an exact model of each
// algorithm). Here 2 or 3 gateways, built with New, each with its own
// *limiter.Redis on the real test Redis (standalone and Cluster), share a
// directive source the test controls, and 8 concurrent callers with random
// costs drive two keys (an API key and an IP) through the real enforcement
// step, g.enforce, on random gateways. Phases of a few hundred
// milliseconds change, with every caller stopped: split directives for
// either key (on, off, changed shares, named gateways, a phantom one, a
// reserve `*` for unnamed gateways, expired), NAT directives for the IP
// (on/off, changed factors), the rules (a reload, g.Reload, changing limits,
// periods, bursts and algorithms; sometimes a long rule beside the short
// one, which splits too unless the run sets split_max_period below it), the
// failure policies (a reload: the default, and now and then a rule's own,
// so that closed beats local beats open within one check), and each
// gateway's deny cache (on, or
// limiter.Config DenyCache -1). During a phase the store may fail, on
// command, for all gateways at once (a wrapper that refuses every call, as
// a dead Redis would, answering only cached denials): circuits open,
// probe half-open and close again while callers keep calling.
//
// Time is the host's clock: Redis' TIME for what Redis decides, the
// gateways' clock (time.Now, injected) for the breaker, the local store
// and cached denials; Redis runs on the same host, so they agree.
//
// The oracle. Every admission belongs to one path by the documented
// contract (not by what the gateway says it did): the shared bucket; the
// split buckets of one split directive (a new family per change of
// shares); the local buckets of the `local` policy (one per gateway, at its
// local share; under a split its split share, or its local share of the
// reserve when the split does not name it); fail-open. Each path is a set of
// exact buckets whose capacities and rates the test computes from the
// contract: the shared bucket holds capacity C = Rule.Capacity() and
// refills L per Period (a sliding window too: L − its weighted count is a
// bucket of L refilled at most L per Period), and a split's buckets are
// the same path, not one of their own: every share check also checks and
// charges the shared bucket (limiter.Directives.Split), so the store's
// admissions, split or not, are one bucket of C and L whatever the
// switches; the local shares of n gateways hold n·max(1, ⌊C/n⌋) and
// refill L per Period together. So
// for every window [t, t+Period) of an enforced rule (within one epoch:
// phases with the same rule values; a reload or a NAT switch that changes
// them starts a new epoch, whose change semantics limiter.TestModel checks):
//
//	admitted ≤ Σ over the paths used in the window of
//	           (capacity + rate × (last − first admission of that path))
//
// With one path that is at most the model's bound, C + L (for a sliding
// window C = L; its sharper 2L − 1 is TestModel's to check), with no
// tolerance. Each switch adds
// the capacity of the path switched to, which is the documented tolerance:
//
//   - a split switched on, off, or to other shares: +0 (issue 28: it was
//     +C of each split rule, +1 with a sub-unit reserve);
//   - the start of a local outage: +n·max(1, ⌊C/n⌋), which is C for C ≥ n
//     and n for C < n (docs/operations.md's "up to n units when capacity < n" is
//     this bound at a fresh start; after the shared bucket was drained the
//     local buckets add their whole capacity, as a split switch does);
//   - the end of a local outage: +0 for the shared bucket itself (it is
//     one bucket before and after, refilling meanwhile), but while circuits
//     close one gateway at a time (open, half-open with a probe in flight)
//     the local buckets still in use add their capacity and rate for that
//     overlap;
//   - fail closed: +0 (it admits nothing; every fail_closed verdict must
//     deny); a deny-cache answer: +0 (every cached verdict must deny);
//   - fail open: unbounded; windows holding a fail-open admission are left
//     out of the upper bound and counted, as are windows of a rule that
//     fails open holding a local admission of a rule that fails locally.
//
// The shared bucket is replayed exactly besides: every verdict the
// contract says it gave (store answers and cached denials outside a split,
// and every admission under one, which charged it too; across outages,
// reloads, NAT and split switches, converted as the store converts at a
// changed rule) goes through the exact model of each rule
// (internal/ratemodel, as in limiter.TestModel) in the order of the times
// the decisions report: an admission must have room in every rule's model,
// with no tolerance; a denial must lack room in some rule's model but for
// the stores' rounding (3e-6 tokens per write for a token bucket,
// 2×prev/2^20 and a carried unit for a sliding window) and, for a cached
// denial timed by the gateway's clock, 50µs of refill. So through the
// shared path the gateway admits exactly what the model admits: at most
// its bound, and at least it minus that tolerance.
//
// Beside the bound, every verdict is checked for its path: the rules in
// force are the configured ones (NAT-raised), split when and only when a
// live, applicable split names the key and no rule is longer than the
// run's split_max_period (if set), in local fallback the documented local
// share; the mode
// is the phase's failure policy and only during or right after an outage.
//
// And a coarser lower bound over whole phases: where the shared bucket
// alone is in force for a whole phase, demand is far above the limit (8
// callers, pauses under 1ms), and
// the key has one rule, the units admitted after the first Window of the
// phase until its last decision, over D, are at least
// L×(D − gaps)/Period − C − maxCost (− L more for a sliding window, whose
// first window may follow a quieter one), where gaps sums the pauses
// longer than 1ms between the key's decisions (a starved process refills
// a bucket nobody drains): what a bucket refills is admitted but for what it
// may hold at the end.
//
// It found unnamed gateways checking a split's reserve in a bucket each
// (the reserve once per unnamed gateway), and each enforcing the whole
// reserve in local fallback; see TestSplitReserve.
//
// EDGELIMIT_GATEWAY_MODEL_SEED reproduces a run's phases, rules and costs
// (not the interleaving of goroutines nor Redis' clock);
// EDGELIMIT_GATEWAY_MODEL_DURATION sets the budget per store (default
// 2s; make soak runs it longer).
func TestGatewayModel(t *testing.T) {
	budget := testenv.Duration(t, "EDGELIMIT_GATEWAY_MODEL_DURATION", 2*time.Second)
	for name, mk := range map[string]func(t *testing.T) redis.UniversalClient{
		"redis": func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true, MaxRetries: -1})
		},
		"redis-cluster": func(t *testing.T) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t), ContextTimeoutEnabled: true, MaxRetries: -1})
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := testenv.Seed(t, "EDGELIMIT_GATEWAY_MODEL_SEED")
			rdb := mk(t)
			t.Cleanup(func() { _ = rdb.Close() })
			if err := rdb.Ping(t.Context()).Err(); err != nil {
				t.Fatalf("ping: %v", err)
			}
			m := newGWModel(t, rdb, seed)
			t.Logf("seed %d (EDGELIMIT_GATEWAY_MODEL_SEED), %d gateways, budget %v", seed, m.n, budget)
			m.run(budget)
			m.check()
		})
	}
}

// modelStore is one gateway's shared store as the test drives it: the
// real Redis limiter with or without its deny cache, on the same buckets,
// failing on command as a dead Redis would (a limiter.Redis answers its
// cached denials without a store call, so those still come back).
type modelStore struct {
	cached, uncached *limiter.Redis
	cache            atomic.Bool
	down             *atomic.Bool // the fleet's Redis is down
}

func (s *modelStore) Allow(ctx context.Context, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	if s.down.Load() {
		if d, ok := s.CachedDenial(key, rules, cost); ok {
			return d, nil
		}
		return limiter.Decision{}, errors.New("run limiter script: dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	if s.cache.Load() {
		return s.cached.Allow(ctx, key, rules, cost)
	}
	return s.uncached.Allow(ctx, key, rules, cost)
}

// AllowUncachedWithin is Allow for a gateway that asked CachedDenial first.
func (s *modelStore) AllowUncachedWithin(ctx context.Context, within time.Duration, key string, rules []limiter.Rule, cost int64) (limiter.Decision, error) {
	if s.down.Load() {
		return limiter.Decision{}, errors.New("run limiter script: dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	if s.cache.Load() {
		return s.cached.AllowUncachedWithin(ctx, within, key, rules, cost)
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	return s.uncached.Allow(ctx, key, rules, cost)
}

func (s *modelStore) CachedDenial(key string, rules []limiter.Rule, cost int64) (limiter.Decision, bool) {
	if !s.cache.Load() {
		return limiter.Decision{}, false
	}
	return s.cached.CachedDenial(key, rules, cost)
}

// modelDirectives is the fleet's directive source, swapped by the test.
type modelDirectives struct {
	p atomic.Pointer[limiter.Directives]
}

func (m *modelDirectives) Current() *limiter.Directives { return m.p.Load() }

const (
	gwModelCallers   = 8
	gwModelSplitMax  = time.Second
	gwModelOpen      = 20 * time.Millisecond // breaker.open
	gwModelPhaseMin  = 250 * time.Millisecond
	gwModelPhaseMax  = 400 * time.Millisecond
	gwModelRawAPIKey = "acme-raw-key"
	gwModelIP        = "192.0.2.7"
)

// The two keys every phase drives: an API key on plan paid, an IP on plan
// free.
const (
	keyAPI = 0
	keyIP  = 1
)

// gwPhase is what is in force during one phase.
type gwPhase struct {
	start, end int64 // µs: the first caller started, the last one stopped
	rules      [2][]limiter.Rule
	policy     FailurePolicy      // the default
	pols       [2][]FailurePolicy // each rule's own; "": the default
	nat        float64            // the IP's NAT factor; 0: none
	splits     [2]*limiter.SplitDirective
	splitVer   [2]int // a new number per change of a key's split
	epoch      [2]int // a new number per change of a key's rule values
	cache      []bool
	outage     bool
	down, up   int64 // µs: the store failed and returned
	maxCost    [2]int64
}

// gwEvent is one verdict.
type gwEvent struct {
	key, phase, gw int
	at             int64 // µs: the decision's time, or the clock after a verdict without one
	cost           int64
	allowed        bool
	mode           event.Mode
	cached         bool
	reason         string
	rules          []limiter.Rule
	path           *modelPath // the contract's path of an admission; nil: fail open
}

type gwModel struct {
	t      *testing.T
	seed   uint64
	r      *rand.Rand
	n      int
	ids    []string
	gws    []*Gateway
	stores []*modelStore
	down   atomic.Bool
	dirs   modelDirectives
	dkeys  [2]string // the keys' directive keys
	phases []gwPhase
	events []gwEvent
	gen    int // rule name generations
	// splitMax is the fleet's split_max_period: 0 (unset, the default) or
	// gwModelSplitMax.
	splitMax time.Duration
}

// baseName is a rule's name without its generation.
func baseName(name string) string {
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		return name[:i]
	}
	return name
}

func newGWModel(t *testing.T, rdb redis.UniversalClient, seed uint64) *gwModel {
	m := &gwModel{t: t, seed: seed, r: rand.New(rand.NewPCG(seed, 7))}
	m.n = 3
	if m.r.IntN(3) == 0 {
		m.n = 2
	}
	if m.r.IntN(3) == 0 {
		m.splitMax = gwModelSplitMax
	}
	m.dirs.p.Store(&limiter.Directives{})
	prefix := "gwmodel" + randHex(6)
	first := m.drawPhase(nil)
	for i := range m.n {
		id := "gw-" + string(rune('a'+i))
		lim := func(deny int) *limiter.Redis {
			l, err := limiter.New(rdb, limiter.Config{Prefix: prefix, DenyCache: deny})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		s := &modelStore{cached: lim(0), uncached: lim(-1), down: &m.down}
		g, err := New(m.config(id, first), Options{Store: s, Directives: &m.dirs, Logger: slog.New(slog.DiscardHandler), Now: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		m.ids, m.gws, m.stores = append(m.ids, id), append(m.gws, g), append(m.stores, s)
	}
	m.dkeys[keyAPI] = limiter.DirectiveKey(event.KindAPIKey.String(), m.gws[0].keys.id(limiter.APIKeyKey("acme")))
	m.dkeys[keyIP] = limiter.DirectiveKey(event.KindIP.String(), m.gws[0].keys.id(ipKey(gwModelIP)))
	m.phases = append(m.phases, first)
	return m
}

// config is gateway id's configuration for phase p.
func (m *gwModel) config(id string, p gwPhase) Config {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.GatewayID = id
	cfg.KeyHashSecret = "gateway-model-secret"
	cfg.ExpectedGateways = m.n
	cfg.FailurePolicy = p.policy
	cfg.SplitMaxPeriod = m.splitMax
	cfg.Breaker = BreakerConfig{Failures: 2, Open: gwModelOpen}
	cfg.StoreDeadline = 5 * time.Second // the most allowed: failures are injected, never timeouts
	plan := func(k int) Plan {
		var pl Plan
		for j, r := range p.rules[k] {
			pl.Rules = append(pl.Rules, Rule{Rule: r, FailurePolicy: p.pols[k][j]})
		}
		return pl
	}
	cfg.Plans = map[string]Plan{"free": plan(keyIP), "paid": plan(keyAPI)}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha(gwModelRawAPIKey), Plan: "paid"}}
	return cfg
}

// shortRule draws a rule no longer than split_max_period: a token bucket
// (default burst, a larger or smaller burst, or a GCRA) or a sliding window.
func (m *gwModel) shortRule(name string) limiter.Rule {
	r := m.r
	rule := limiter.Rule{Name: name, Limit: 4 + r.Int64N(40), Period: 40*time.Millisecond + time.Duration(r.Int64N(int64(110*time.Millisecond)))}
	switch r.IntN(5) {
	case 0:
		rule.Algorithm = limiter.SlidingWindow
	case 1:
		rule.Burst = 1 + r.Int64N(2*rule.Limit)
	case 2:
		rule.Burst = 1 + r.Int64N(3) // GCRA-like, below the gateway count at times
	}
	return rule
}

// drawPhase draws the next phase from the previous one (nil: the first).
func (m *gwModel) drawPhase(prev *gwPhase) gwPhase {
	r := m.r
	var p gwPhase
	if prev != nil {
		p = *prev
		p.rules = [2][]limiter.Rule{slices.Clone(prev.rules[0]), slices.Clone(prev.rules[1])}
	}
	// Rules: at first, or on a reload in a third of the phases.
	for k := range 2 {
		if prev != nil && r.IntN(3) != 0 {
			continue
		}
		rules := []limiter.Rule{m.shortRule("short")}
		if k == keyAPI && r.IntN(3) == 0 {
			// A rule longer than gwModelSplitMax: this check splits only
			// when split_max_period is unset.
			rules = append(rules, limiter.Rule{Name: "long", Limit: 30 + r.Int64N(200), Period: gwModelSplitMax + time.Duration(1+r.Int64N(int64(500*time.Millisecond)))})
		}
		// A rule keeps its name while its algorithm does; otherwise (or when
		// it comes back) it gets a new one, so its Redis key starts afresh
		// and the exact model of the shared bucket knows its state.
		for i, rule := range rules {
			rules[i].Name = ""
			if prev != nil {
				for _, old := range prev.rules[k] {
					if baseName(old.Name) == rule.Name && old.Algorithm == rule.Algorithm {
						rules[i].Name = old.Name
					}
				}
			}
			if rules[i].Name == "" {
				m.gen++
				rules[i].Name = rule.Name + "-" + strconv.Itoa(m.gen)
			}
		}
		p.rules[k] = rules
	}
	p.policy = []FailurePolicy{FailOpen, FailClosed, FailLocal, FailLocal}[r.IntN(4)]
	for k := range 2 {
		// Now and then a rule fails its own way.
		p.pols[k] = make([]FailurePolicy, len(p.rules[k]))
		for j := range p.pols[k] {
			if r.IntN(4) == 0 {
				p.pols[k][j] = []FailurePolicy{FailOpen, FailClosed, FailLocal}[r.IntN(3)]
			}
		}
	}
	// NAT for the IP: off, or a factor.
	switch r.IntN(3) {
	case 0:
		p.nat = 0
	case 1:
		p.nat = 1 + float64(r.IntN(30))/10
	}
	for k := range 2 {
		old := p.splits[k]
		switch r.IntN(3) {
		case 0:
			p.splits[k] = nil
		case 1:
			p.splits[k] = m.drawSplit()
		}
		if old != p.splits[k] {
			p.splitVer[k]++
		}
	}
	p.cache = make([]bool, m.n)
	for i := range p.cache {
		p.cache[i] = r.IntN(2) == 0
	}
	p.outage = prev != nil && r.IntN(5) < 2
	return p
}

// drawSplit draws shares for some of the fleet's gateways, maybe a gateway
// that does not exist, maybe a reserve for unnamed ones; one in eight has
// expired already.
func (m *gwModel) drawSplit() *limiter.SplitDirective {
	r := m.r
	shares := map[string]float64{}
	for i := range m.n {
		if i == 0 || r.IntN(2) == 0 {
			shares["gw-"+string(rune('a'+i))] = 0.1 + r.Float64()
		}
	}
	if r.IntN(3) == 0 {
		shares["gw-x"] = 0.1 + r.Float64() // a gateway not in this fleet
	}
	if r.IntN(2) == 0 {
		shares[limiter.OtherGateways] = 0.005 + 0.3*r.Float64()
	}
	sum := 0.0
	for _, s := range shares {
		sum += s
	}
	for k := range shares {
		shares[k] /= sum
	}
	expires := time.Now().Add(time.Hour)
	if r.IntN(8) == 0 {
		expires = time.Now().Add(-time.Second)
	}
	return &limiter.SplitDirective{Shares: shares, Expires: expires}
}

// effective are key k's rules in phase p as NAT leaves them.
func (p *gwPhase) effective(k int) []limiter.Rule {
	rules := p.rules[k]
	if k != keyIP || p.nat == 0 {
		return rules
	}
	out := make([]limiter.Rule, len(rules))
	for i, r := range rules {
		scale := func(n int64) int64 { return max(1, int64(math.Round(float64(n)*p.nat))) }
		r.Limit = scale(r.Limit)
		if r.Burst > 0 {
			r.Burst = scale(r.Burst)
		}
		out[i] = r
	}
	return out
}

// directives is the directive set of phase p.
func (m *gwModel) directives(p *gwPhase) *limiter.Directives {
	d := &limiter.Directives{Version: int64(len(m.phases)), Splits: map[string]limiter.SplitDirective{}, NATs: map[string]limiter.NATDirective{}}
	for k, s := range p.splits {
		if s != nil {
			sd := *s
			sd.Key = m.dkeys[k]
			d.Splits[sd.Key] = sd
		}
	}
	if p.nat > 0 {
		key := ipKey(gwModelIP)
		d.NATs[key] = limiter.NATDirective{Key: key, Factor: p.nat, Clients: 10, Expires: time.Now().Add(time.Hour)}
	}
	return d
}

// split returns gateway gw's split rules of key k in phase p, and whether
// the contract splits it: a live split that leaves no named gateway
// without a unit, and no rule longer than split_max_period if set.
func (m *gwModel) split(p *gwPhase, k, gw int) ([]limiter.Rule, string, bool) {
	s := p.splits[k]
	eff := p.effective(k)
	if s == nil || (m.splitMax > 0 && longestPeriod(eff) > m.splitMax) {
		return eff, "", false
	}
	d := &limiter.Directives{Splits: map[string]limiter.SplitDirective{m.dkeys[k]: *s}}
	_, rules, ok := d.Split(m.dkeys[k], m.ids[gw], eff, time.Now())
	if !ok {
		return eff, "", false
	}
	bucket := m.ids[gw]
	if _, named := s.Shares[bucket]; !named {
		bucket = limiter.OtherGateways
	}
	return rules, bucket, true
}

// wantLocal is the documented local share of r over n gateways: r's rate
// ÷ n by stretching the period, capacity ⌊C/n⌋ but at least 1; where the
// stretched period would pass MaxPeriod, the limit ÷ n rounded down
// instead (at least 1).
func wantLocal(r limiter.Rule, n int64) limiter.Rule {
	if r.Algorithm == limiter.SlidingWindow {
		k := max(1, r.Limit/n)
		if p := time.Duration(math.Ceil(float64(r.Period) * float64(k*n) / float64(r.Limit))); p <= limiter.MaxPeriod {
			r.Limit, r.Period = k, p
			return r
		}
		r.Limit = k
		return r
	}
	r.Burst = max(1, r.Capacity()/n)
	if r.Period <= limiter.MaxPeriod/time.Duration(n) {
		r.Period *= time.Duration(n)
	} else {
		r.Limit = max(1, r.Limit/n)
	}
	return r
}

// policy is the failure policy of key k's rule j in phase p.
func (p *gwPhase) policyOf(k, j int) FailurePolicy {
	if pol := p.pols[k][j]; pol != "" {
		return pol
	}
	return p.policy
}

// mode is key k's fallback mode in phase p: closed if any rule fails
// closed, else local if any fails locally, else open.
func (p *gwPhase) mode(k int) event.Mode {
	mode := event.ModeFailOpen
	for j := range p.rules[k] {
		switch p.policyOf(k, j) {
		case FailClosed:
			return event.ModeFailClosed
		case FailLocal:
			mode = event.ModeLocalFallback
		}
	}
	return mode
}

// localRules are the contract's local rules of gateway gw for key k in
// phase p, and the indexes of the rules they stand for: those that fail
// locally, each at its split share under a split (its local share of the
// reserve when the split does not name it), its local share otherwise.
func (m *gwModel) localRules(p *gwPhase, k, gw int) ([]limiter.Rule, []int) {
	rules, bucket, split := m.split(p, k, gw)
	var out []limiter.Rule
	var idx []int
	for j, r := range rules {
		if p.policyOf(k, j) != FailLocal {
			continue
		}
		if !split || bucket == limiter.OtherGateways {
			r = wantLocal(r, int64(m.n))
		}
		r.Whole = limiter.Whole{} // a gateway's memory has no shared bucket
		out, idx = append(out, r), append(idx, j)
	}
	return out, idx
}

// run drives phases until the budget is spent.
func (m *gwModel) run(budget time.Duration) {
	t := m.t
	end := time.Now().Add(budget)
	for p := 0; time.Now().Before(end) || p < 3; p++ {
		if p > 0 {
			next := m.drawPhase(&m.phases[p-1])
			m.phases = append(m.phases, next)
		}
		ph := &m.phases[p]
		if p > 0 {
			prev := &m.phases[p-1]
			for k := range 2 {
				ph.epoch[k] = prev.epoch[k]
				if !slices.Equal(prev.effective(k), ph.effective(k)) {
					ph.epoch[k]++
				}
			}
		}
		for k := range 2 {
			ph.maxCost[k] = 3
			for _, r := range ph.effective(k) {
				ph.maxCost[k] = min(ph.maxCost[k], r.Capacity())
			}
		}
		for i, g := range m.gws {
			if err := g.Reload(m.config(m.ids[i], *ph)); err != nil {
				t.Fatalf("Reload: %v", err)
			}
			m.stores[i].cache.Store(ph.cache[i])
		}
		m.dirs.p.Store(m.directives(ph))
		m.checkSplitSums(ph)
		length := gwModelPhaseMin + time.Duration(m.r.Int64N(int64(gwModelPhaseMax-gwModelPhaseMin)))
		var downAt, upAt time.Duration
		if ph.outage {
			downAt = time.Duration(float64(length) * (0.1 + 0.2*m.r.Float64()))
			upAt = downAt + time.Duration(float64(length)*(0.2+0.3*m.r.Float64()))
		}
		ph.start = time.Now().UnixMicro()
		stop := time.Now().Add(length)
		var wg sync.WaitGroup
		var mu sync.Mutex
		if ph.outage {
			wg.Go(func() {
				time.Sleep(downAt)
				ph.down = time.Now().UnixMicro()
				m.down.Store(true)
				time.Sleep(upAt - downAt)
				m.down.Store(false)
				ph.up = time.Now().UnixMicro()
			})
		}
		for c := range gwModelCallers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(m.seed, uint64(1000*p+c+10)))
				var mine []gwEvent
				for time.Now().Before(stop) {
					k, gw := r.IntN(2), r.IntN(m.n)
					cost := 1 + r.Int64N(ph.maxCost[k])
					mine = append(mine, m.call(p, k, gw, cost))
					time.Sleep(time.Duration(r.Int64N(int64(time.Millisecond))))
				}
				mu.Lock()
				m.events = append(m.events, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		ph.end = time.Now().UnixMicro()
	}
	if m.down.Load() {
		t.Fatal("store left down")
	}
}

// call asks gateway gw about cost units of key k.
func (m *gwModel) call(p, k, gw int, cost int64) gwEvent {
	g := m.gws[gw]
	st := g.st.Load()
	var id identity
	if k == keyAPI {
		ak := st.lookupKey(gwModelRawAPIKey)
		id = identity{kind: event.KindAPIKey, key: limiter.APIKeyKey(ak.id), plan: ak.plan}
	} else {
		id = identity{kind: event.KindIP, key: ipKey(gwModelIP), clientIP: gwModelIP, plan: st.anonymous}
	}
	q := call{id: id, limits: st.limitsFor(id, nil, false), cost: cost, route: "model", method: http.MethodGet}
	v := g.enforce(context.Background(), st, &q)
	e := gwEvent{key: k, phase: p, gw: gw, cost: cost, allowed: v.allowed, mode: v.mode, rules: v.rules}
	if v.err != nil {
		m.t.Errorf("enforce: %v", v.err)
	}
	if v.known {
		e.at, e.cached, e.reason = v.d.Time.UnixMicro(), v.d.Cached, v.d.Reason
	} else {
		e.at = time.Now().UnixMicro()
	}
	return e
}

// fail reports a failure with the seed that reproduces the run.
func (m *gwModel) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Errorf("seed %d (EDGELIMIT_GATEWAY_MODEL_SEED=%d to reproduce): %s", m.seed, m.seed, fmt.Sprintf(format, args...))
}

// checkSplitSums checks the split contract behind the oracle: the named
// gateways' whole shares of every rule's limit and burst, with the
// reserve's, sum exactly to the rule; a reserve below a unit is one unit per
// MaxPeriod.
func (m *gwModel) checkSplitSums(p *gwPhase) {
	for k, s := range p.splits {
		if s == nil {
			continue
		}
		eff := p.effective(k)
		d := &limiter.Directives{Splits: map[string]limiter.SplitDirective{m.dkeys[k]: *s}}
		names := slices.Sorted(maps.Keys(s.Shares))
		limits, bursts := make([]int64, len(eff)), make([]int64, len(eff))
		subunit := make([]bool, len(eff))
		applied := 0
		for _, name := range names {
			_, rules, ok := d.Split(m.dkeys[k], name, eff, time.Now())
			if !ok {
				continue
			}
			applied++
			for j, r := range rules {
				if r.Period == limiter.MaxPeriod && r.Limit == 1 && name == limiter.OtherGateways {
					subunit[j] = true // the reserve below a unit (of limit or burst)
					continue
				}
				if r.Period != eff[j].Period || r.Algorithm != eff[j].Algorithm || r.Name != eff[j].Name {
					m.fail("split %v of %+v: gateway %s got %+v", s.Shares, eff[j], name, r)
				}
				limits[j] += r.Limit
				bursts[j] += r.Burst
			}
		}
		if applied == 0 {
			continue
		}
		if applied != len(names) {
			m.fail("split %v of %v applies to %d of its %d names", s.Shares, eff, applied, len(names))
		}
		for j, r := range eff {
			if subunit[j] {
				// The reserve's part, if any, became one unit per MaxPeriod.
				if limits[j] > r.Limit || bursts[j] > r.Burst {
					m.fail("split %v of %+v: named shares sum to limit %d, burst %d", s.Shares, r, limits[j], bursts[j])
				}
				continue
			}
			if limits[j] != r.Limit || (r.Burst > 0 && bursts[j] != r.Burst) {
				m.fail("split %v of %+v: shares sum to limit %d, burst %d", s.Shares, r, limits[j], bursts[j])
			}
		}
	}
}

// modelPath is one family of exact buckets the contract says an admission came
// from, with the capacity and rate of each rule summed over its buckets.
type modelPath struct {
	name string
	caps []int64
	rate []*big.Rat // units per µs
	open []bool     // the rule is not enforced on this path (it fails open)
}

// pathOf classifies an admission by the contract, and checks the verdict's
// rules and mode against it.
func (m *gwModel) pathOf(e gwEvent, paths map[string]*modelPath) *modelPath {
	p := &m.phases[e.phase]
	_, _, split := m.split(p, e.key, e.gw)
	kind := "store"
	switch e.mode {
	case event.ModeLocalFallback:
		kind = "local"
	case event.ModeFailOpen:
		return nil
	}
	// The store's admissions, split or not, are the shared bucket's; a
	// local family is one per split (its shares are the gateways' memory).
	name := fmt.Sprintf("key%d/%s/epoch%d", e.key, kind, p.epoch[e.key])
	if kind == "local" {
		ver := 0
		if split {
			ver = p.splitVer[e.key]
		}
		// Which rules fail locally may change with a reload in an epoch.
		_, idx := m.localRules(p, e.key, e.gw)
		name += fmt.Sprintf("/split%d/rules%v", ver, idx)
	}
	if pa, ok := paths[name]; ok {
		return pa
	}
	eff := p.effective(e.key)
	pa := &modelPath{name: name, caps: make([]int64, len(eff)), rate: make([]*big.Rat, len(eff)), open: make([]bool, len(eff))}
	for j := range eff {
		pa.rate[j] = new(big.Rat)
	}
	add := func(j int, r limiter.Rule) {
		pa.caps[j] += r.Capacity()
		pa.rate[j].Add(pa.rate[j], big.NewRat(r.Limit, r.Period.Microseconds()))
	}
	switch kind {
	case "store":
		for j, r := range eff {
			add(j, r)
		}
	case "local":
		// Each gateway's memory: its split share, or its local share of
		// the rule or of the split's reserve.
		for j := range eff {
			pa.open[j] = true // a rule that fails open meanwhile
		}
		for gw := range m.n {
			rules, idx := m.localRules(p, e.key, gw)
			for i, r := range rules {
				add(idx[i], r)
				pa.open[idx[i]] = false
			}
		}
	}
	paths[name] = pa
	return pa
}

// checkVerdict checks one verdict's mode and rules against the contract.
func (m *gwModel) checkVerdict(e gwEvent) {
	p := &m.phases[e.phase]
	outage := p.outage || (e.phase > 0 && m.phases[e.phase-1].outage)
	switch e.mode {
	case event.ModeFailClosed, event.ModeFailOpen, event.ModeLocalFallback:
		if want := p.mode(e.key); e.mode != want || !outage {
			m.fail("phase %d (policy %s, rules %v, outage %v) gw %d key %d: mode %v", e.phase, p.policy, p.pols[e.key], outage, e.gw, e.key, e.mode)
		}
	}
	if e.cached && e.allowed {
		m.fail("phase %d: a cached verdict admitted: %+v", e.phase, e)
	}
	switch e.mode {
	case event.ModeFailClosed:
		if e.allowed {
			m.fail("phase %d: fail closed admitted: %+v", e.phase, e)
		}
	case event.ModeFailOpen:
		if !e.allowed {
			m.fail("phase %d: fail open denied without a cached denial: %+v", e.phase, e)
		}
	case event.ModeEnforced, event.ModeShadow:
		want, _, _ := m.split(p, e.key, e.gw)
		if diff := cmp.Diff(want, e.rules); diff != "" {
			m.fail("phase %d gw %d key %d: enforced under rules (-want +got):\n%s", e.phase, e.gw, e.key, diff)
		}
	case event.ModeLocalFallback:
		want, _ := m.localRules(p, e.key, e.gw)
		if diff := cmp.Diff(want, e.rules); diff != "" {
			m.fail("phase %d gw %d key %d: local fallback under rules (-want +got):\n%s", e.phase, e.gw, e.key, diff)
		}
	}
}

// check runs the oracle over the run's verdicts.
func (m *gwModel) check() {
	t := m.t
	if len(m.events) == 0 {
		t.Fatal("no verdicts")
	}
	// By time; ties (two decisions in one microsecond) admissions first, the
	// order least favourable to the denial check, irrelevant to the bound.
	slices.SortStableFunc(m.events, func(a, b gwEvent) int {
		if c := stdcmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		switch {
		case a.allowed == b.allowed:
			return 0
		case a.allowed:
			return -1
		}
		return 1
	})
	modes := map[string]int{}
	for _, e := range m.events {
		m.checkVerdict(e)
		if e.allowed {
			modes[e.mode.String()]++
		}
		if e.cached {
			modes["cached denial"]++
		}
	}
	opens, recovering := 0.0, 0
	for _, g := range m.gws {
		opens += counter(t, g.m.circuitOpens)
	}
	for _, e := range m.events {
		p := &m.phases[e.phase]
		if e.mode != event.ModeEnforced && ((p.outage && e.at > p.up) || (!p.outage && e.phase > 0 && m.phases[e.phase-1].outage)) {
			recovering++ // the circuit still open or half-open after the store returned
		}
	}
	t.Logf("%d phases, %d verdicts; admitted by mode %v; circuits opened %v times, %d fallback verdicts after the store returned",
		len(m.phases), len(m.events), modes, opens, recovering)
	if t.Failed() {
		return
	}
	paths := map[string]*modelPath{}
	for i, e := range m.events {
		if e.allowed {
			m.events[i].path = m.pathOf(e, paths)
		}
	}
	skipped, windows := 0, 0
	for k := range 2 {
		// Epochs: runs of phases with the same rule values.
		byEpoch := map[int][]gwEvent{}
		for _, e := range m.events {
			if e.key == k && e.allowed {
				ep := m.phases[e.phase].epoch[k]
				byEpoch[ep] = append(byEpoch[ep], e)
			}
		}
		for ep, adm := range byEpoch {
			var rules []limiter.Rule
			for i := range m.phases {
				if m.phases[i].epoch[k] == ep {
					rules = m.phases[i].effective(k)
					break
				}
			}
			for j, r := range rules {
				w, s := m.checkWindows(k, j, r, adm)
				windows, skipped = windows+w, skipped+s
			}
		}
	}
	t.Logf("%d windows checked, %d left out for holding a fail-open admission", windows, skipped)
	for k := range 2 {
		m.checkShared(k)
	}
	m.checkLower()
}

// checkWindows checks every window [t, t+Period) of rule j (r) of key k
// starting at an admission, over the admissions adm of one epoch.
func (m *gwModel) checkWindows(k, j int, r limiter.Rule, adm []gwEvent) (checked, skipped int) {
	P := r.Period.Microseconds()
	type span struct {
		first, last, units int64
	}
	failures := 0
	for i := range adm {
		t0 := adm[i].at
		spans := map[*modelPath]*span{}
		open := false
		var units int64
		for _, e := range adm[i:] {
			if e.at >= t0+P {
				break
			}
			units += e.cost
			pa := e.path
			if pa == nil || pa.open[j] {
				open = true
				break
			}
			s, ok := spans[pa]
			if !ok {
				s = &span{first: e.at}
				spans[pa] = s
			}
			s.last, s.units = e.at, s.units+e.cost
		}
		if open {
			skipped++
			continue
		}
		checked++
		var bound int64
		var parts []string
		for pa, s := range spans {
			refill := new(big.Rat).Mul(pa.rate[j], new(big.Rat).SetInt64(s.last-s.first))
			b := pa.caps[j] + new(big.Int).Quo(refill.Num(), refill.Denom()).Int64()
			bound += b
			parts = append(parts, fmt.Sprintf("%s: %d units in %dµs, bound %d", pa.name, s.units, s.last-s.first, b))
		}
		if units > bound {
			failures++
			slices.Sort(parts)
			m.fail("key %d rule %+v: %d units admitted within %v from t=%dµs (phase %d), bound %d; by path: %v",
				k, r, units, r.Period, t0, adm[i].phase, bound, parts)
			if failures > 3 {
				return checked, skipped
			}
		}
	}
	return checked, skipped
}

// checkLower checks the lower bound where the shared bucket alone is in
// force for a whole phase under demand above the limit.
func (m *gwModel) checkLower() {
	checked, positive := 0, 0
	byPhase := make([][]gwEvent, len(m.phases))
	for _, e := range m.events {
		byPhase[e.phase] = append(byPhase[e.phase], e)
	}
	for pi := range m.phases {
		p := &m.phases[pi]
		if p.outage || (pi > 0 && m.phases[pi-1].outage) {
			continue
		}
		for k := range 2 {
			eff := p.effective(k)
			if len(eff) != 1 {
				continue
			}
			if _, _, split := m.split(p, k, 0); split {
				continue
			}
			r := eff[0]
			from := p.start + r.Window().Microseconds()
			var evs []gwEvent
			for _, e := range byPhase[pi] {
				if e.key == k && e.at >= from {
					evs = append(evs, e)
				}
			}
			if len(evs) < 2 || evs[len(evs)-1].at-from < 2*r.Window().Microseconds() {
				continue
			}
			to := evs[len(evs)-1].at
			var units, gaps int64
			last := from
			for _, e := range evs {
				if e.allowed {
					units += e.cost
				}
				if g := e.at - last; g > 1000 {
					gaps += g
				}
				last = e.at
			}
			rate := big.NewRat(r.Limit, r.Period.Microseconds())
			refill := new(big.Rat).Mul(rate, new(big.Rat).SetInt64(to-from-gaps))
			tol := r.Capacity() + p.maxCost[k]
			if r.Algorithm == limiter.SlidingWindow {
				tol += r.Limit // its first window may follow a quieter one
			}
			// A lowered capacity keeps what was used (configuration.md,
			// "Changing a rule"): the bucket may enter the phase overdrawn
			// by up to what an earlier phase's rule of its name held more.
			var carried int64
			for _, q := range m.phases[:pi] {
				for _, o := range q.effective(k) {
					if o.Name == r.Name {
						carried = max(carried, o.Capacity()-r.Capacity())
					}
				}
			}
			tol += carried
			want := new(big.Int).Quo(refill.Num(), refill.Denom()).Int64() - tol
			checked++
			if want > 0 {
				positive++
			}
			if units < want {
				m.fail("phase %d key %d rule %+v: shared bucket under steady demand admitted %d units in %dµs (%dµs of pauses), want at least %d",
					pi, k, r, units, to-from, gaps, want)
			}
		}
	}
	m.t.Logf("phase lower bound checked in %d phase-keys, %d of them above 0", checked, positive)
}

// modelRule is r as the reference model sees it.
func modelRule(r limiter.Rule) ratemodel.Rule {
	return ratemodel.Rule{Limit: r.Limit, Period: r.Period, Capacity: r.Capacity(), Sliding: r.Algorithm == limiter.SlidingWindow, Share: r.Share}
}

// checkShared replays key k's shared bucket, every verdict the contract
// says it gave (store answers and cached denials outside a split, and the
// admissions under one, each of which it checked and was charged; not the
// fallbacks, which never reach it), through the exact model of each rule,
// converting the model at the first verdict under changed rules as the store
// does: every admission must have room in every rule's model, with no
// tolerance; every denial must lack room in some rule's model, but for the
// stores' rounding (as limiter.TestModel: 3e-6 tokens per write for a token
// bucket, 2×prev/2^20 + one carried unit for a sliding window) and, for a
// cached denial answered on the gateway's clock, 50µs of refill.
func (m *gwModel) checkShared(k int) {
	models := map[string]ratemodel.Model{}
	epoch, writes, failures, checked := -1, 0, 0, 0
	for _, e := range m.events {
		if e.key != k || e.mode != event.ModeEnforced || e.reason != "" {
			continue
		}
		p := &m.phases[e.phase]
		eff := p.effective(k)
		if p.epoch[k] != epoch {
			// (a share's check converts the bucket too)
			epoch = p.epoch[k]
			for _, r := range eff {
				if mo, ok := models[r.Name]; ok {
					mo.Change(modelRule(r), e.at)
				} else {
					models[r.Name] = ratemodel.New(modelRule(r), e.at)
				}
			}
		}
		if _, _, split := m.split(p, k, e.gw); split && !e.allowed {
			// A share's denial may be the share's: not the bucket's to
			// justify.
			continue
		}
		checked++
		rooms := make([]*big.Rat, len(eff))
		for j, r := range eff {
			rooms[j] = models[r.Name].Room(e.at, e.cost)
		}
		if e.allowed {
			for j, r := range eff {
				if rooms[j].Sign() < 0 {
					failures++
					m.fail("phase %d gw %d key %d t=%dµs: the shared bucket admitted cost %d under %+v, the model has %s too few",
						e.phase, e.gw, k, e.at, e.cost, r, new(big.Rat).Neg(rooms[j]).FloatString(6))
				}
				models[r.Name].Take(e.at, e.cost)
			}
			writes++
		} else {
			justified := false
			var why []string
			for j, r := range eff {
				tol := new(big.Rat)
				switch mo := models[r.Name].(type) {
				case *ratemodel.Bucket:
					tol.SetFrac64(3*int64(writes+1), 1_000_000)
				case *ratemodel.Window:
					_, prev, carried := mo.Used(e.at)
					tol.SetFrac64(2*prev, 1<<20)
					if carried {
						tol.Add(tol, ratemodel.Int(1))
					}
				}
				if e.cached {
					tol.Add(tol, big.NewRat(50*r.Limit, r.Period.Microseconds()))
				}
				if rooms[j].Cmp(tol) < 0 {
					justified = true
				}
				why = append(why, r.Name+": room "+rooms[j].FloatString(6))
			}
			if !justified {
				failures++
				m.fail("phase %d gw %d key %d t=%dµs: the shared bucket denied cost %d (cached %v), the model admits it: %v",
					e.phase, e.gw, k, e.at, e.cost, e.cached, why)
			}
		}
		if failures > 5 {
			return
		}
	}
	m.t.Logf("key %d: %d shared-bucket verdicts replayed through the exact model", k, checked)
}
