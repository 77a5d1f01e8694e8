// Package gateway is the edge: it identifies the caller, checks every rule
// that applies with one limiter call, answers with rate-limit headers on
// every response (429 with a jittered Retry-After when denied), proxies
// allowed requests upstream and publishes each decision.
package gateway

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/limiter"
)

// Options are the gateway's collaborators; all are optional.
type Options struct {
	// Store is the shared limiter, e.g. a *limiter.Redis. Nil (the
	// interface, not a nil pointer in it) uses an in-memory store: limits
	// then hold per process.
	Store checker
	// Ping tells /readyz whether the shared store is reachable (with
	// Config.ReadyRequiresStore); nil: ready.
	Ping func(context.Context) error
	// Warm readies the shared store's link (e.g. *limiter.Redis's Warm):
	// called by WarmUp until it succeeds, then every second by KeepWarm;
	// nil: nothing beyond the warm-up's real check.
	Warm func(context.Context) error
	// Publisher takes decision events; nil disables them.
	Publisher publisher
	// Registry takes the metrics and serves /metrics; default a new one.
	Registry *prometheus.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock for the breaker, the local store and events;
	// default time.Now.
	Now func() time.Time
	// Directives are analytics' split and NAT directives, refreshed in the
	// background (a *limiter.Watcher); nil: none.
	Directives directiveSource
}

// Gateway serves traffic under one configuration at a time; Reload swaps
// it without dropping requests.
type Gateway struct {
	log     *slog.Logger
	now     func() time.Time
	store   checker
	shared  bool // store is shared (fallible); false: in memory
	local   *limiter.Memory
	breaker *breaker
	pub     publisher
	m       *metrics
	ping    func(context.Context) error
	warm    func(context.Context) error
	// warmErr is why WarmUp has not found the store usable yet; nil once
	// it has (or without a shared store), when warmed is closed.
	warmErr   atomic.Pointer[error]
	warmed    chan struct{}
	keys      *keyHasher
	gatewayID string
	boot      Config // restart-only fields as started

	st        atomic.Pointer[state]
	draining  atomic.Bool
	reloadMu  sync.Mutex
	upstreams map[upstreamKey]*upstream

	handler http.Handler
	conns   *connLimit

	directives        directiveSource
	directivesApplied *prometheus.CounterVec
}

type upstreamKey struct {
	name string
	cfg  Upstream
}

// New returns a gateway for cfg, which must be valid.
func New(cfg Config, opts Options) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	g := &Gateway{
		log:       opts.Logger,
		now:       opts.Now,
		pub:       opts.Publisher,
		ping:      opts.Ping,
		warm:      opts.Warm,
		warmed:    make(chan struct{}),
		gatewayID: cfg.GatewayID,
		boot:      cfg,
		upstreams: map[upstreamKey]*upstream{},
	}
	g.m = newMetrics(opts.Registry)
	g.directives = opts.Directives
	g.directivesApplied = newDirectivesApplied(opts.Registry)
	g.local = limiter.NewMemory(opts.Now, cfg.LocalMaxKeys)
	g.store, g.shared = opts.Store, opts.Store != nil
	if !g.shared {
		g.store = g.local
		close(g.warmed)
	} else {
		err := errNotWarm
		g.warmErr.Store(&err)
	}
	g.breaker = newBreaker(cfg.Breaker.Failures, cfg.Breaker.Open, g.circuitChanged)
	secret := []byte(cfg.KeyHashSecret)
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
		if g.pub != nil {
			g.log.Warn("key_hash_secret not set: event key ids are random per process and will not match across gateways")
		}
	}
	g.keys = newKeyHasher(secret)
	st, err := compile(cfg, g.upstreamsFor(cfg))
	if err != nil {
		return nil, err
	}
	g.st.Store(st)
	g.conns = &connLimit{max: int64(cfg.MaxConnections), refused: g.m.rejected.WithLabelValues("too_many_connections").Inc}
	g.handler = g.guard(g.newEcho())
	return g, nil
}

func (g *Gateway) newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	// The limiter's identity uses the configured extractor of each state;
	// echo's own RealIP gets the safe one explicitly, never its
	// header-trusting default.
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = g.echoError
	e.Any("/*", g.handle)
	e.RouteNotFound("/*", g.handle)
	return e
}

// Handler serves traffic.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Server returns the traffic listener's server, timeouts, header limit
// and connection cap set, to Serve the traffic listener wrapped by
// Listener (which refuses mixed Content-Length and Transfer-Encoding).
// Serve one listener per Server: the connection cap counts them all.
func (g *Gateway) Server() *http.Server {
	c := g.boot
	return &http.Server{
		Addr:              c.Listen,
		Handler:           g.handler,
		ReadHeaderTimeout: c.Timeouts.ReadHeader,
		ReadTimeout:       c.Timeouts.Read,
		WriteTimeout:      c.Timeouts.Write,
		IdleTimeout:       c.Timeouts.Idle,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ConnState:         g.conns.state,
		ConnContext:       connContext,
		// guard answers "OPTIONS *" itself, charged (see serverOptions).
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
}

// Drain makes /readyz fail from now on, so load balancers stop sending
// traffic while the server finishes what it has.
func (g *Gateway) Drain() { g.draining.Store(true) }

// Ready reports whether the gateway takes traffic: not draining; with a
// shared store, WarmUp has found it usable; and, with ReadyRequiresStore,
// the shared store answers now.
func (g *Gateway) Ready(ctx context.Context) error {
	if g.draining.Load() {
		return errors.New("draining for shutdown")
	}
	if err := g.warmErr.Load(); err != nil {
		return fmt.Errorf("warming up: %w", *err)
	}
	if g.ping == nil || !g.st.Load().cfg.ReadyRequiresStore {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := g.ping(ctx); err != nil {
		return fmt.Errorf("ping limiter store: %w", err)
	}
	return nil
}

// Reload swaps in a new configuration; requests in flight finish under the
// old one. An invalid cfg leaves the old one in force and is counted.
func (g *Gateway) Reload(cfg Config) error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	if err := cfg.Validate(); err != nil {
		g.ReloadFailed(err)
		return err
	}
	st, err := compile(cfg, g.upstreamsFor(cfg))
	if err != nil {
		g.ReloadFailed(err)
		return err
	}
	g.st.Store(st)
	g.breaker.configure(st.cfg.Breaker.Failures, st.cfg.Breaker.Open)
	g.dropUnused(st.cfg)
	g.m.reloads.WithLabelValues("ok").Inc()
	if changed := restartOnly(g.boot, st.cfg); len(changed) > 0 {
		g.log.Warn("config reloaded; some changes need a restart", "fields", changed)
	} else {
		g.log.Info("config reloaded", "plans", len(st.plans), "routes", len(st.routes), "api_keys", len(st.cfg.APIKeys))
	}
	return nil
}

// ReloadFailed counts and logs a reload that failed before Reload could
// see the configuration (e.g. a YAML error).
func (g *Gateway) ReloadFailed(err error) {
	g.m.reloads.WithLabelValues("failed").Inc()
	g.log.Error("config reload failed; keeping the previous config", "error", err.Error())
}

func restartOnly(a, b Config) []string {
	var out []string
	add := func(name string, changed bool) {
		if changed {
			out = append(out, name)
		}
	}
	add("gateway_id", a.GatewayID != b.GatewayID)
	add("listen", a.Listen != b.Listen)
	add("admin_listen", a.AdminListen != b.AdminListen)
	add("pprof", a.Pprof != b.Pprof)
	add("timeouts", a.Timeouts != b.Timeouts)
	add("max_header_bytes", a.MaxHeaderBytes != b.MaxHeaderBytes)
	add("max_connections", a.MaxConnections != b.MaxConnections)
	add("local_max_keys", a.LocalMaxKeys != b.LocalMaxKeys)
	add("key_hash_secret", a.KeyHashSecret != b.KeyHashSecret)
	return out
}

// upstreamsFor returns an upstream per configured name, reusing those
// whose settings did not change.
func (g *Gateway) upstreamsFor(cfg Config) map[string]*upstream {
	cfg = cfg.WithDefaults()
	out := make(map[string]*upstream, len(cfg.Upstreams))
	for name, u := range cfg.Upstreams {
		k := upstreamKey{name, u}
		up, ok := g.upstreams[k]
		if !ok {
			up = newUpstream(name, u, g.m, g.log)
			g.upstreams[k] = up
		}
		out[name] = up
	}
	return out
}

// dropUnused forgets upstreams the current config no longer uses and
// closes their idle connections; requests in flight on them finish.
func (g *Gateway) dropUnused(cfg Config) {
	for k, up := range g.upstreams {
		if cur, ok := cfg.Upstreams[k.name]; !ok || cur != k.cfg {
			up.transport.CloseIdleConnections()
			delete(g.upstreams, k)
		}
	}
}

// Close releases idle upstream connections.
func (g *Gateway) Close() {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	for _, up := range g.upstreams {
		up.transport.CloseIdleConnections()
	}
}

func (g *Gateway) circuitChanged(from, to circuit) {
	g.m.circuitState.Set(float64(to))
	switch to {
	case circuitOpen:
		if from == circuitClosed {
			g.m.circuitOpens.Inc()
			g.log.Warn("limiter store failing; circuit open, failure policy in force")
		}
	case circuitClosed:
		g.log.Info("limiter store back; circuit closed, enforcement resumed")
	}
}

// handle serves every traffic request: the decision API, or identify,
// check, and proxy.
func (g *Gateway) handle(c echo.Context) error {
	st := g.st.Load()
	r, w := c.Request(), c.Response()
	// One path: routes, limits and the upstream all see this one.
	p, err := normalizePath(requestPath(r.URL.RawPath, r.URL.EscapedPath()), st.cfg.Paths)
	if err != nil {
		g.refuse(w, r, st, "bad_path", "", problem{Type: probBadPath, Status: http.StatusBadRequest,
			Detail: "The path holds " + err.Error() + ", which services behind this gateway could read differently."})
		return nil
	}
	if st.cfg.CheckPath != "-" && p == st.cfg.CheckPath && r.Method == http.MethodPost {
		g.serveCheck(w, r, st)
		return nil
	}
	rt := st.match(r.Method, p)
	if rt == nil {
		g.refuse(w, r, st, "no_route", "", problem{Type: probNoRoute, Status: http.StatusNotFound, Detail: "No route matches this method and path."})
		return nil
	}
	defer func() { g.m.countResponse(rt.Name, w.Status) }()
	if isTrace(r.Method) && !rt.allowsMethod(r.Method) {
		w.Header()["Allow"] = []string{allowedMethods}
		g.refuse(w, r, st, "method_not_allowed", rt.Name, problem{Type: probMethodNotAllowed, Status: http.StatusMethodNotAllowed, Route: rt.Name,
			Detail: r.Method + " is not served here: it would echo the request, credentials and all, back to the client. A route that lists it in its methods passes it on."})
		return nil
	}
	if st.overridden(r, p, rt) {
		g.refuse(w, r, st, "method_override", rt.Name, problem{Type: probBadRequest, Status: http.StatusBadRequest, Route: rt.Name,
			Detail: "The query's _method (or X-HTTP-Method-Override) names a method that this gateway limits on another route than POST; frameworks that honour it would run the request as that method. Send that method itself."})
		return nil
	}
	if r.ContentLength > st.cfg.MaxBodyBytes {
		g.refuse(w, r, st, "body_too_large", rt.Name, problem{Type: probBodyTooLarge, Status: http.StatusRequestEntityTooLarge, Route: rt.Name,
			Detail: fmt.Sprintf("The request body is larger than %d bytes.", st.cfg.MaxBodyBytes)})
		return nil
	}
	up := upgradeOf(r.Header)
	if up == "h2c" && !rt.allowsUpgrade(up) {
		// curl --http2 offers h2c on every plain request; a server may
		// ignore an upgrade (RFC 9110 §7.8), and the request goes on as
		// HTTP/1.1.
		r.Header.Del("Upgrade")
		up = ""
	}
	if up != "" && !rt.allowsUpgrade(up) {
		g.refuse(w, r, st, "upgrade_not_allowed", rt.Name, problem{Type: probUpgrade, Status: http.StatusBadRequest, Route: rt.Name,
			Detail: fmt.Sprintf("This route does not upgrade to %q.", up)})
		return nil
	}
	idle := g.boot.Timeouts.Read
	if rt.ReadIdle > 0 {
		idle = rt.ReadIdle
	}
	if p := prefetch(w, r, st.cfg.MaxBodyBytes, idle); p != nil {
		p.Route = rt.Name
		if p.Status == http.StatusBadRequest {
			w.Header()["Connection"] = []string{"close"}
		}
		g.refuse(w, r, st, prefetchReasons[p.Status], rt.Name, *p)
		return nil
	}
	if rt.Exempt {
		g.proxy(w, r, p, rt, st, st.peerTrusted(r), nil)
		return nil
	}
	id, ierr := st.identify(r)
	q := call{id: id, cost: rt.Cost, route: rt.Name, method: eventMethod(r.Method), userAgent: r.UserAgent()}
	if ierr != identified {
		writeProblem(w, g.failedAuth(r.Context(), w.Header(), st, ierr, q))
		return nil
	}
	q.limits = st.limitsFor(id, rt, false)
	q.limits.hold()
	var use *tokenUse
	if rt.Tokens != nil {
		// A token budget: the reservation is checked with the other rules.
		var body []byte
		if readsBody(rt.Tokens) {
			b, p := readBody(w, r, st.cfg.MaxBodyBytes, idle)
			if p != nil {
				p.Route = rt.Name
				g.refuse(w, r, st, prefetchReasons[p.Status], rt.Name, *p)
				return nil
			}
			body = b
		}
		use = &tokenUse{t: rt.Tokens, reserved: reservation(rt.Tokens, r.Header, body)}
		q.limits.withReservation(use.reserved)
		q.reserved = use.reserved
		w.Header()[hReserved] = []string{strconv.FormatInt(use.reserved, 10)}
	}
	v := g.enforce(r.Context(), st, &q)
	if a := answerFor(w.Header(), v, st); a.status != http.StatusOK {
		a.write(w)
		return nil
	}
	// Deferred: ReverseProxy panics (http.ErrAbortHandler) when the
	// client goes away mid-answer, and the answer's end is then too.
	if use != nil {
		defer g.settle(r.Context(), w.Header(), st, &q, v, use)
	}
	defer g.hold(st, &q, v).release()
	g.proxy(w, r, p, rt, st, id.peerTrusted, use)
	return nil
}

// proxy sends an allowed request upstream to the normalised path p, its
// body bounded; use, on a token route, learns what its answer used.
func (g *Gateway) proxy(w *echo.Response, r *http.Request, p string, rt *route, st *state, peerTrusted bool, use *tokenUse) {
	t := g.boot.Timeouts
	if rt.ReadIdle > 0 {
		t.Read = rt.ReadIdle
	}
	if rt.WriteIdle > 0 {
		t.Write = rt.WriteIdle
	}
	dl := newDeadlines(w, t)
	if upgradeOf(r.Header) != "" { // allowed, or handle refused it
		var cancel context.CancelFunc
		r, cancel = tunnel(w, r, rt)
		defer cancel()
	} else {
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		defer dl.arm(func() { cancel(errIdle) })()
		r = r.WithContext(ctx)
	}
	info := &proxyInfo{route: rt.Name, path: p, peerTrusted: peerTrusted, trustedHops: st.cfg.TrustedHops > 0, strip: st.strip, tokens: use}
	if r.Body != nil && r.Body != http.NoBody {
		// A scan holds bytes back, so the client's progress is marked as
		// it is read, not only as the upstream gets it.
		in := &progressBody{ReadCloser: r.Body, dl: dl}
		body, err := st.scanBody(r, http.MaxBytesReader(w.Writer, in, st.cfg.MaxBodyBytes), p, rt)
		if err != nil {
			refuseBody(w, g.m, rt.Name, err)
			return
		}
		defer body.Close() // the transport closes it too; this ends a scanner's parser in any case
		info.body = &bodyReader{rc: body, dl: dl}
		r.Body = info.body
	} else {
		dl.noRead()
	}
	iw := newInterimWriter(w, dl)
	rt.upstream.serve(iw, r, info)
	if iw.hijacked {
		g.conns.tunnelClosed()
	}
}

// echoError answers errors echo raises itself (e.g. malformed paths).
func (g *Gateway) echoError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status := http.StatusInternalServerError
	var he *echo.HTTPError
	if errors.As(err, &he) {
		status = he.Code
	}
	writeProblem(c.Response(), problem{Type: probBadRequest, Status: status})
}
