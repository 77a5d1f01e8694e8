package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/limiter"
)

// Bounds on one request, checked before anything else.
const (
	// MaxDescriptors is the most descriptors one request may carry.
	MaxDescriptors = 64
	// MaxEntries is the most entries one descriptor may carry.
	MaxEntries = 32
)

// enforcer is the gateway's one enforcement step (*gateway.Gateway), and
// its refusal of what cannot be decided.
type enforcer interface {
	Enforce(ctx context.Context, c gateway.Call, h http.Header) gateway.Verdict
	Refuse(c gateway.Call, detail string) gateway.Verdict
}

// Service answers envoy.service.ratelimit.v3.RateLimitService: it maps
// each request's descriptors onto its Envoy ratelimit configuration and
// decides all of them in one call of the gateway's enforcement step.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	g      enforcer
	log    *slog.Logger
	snap   atomic.Pointer[snapshot]
	boot   Config
	health *health.Server
	calls  *prometheus.CounterVec
	// dropped counts descriptor entries left out of decision events.
	dropped prometheus.Counter
	// refused counts connections closed on accept over MaxConnections.
	refused prometheus.Counter
	// drained ends the wait for Options.Ready.
	drained   chan struct{}
	drainOnce sync.Once
}

// snapshot is one configuration: the settings and the rules they load.
type snapshot struct {
	cfg   Config
	rules *Rules
}

// Options are the service's collaborators; all are optional.
type Options struct {
	// Registry takes the service's metrics; nil: not registered.
	Registry prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Ready is closed once the gateway can decide (Gateway.Warmed): the
	// health service says NOT_SERVING until then. Nil: serving at once.
	Ready <-chan struct{}
}

// New returns the service for cfg, which must be enabled and valid; it
// loads cfg.ConfigDir.
func New(cfg Config, g enforcer, opts Options) (*Service, error) {
	if !cfg.Enabled() {
		return nil, fmt.Errorf("%w: grpc.listen: not set", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	rules, err := LoadDir(cfg.ConfigDir)
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Service{g: g, log: opts.Logger, boot: cfg, health: health.NewServer()}
	s.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "edgelimit_gateway", Name: "grpc_ratelimit_requests_total",
		Help: "ShouldRateLimit calls by answer: ok, over_limit, or the gRPC error code (invalid_argument, canceled, internal).",
	}, []string{"code"})
	s.dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "edgelimit_gateway", Name: "grpc_event_descriptor_entries_dropped_total",
		Help: "Descriptor entries of checked descriptors left out of decision events: over 16 distinct entries, or a key over 64 bytes.",
	})
	s.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "edgelimit_gateway", Name: "grpc_connections_refused_total",
		Help: "gRPC connections closed on accept because grpc.max_connections were open.",
	})
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.calls, s.dropped, s.refused} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("register grpc metrics: %w", err)
			}
		}
	}
	s.snap.Store(&snapshot{cfg: cfg, rules: rules})
	serving := func(st healthpb.HealthCheckResponse_ServingStatus) {
		s.health.SetServingStatus("", st)
		s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
	}
	if opts.Ready == nil {
		serving(healthpb.HealthCheckResponse_SERVING)
		return s, nil
	}
	serving(healthpb.HealthCheckResponse_NOT_SERVING)
	s.drained = make(chan struct{})
	go func() {
		select {
		case <-opts.Ready:
			// After Drain's Shutdown the health server ignores this.
			serving(healthpb.HealthCheckResponse_SERVING)
		case <-s.drained:
		}
	}()
	return s, nil
}

// Reload loads cfg.ConfigDir again and swaps in cfg with it; requests in
// flight finish under the old one. On error the old one stays in force.
// Fields marked restart keep the values the service started with.
func (s *Service) Reload(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !cfg.Enabled() {
		return fmt.Errorf("%w: grpc.listen: cannot be unset without a restart", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	rules, err := LoadDir(cfg.ConfigDir)
	if err != nil {
		return err
	}
	s.snap.Store(&snapshot{cfg: cfg, rules: rules})
	s.log.Info("envoy ratelimit config reloaded", "domains", len(rules.domains))
	return nil
}

// Drain reports NOT_SERVING on the health service from now on, so
// clients that health-check move away before the server stops.
func (s *Service) Drain() {
	s.health.Shutdown()
	if s.drained != nil {
		s.drainOnce.Do(func() { close(s.drained) })
	}
}

// resolved is one request descriptor: its entries and the limit they
// match (nil: none), override says the request set it.
type resolved struct {
	lim      *limit
	entries  []entry
	bucketed []entry // the entries the bucket is named by, if not entries
	override bool
	// vary: which entries' values the configuration does not bound (see
	// match).
	vary uint64
	// configured is the limit the configuration gives the entries (nil:
	// none), which an override replaced.
	configured *limit
}

// pick is what one request descriptor resolved to.
type pick struct {
	rule      int // index into the call's rules; -1: none
	unlimited bool
	blocked   bool // requests_per_unit: 0
	current   *rlsv3.RateLimitResponse_RateLimit
}

// handle is the server's ShouldRateLimit handler (see Server): the
// generated one, except that a request over MaxMessageBytes is
// undecidable.
func (s *Service) handle(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := &sizedRequest{req: new(rlsv3.RateLimitRequest), max: s.boot.MaxMessageBytes}
	if err := dec(in); err != nil {
		s.count(nil, err)
		return nil, err
	}
	if in.size > in.max {
		resp, err := s.undecidable(s.snap.Load(), nil, 0, codes.ResourceExhausted,
			fmt.Sprintf("the request's %d bytes are over grpc.max_message_bytes (%d)", in.size, in.max))
		s.count(resp, err)
		return resp, err
	}
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, in.req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, in.req, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
}

// ShouldRateLimit decides every descriptor of req through the enforcement
// step, all-or-nothing: OVER_LIMIT when any enforced descriptor is over
// its limit (and then none consumes), OK otherwise. A request it cannot
// decide as sent is answered as Config.Undecidable says.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.shouldRateLimit(ctx, req)
	s.count(resp, err)
	return resp, err
}

// count records one call's answer in grpc_ratelimit_requests_total.
func (s *Service) count(resp *rlsv3.RateLimitResponse, err error) {
	code := "ok"
	switch {
	case err != nil:
		code = strings.ToLower(status.Code(err).String())
		if status.Code(err) == codes.InvalidArgument {
			code = "invalid_argument"
		}
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		code = "over_limit"
	}
	s.calls.WithLabelValues(code).Inc()
}

// undecidable answers a request the service cannot decide as sent, of n
// descriptors in dom (nil: not known), as cfg.Undecidable says: with the
// gRPC error code and why, or (the default) OVER_LIMIT on every
// descriptor, refused through the gateway so that it is a decision event
// and a denial in the metrics like any other. Envoy's failure_mode_deny:
// false would let an error through uncounted.
func (s *Service) undecidable(snap *snapshot, dom *domain, n int, code codes.Code, why string) (*rlsv3.RateLimitResponse, error) {
	cfg := snap.cfg
	if cfg.Undecidable == UndecidableError {
		return nil, status.Error(code, why)
	}
	c := gateway.Call{Key: "rls#undecidable", Route: "envoy:", Method: "ShouldRateLimit", Cost: 1}
	if dom != nil {
		c.Key, c.Plan, c.Route, c.Domain = dom.tag, dom.name, "envoy:"+dom.name, dom.name
	}
	c.Identity = c.Key + "|undecidable"
	v := s.g.Refuse(c, "This rate limit service cannot decide the request as sent: "+why+".")
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	}
	if *cfg.ProblemBody {
		resp.RawBody = v.Problem
		if *cfg.ResponseHeaders {
			resp.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "content-type", Value: "application/problem+json"}}
		}
	}
	return resp, nil
}

func (s *Service) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	snap := s.snap.Load()
	cfg := snap.cfg
	descs := req.GetDescriptors()
	// Envoy always sends a domain and at least one descriptor.
	switch {
	case req.GetDomain() == "":
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	case len(descs) == 0:
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	dom := snap.rules.domains[req.GetDomain()]
	if dom == nil {
		// ratelimit: an unknown domain has no limits.
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		return resp, nil
	}
	if len(descs) > MaxDescriptors {
		return s.undecidable(snap, dom, len(descs), codes.InvalidArgument, fmt.Sprintf("%d descriptors, at most %d", len(descs), MaxDescriptors))
	}
	all, clientIP, err := resolve(cfg, dom, descs)
	var u undecidableInput
	if errors.As(err, &u) {
		return s.undecidable(snap, dom, len(descs), codes.InvalidArgument, string(u))
	}
	if err != nil {
		return nil, err
	}
	c := checkOf(cfg, dom, descs, all, req.GetHitsAddend())
	if c.blocked || len(c.rules) == 0 {
		// requests_per_unit: 0 is ratelimit's block list: over the limit
		// whatever the count, so no store call; all-or-nothing, nothing
		// else is checked or consumed.
		for i, p := range c.picks {
			resp.Statuses[i] = unchecked(p)
			if p.blocked {
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.Statuses[i].Code, resp.Statuses[i].CurrentLimit = rlsv3.RateLimitResponse_OVER_LIMIT, p.current
			}
		}
		return resp, nil
	}
	h := http.Header{}
	v := s.g.Enforce(ctx, gateway.Call{
		Key: dom.tag, Identity: identity(dom, all), ClientIP: clientIP,
		Plan: dom.name, Rules: c.rules, Cost: c.cost,
		Route: "envoy:" + dom.name, Method: "ShouldRateLimit",
		Domain: dom.name, Descriptor: eventDescriptor(all, c.picks, s.dropped),
	}, h)
	switch v.Outcome {
	case gateway.Canceled:
		return nil, status.Error(codes.Canceled, "the caller went away before a decision")
	case gateway.Refused:
		return s.undecidable(snap, dom, len(descs), codes.Internal, "the limiter refused its input")
	case gateway.OverLimit, gateway.FailedClosed:
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	answer(resp, cfg, c, v, h)
	return resp, nil
}

// undecidableInput is a request resolve cannot decide as sent; it says
// why.
type undecidableInput string

func (u undecidableInput) Error() string { return string(u) }

// resolve finds each descriptor's limit, as ratelimit's GetLimit does,
// and the caller's address when a remote_address entry names one. A
// request it cannot decide as sent is an undecidableInput; an override
// the configuration refuses, a gRPC error.
func resolve(cfg Config, dom *domain, descs []*commonv3.RateLimitDescriptor) (all []resolved, clientIP string, err error) {
	n := 0
	for i, d := range descs {
		if len(d.GetEntries()) > MaxEntries {
			return nil, "", undecidableInput(fmt.Sprintf("descriptor %d: %d entries, at most %d", i, len(d.GetEntries()), MaxEntries))
		}
		n += len(d.GetEntries())
	}
	all = make([]resolved, len(descs))
	flat := make([]entry, n) // every descriptor's entries, in one allocation
	for i, d := range descs {
		es := d.GetEntries()
		f := resolved{entries: flat[:len(es):len(es)]}
		flat = flat[len(es):]
		for j, e := range es {
			f.entries[j] = entry{e.GetKey(), e.GetValue()}
			if e.GetKey() == "remote_address" && clientIP == "" {
				if a, err := netip.ParseAddr(e.GetValue()); err == nil {
					clientIP = a.String()
				}
			}
		}
		n, ok, bucketed, vary := dom.match(f.entries)
		if ok {
			f.lim, f.bucketed, f.configured, f.vary = n.limit, bucketed, n.limit, vary
		} else {
			f.vary = unnamed(f.entries)
		}
		if o := d.GetLimit(); o != nil {
			switch cfg.LimitOverrides {
			case OverridesReject:
				return nil, "", status.Errorf(codes.InvalidArgument, "descriptor %d: limit overrides are refused by this rate limit service", i)
			case OverridesHonor:
				f.lim, f.override = overrideLimit(dom.name, n, o), true
			}
		}
		all[i] = f
	}
	return all, clientIP, nil
}

// check is what a request asks the store: its rules, one per distinct
// bucket, each with its cost, and what each descriptor resolved to.
type check struct {
	rules   []gateway.Rule
	picks   []pick
	cost    int64
	blocked bool // a descriptor's limit is 0: refused without a store call
}

// checkOf turns the resolved descriptors into the check. Replaced and
// unlimited descriptors are not checked.
func checkOf(cfg Config, dom *domain, descs []*commonv3.RateLimitDescriptor, all []resolved, hits uint32) check {
	var replacing map[string]bool // limit names other limits replace
	for _, f := range all {
		if f.lim != nil && len(f.lim.replaces) > 0 {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			for _, r := range f.lim.replaces {
				replacing[r] = true
			}
		}
	}
	// The call's cost is the request's hits_addend (events and metrics
	// count it); a descriptor's own hits_addend is its rule's cost, all
	// decided in the one atomic check.
	c := check{picks: make([]pick, len(descs)), rules: make([]gateway.Rule, 0, min(len(descs), limiter.MaxRules)), cost: int64(max(1, hits))}
	// rules[j] is charged charges[j] and given back gives[j] (is_negative_hits).
	charges, gives := make([]int64, 0, cap(c.rules)), make([]int64, 0, cap(c.rules))
	for i, f := range all {
		p := pick{rule: -1}
		switch {
		case f.lim == nil:
		case f.lim.name != "" && replacing[f.lim.name] && !f.override:
		case f.lim.unlimited:
			p.unlimited = true
		case f.lim.requestsPerUnit == 0 && descs[i].GetIsNegativeHits():
			p.current = f.lim.current() // nothing to give back to a block list
		case f.lim.requestsPerUnit == 0:
			// In shadow mode it is reported (OK, nothing remaining) and
			// never blocks.
			p.current = f.lim.current()
			if !f.lim.shadow && !cfg.ShadowMode {
				p.blocked, c.blocked = true, true
			}
		default:
			rule := cfg.bucketRule(dom.name, f)
			j := slices.IndexFunc(c.rules, func(r gateway.Rule) bool { return r.Bucket == rule.Bucket })
			if j < 0 {
				j = len(c.rules)
				c.rules = append(c.rules, rule)
			}
			p.rule = j
			p.current = f.lim.current()
			cost := c.cost
			if h := descs[i].GetHitsAddend(); h != nil {
				// Charged in full: a cut-down cost could fit under a limit
				// (up to 2^32) the real one exceeds. Values past 2^53 (exact
				// in the script's doubles) exceed every limit all the same.
				cost = int64(min(max(1, h.GetValue()), limiter.MaxCost))
			}
			// Two descriptors of one bucket are one rule, charged once: at
			// the higher cost, so neither is charged less than it asked;
			// likewise given back once, the most any asked; and charged
			// the difference when one charges it and another gives back.
			if j == len(charges) {
				charges, gives = append(charges, 0), append(gives, 0)
			}
			if descs[i].GetIsNegativeHits() {
				gives[j] = max(gives[j], cost)
			} else {
				charges[j] = max(charges[j], cost)
			}
		}
		c.picks[i] = p
	}
	if !c.blocked {
		c.rules = charged(c.rules, charges, gives, c.cost, c.picks)
	}
	return c
}
