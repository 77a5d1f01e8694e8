package analytics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/limiter"
)

// directiveStore is where the detector reads and writes directives:
// limiter.DirectiveStore.
type directiveStore interface {
	Load(ctx context.Context) (limiter.Directives, int, error)
	WriteSplits(ctx context.Context, ds []limiter.SplitDirective) error
	WriteNATs(ctx context.Context, ds []limiter.NATDirective) error
}

// Deps are the detector's collaborators. Only Reader is required.
type Deps struct {
	Reader *Reader
	// Directives receives split and NAT directives; nil detects without
	// writing (a dry run).
	Directives directiveStore
	// Alerter posts the fleet alerts; nil evaluates without posting.
	Alerter *Alerter
	// Now defaults to time.Now.
	Now func() time.Time
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Registry receives the detector's metrics; nil registers none.
	Registry prometheus.Registerer
}

// Detector runs the hot-key and NAT detectors and the fleet alerts on a
// schedule, writes the directives and keeps the last report for the API.
type Detector struct {
	cfg Config
	d   Deps
	m   *detectorMetrics

	mu       sync.Mutex
	last     Report
	hotSince map[string]time.Time
	natSince map[string]time.Time
}

// Report is what one run found and did.
type Report struct {
	At       time.Time     `json:"at"`
	Duration time.Duration `json:"duration_ns"`
	HotKeys  []HotKey      `json:"hot_keys"`
	NATIPs   []NATIP       `json:"nat_ips"`
	Alerts   []Alert       `json:"alerts"`
	// SplitsWritten and NATsWritten say whether this run rewrote the
	// directive sets (they are rewritten when they change or when their
	// expiry needs refreshing).
	// Freshness is how fresh the data was; on Stale data the run wrote no
	// directive and resolved no alert.
	Freshness     Freshness `json:"freshness"`
	SplitsWritten bool      `json:"splits_written"`
	NATsWritten   bool      `json:"nats_written"`
	Errors        []string  `json:"errors,omitempty"`
}

// NewDetector returns a detector with cfg (defaults applied, validated).
func NewDetector(cfg Config, d Deps) (*Detector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Reader == nil {
		return nil, errors.New("analytics: detector needs a reader")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	m, err := newDetectorMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	return &Detector{cfg: cfg, d: d, m: m, hotSince: map[string]time.Time{}, natSince: map[string]time.Time{}}, nil
}

// Config returns the detector's configuration, defaults applied.
func (dt *Detector) Config() Config { return dt.cfg }

// Directives reads the directive set in Redis, as the gateways see it; ok
// is false when the detector has no directive store (a dry run).
func (dt *Detector) Directives(ctx context.Context) (d limiter.Directives, ok bool, err error) {
	if dt.d.Directives == nil {
		return d, false, nil
	}
	d, _, err = dt.d.Directives.Load(ctx)
	return d, true, err
}

// Last returns the last run's report (zero before the first run).
func (dt *Detector) Last() Report {
	dt.mu.Lock()
	defer dt.mu.Unlock()
	return dt.last
}

// Run runs the detectors every Interval until ctx ends.
func (dt *Detector) Run(ctx context.Context) {
	t := time.NewTicker(dt.cfg.Interval)
	defer t.Stop()
	for {
		dt.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// window is [from, to) for a detector window ending now: from is the start
// of the minute holding now-w (the rollups are per minute), and span the
// time the rate divides by.
func window(now time.Time, w time.Duration) (from, to time.Time, span time.Duration) {
	from = now.Add(-w).Truncate(time.Minute)
	return from, now.Truncate(time.Minute).Add(time.Minute), now.Sub(from)
}

// RunOnce runs the detectors and alerts once and returns the report. A
// failed query leaves that detector's directives as they are (they still
// expire on their own); errors are in the report and the log.
func (dt *Detector) RunOnce(ctx context.Context) Report {
	start := dt.d.Now()
	rep := Report{At: start}
	fail := func(what string, err error) {
		rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", what, err))
		dt.d.Log.Error("analytics run", "step", what, "error", err.Error())
	}

	live := limiter.Directives{}
	loaded := dt.d.Directives == nil
	if dt.d.Directives != nil {
		var err error
		if live, _, err = dt.d.Directives.Load(ctx); err != nil {
			fail("load directives", err)
		} else {
			loaded = true
		}
	}

	// write finishes a directive-writing detector's step: after a failed
	// query (err) the directives stay as they are; else put writes the
	// set of kind (split, nat) unless this is a dry run, the live sets are
	// unknown, or they already say the same (current). It reports whether
	// it wrote.
	write := func(step, kind string, err error, current bool, put func() error) bool {
		if err != nil {
			fail(step, err)
			return false
		}
		if dt.d.Directives == nil || !loaded || current {
			return false
		}
		if err := put(); err != nil {
			fail("write "+kind+"s", err)
			return false
		}
		dt.m.writes.WithLabelValues(kind).Inc()
		return true
	}
	// Fresh enough to act on? Unknown freshness counts as stale: acting on
	// missing data deletes directives still needed and resolves alerts
	// still true.
	fresh, err := dt.d.Reader.Freshness(ctx, start)
	if err != nil {
		fail("freshness", err)
	}
	rep.Freshness = fresh.Judge(start, dt.cfg.StaleAfter)
	dt.m.dataAge.Set(rep.Freshness.Age.Seconds())
	if rep.Freshness.Stale {
		dt.m.stale.Inc()
		dt.d.Log.Warn("data is stale; keeping directives and alerts as they are",
			"age_seconds", rep.Freshness.Age.Seconds(), "newest", rep.Freshness.Newest, "last_commit", rep.Freshness.LastCommit)
		if dt.d.Alerter != nil {
			// Re-posted so Alertmanager keeps them; none resolves.
			if err := dt.d.Alerter.Process(ctx, dt.d.Alerter.Firing()); err != nil {
				fail("post alerts", err)
			}
		}
		rep.Alerts = dt.d.Alerter.firingOrNil()
		return dt.finish(rep, start)
	}
	if !dt.cfg.Hot.Disabled {
		hot, next, current, err := dt.hotKeys(ctx, start, live)
		rep.HotKeys = hot
		rep.SplitsWritten = write("hot keys", "split", err, current, func() error { return dt.d.Directives.WriteSplits(ctx, next) })
	}
	if !dt.cfg.NAT.Disabled {
		nats, next, current, err := dt.natIPs(ctx, start, live)
		rep.NATIPs = nats
		rep.NATsWritten = write("nat ips", "nat", err, current, func() error { return dt.d.Directives.WriteNATs(ctx, next) })
	}
	if !dt.cfg.Alerts.Disabled {
		from, to, _ := window(start, dt.cfg.Alerts.Window)
		gh, err := dt.d.Reader.GatewayHealth(ctx, from, to)
		if err != nil {
			fail("gateway health", err)
		} else {
			rep.Alerts = EvaluateAlerts(dt.cfg.Alerts, gh)
			if dt.d.Alerter != nil {
				if err := dt.d.Alerter.Process(ctx, rep.Alerts); err != nil {
					fail("post alerts", err)
				}
			}
		}
	}

	return dt.finish(rep, start)
}

// finish records a run's report and metrics.
func (dt *Detector) finish(rep Report, start time.Time) Report {
	dt.mu.Lock()
	dt.stamp(rep.HotKeys, rep.NATIPs, start)
	rep.Duration = dt.d.Now().Sub(start)
	dt.last = rep
	dt.mu.Unlock()

	result := "ok"
	if len(rep.Errors) > 0 {
		result = "error"
	}
	dt.m.runs.WithLabelValues(result).Inc()
	dt.m.duration.Observe(rep.Duration.Seconds())
	dt.m.hot.Set(float64(len(rep.HotKeys)))
	dt.m.nat.Set(float64(len(rep.NATIPs)))
	firing := 0
	for _, a := range rep.Alerts {
		if a.Firing {
			firing++
		}
	}
	dt.m.firing.Set(float64(firing))
	// Durations in logs are float seconds (*_seconds), the unit of the
	// Prometheus histograms beside them.
	dt.d.Log.Debug("analytics run done", "duration_ms", rep.Duration.Milliseconds(), "hot_keys", len(rep.HotKeys),
		"nat_ips", len(rep.NATIPs), "alerts_firing", firing, "errors", len(rep.Errors))
	return rep
}

// stamp records since when each hot key and NAT IP has been flagged.
func (dt *Detector) stamp(hot []HotKey, nats []NATIP, now time.Time) {
	stampSince(dt.hotSince, hot, now, func(h *HotKey) (string, *time.Time) { return limiter.DirectiveKey(h.KeyKind, h.KeyID), &h.Since })
	stampSince(dt.natSince, nats, now, func(n *NATIP) (string, *time.Time) { return n.Key, &n.Since })
}

// stampSince sets each finding's since time (field gives its key and the
// field) from since, where a key new to since starts now, and forgets the
// keys no longer found.
func stampSince[T any](since map[string]time.Time, found []T, now time.Time, field func(*T) (string, *time.Time)) {
	seen := make(map[string]bool, len(found))
	for i := range found {
		k, at := field(&found[i])
		seen[k] = true
		if _, ok := since[k]; !ok {
			since[k] = now
		}
		*at = since[k]
	}
	maps.DeleteFunc(since, func(k string, _ time.Time) bool { return !seen[k] })
}

// inForce returns the keys of the live directives not yet expired at now.
func inForce[D any](live map[string]D, now time.Time, expires func(D) time.Time) map[string]bool {
	keys := map[string]bool{}
	for k, d := range live {
		if now.Before(expires(d)) {
			keys[k] = true
		}
	}
	return keys
}

func splitExpires(d limiter.SplitDirective) time.Time { return d.Expires }
func natExpires(d limiter.NATDirective) time.Time     { return d.Expires }

// hotKeys finds the keys hot at now (nil on error), the splits they
// make, and whether the live splits already say the same.
func (dt *Detector) hotKeys(ctx context.Context, now time.Time, live limiter.Directives) ([]HotKey, []limiter.SplitDirective, bool, error) {
	from, to, span := window(now, dt.cfg.Hot.Window)
	hot, err := dt.d.Reader.HotKeys(ctx, dt.cfg.Hot, from, to, span, inForce(live.Splits, now, splitExpires))
	next := SplitDirectives(hot, now, dt.cfg.Hot.TTL)
	return hot, next, splitsCurrent(live.Splits, next, now, dt.cfg.Hot.TTL), err
}

// natIPs finds the IPs NAT-shared at now (nil on error), the NAT
// directives they make, and whether the live ones already say the same.
func (dt *Detector) natIPs(ctx context.Context, now time.Time, live limiter.Directives) ([]NATIP, []limiter.NATDirective, bool, error) {
	from, to, _ := window(now, dt.cfg.NAT.Window)
	nats, err := dt.d.Reader.NATIPs(ctx, dt.cfg.NAT, from, to, inForce(live.NATs, now, natExpires))
	next := NATDirectives(nats, now, dt.cfg.NAT.TTL)
	return nats, next, natsCurrent(live.NATs, next, now, dt.cfg.NAT.TTL), err
}

// HotKeys runs the hot-key detector over [from, to), whose rate divides
// by span (to - from when zero); the recent rate covers the MinSpan before
// from+span. split names the keys split now (see DetectHotKeys).
func (r *Reader) HotKeys(ctx context.Context, cfg HotConfig, from, to time.Time, span time.Duration, split map[string]bool) ([]HotKey, error) {
	if err := (Range{From: from, To: to}).validate(); err != nil {
		return nil, err
	}
	if span <= 0 {
		span = to.Sub(from)
	}
	total, err := r.TotalRequests(ctx, from, to)
	if err != nil {
		return nil, err
	}
	// Candidates: enough requests to be hot over the shortest span a rate
	// is measured over.
	minRequests := cfg.Threshold(total, min(span, cfg.MinSpan))
	keys, err := r.KeyTraffic(ctx, from, to, minRequests, 4*cfg.MaxKeys)
	if err != nil {
		return nil, err
	}
	if cfg.MinSpan > 0 && len(keys) > 0 {
		recent, err := r.RecentKeyTraffic(ctx, from, to, from.Add(span).Add(-cfg.MinSpan), minRequests, 4*cfg.MaxKeys)
		if err != nil {
			return nil, err
		}
		type id struct{ key, kind string }
		byID := make(map[id]KeyTraffic, len(recent))
		for _, k := range recent {
			byID[id{k.KeyID, k.KeyKind}] = k
		}
		for i := range keys {
			r := byID[id{keys[i].KeyID, keys[i].KeyKind}]
			keys[i].Recent, keys[i].RecentGateways, keys[i].RecentDenied = r.Allowed(), r.Gateways, r.Denied
		}
	}
	return DetectHotKeys(cfg, keys, total, span, split), nil
}

// NATIPs runs the NAT detector over [from, to); flagged names the IP keys
// under a NAT directive now (see DetectNATs).
func (r *Reader) NATIPs(ctx context.Context, cfg NATConfig, from, to time.Time, flagged map[string]bool) ([]NATIP, error) {
	if err := (Range{From: from, To: to}).validate(); err != nil {
		return nil, err
	}
	cool := func(v int64) int64 {
		if v <= 0 {
			return v // a test turned off stays off
		}
		return max(1, int64(math.Floor(float64(v)*cfg.CoolRatio)))
	}
	rows, err := r.IPTraffic(ctx, NATQuery{
		From: from, To: to,
		MinRequests: cool(cfg.MinRequests), MinKeys: cool(cfg.MinDistinctKeys), MinUserAgents: cool(cfg.MinDistinctUserAgents),
		Limit: 2 * cfg.MaxIPs,
	})
	if err != nil {
		return nil, err
	}
	return DetectNATs(cfg, rows, flagged), nil
}

// splitsCurrent says whether the live splits already say what next says:
// the same keys, shares within 0.02, and no expiry closer than half a TTL.
// Then the write is skipped, sparing the gateways a reload.
func splitsCurrent(live map[string]limiter.SplitDirective, next []limiter.SplitDirective, now time.Time, ttl time.Duration) bool {
	if len(inForce(live, now, splitExpires)) != len(next) {
		return false
	}
	for _, d := range next {
		l, ok := live[d.Key]
		if !ok || l.Expires.Sub(now) < ttl/2 || len(l.Shares) != len(d.Shares) {
			return false
		}
		for gw, s := range d.Shares {
			if ls, ok := l.Shares[gw]; !ok || math.Abs(ls-s) > 0.02 {
				return false
			}
		}
	}
	return true
}

// natsCurrent is splitsCurrent for NAT directives: factors within 5 %.
func natsCurrent(live map[string]limiter.NATDirective, next []limiter.NATDirective, now time.Time, ttl time.Duration) bool {
	if len(inForce(live, now, natExpires)) != len(next) {
		return false
	}
	for _, d := range next {
		l, ok := live[d.Key]
		if !ok || l.Expires.Sub(now) < ttl/2 || math.Abs(l.Factor-d.Factor) > 0.05*d.Factor {
			return false
		}
	}
	return true
}

type detectorMetrics struct {
	runs     *prometheus.CounterVec
	duration prometheus.Histogram
	writes   *prometheus.CounterVec
	hot      prometheus.Gauge
	nat      prometheus.Gauge
	firing   prometheus.Gauge
	dataAge  prometheus.Gauge
	stale    prometheus.Counter
}

const ns = "edgelimit_analytics"

// newDetectorMetrics makes the detector's series and registers them with
// reg, each named under ns. A nil reg registers nothing.
func newDetectorMetrics(reg prometheus.Registerer) (*detectorMetrics, error) {
	m := &detectorMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runs_total", Help: "Detector runs by result (ok, error)."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "run_duration_seconds",
			Help:    "Time of one detector run: queries, directive writes, alert posts.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		writes:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "directive_writes_total", Help: "Directive sets written to Redis, by kind (split, nat)."}, []string{"kind"}),
		hot:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "hot_keys", Help: "Keys found hot by the last run."}),
		nat:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "nat_ips", Help: "Addresses flagged as NAT-shared by the last run."}),
		firing:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "alerts_firing", Help: "Fleet alerts firing after the last run."}),
		dataAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "data_age_seconds", Help: "How far the newest data in ClickHouse was behind the last run's time."}),
		stale:   prometheus.NewCounter(prometheus.CounterOpts{Name: "stale_runs_total", Help: "Runs that found the data stale and kept directives and alerts as they were."}),
	}
	for _, r := range []string{"ok", "error"} {
		m.runs.WithLabelValues(r)
	}
	for _, k := range []string{"split", "nat"} {
		m.writes.WithLabelValues(k)
	}
	reg = prometheus.WrapRegistererWithPrefix(ns+"_", reg) // no-op when nil
	for _, c := range []prometheus.Collector{m.runs, m.duration, m.writes, m.hot, m.nat, m.firing, m.dataAge, m.stale} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register analytics metrics: %w", err)
		}
	}
	return m, nil
}
