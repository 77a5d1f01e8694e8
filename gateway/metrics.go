package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the gateway's Prometheus series. Labels are bounded: rule,
// route and plan names come from the configuration; never a key or an IP.
type metrics struct {
	decisions        *prometheus.CounterVec   // result, rule, mode
	storeUnavailable *prometheus.CounterVec   // reason
	failOpen         prometheus.Counter       //
	giveBackFailed   prometheus.Counter       //
	failClosed       prometheus.Counter       //
	checkLatency     *prometheus.HistogramVec // store, status
	sharedOK         prometheus.Observer      // checkLatency of successful shared calls, resolved once
	localOK          prometheus.Observer      // checkLatency of local calls
	circuitState     prometheus.Gauge         //
	circuitOpens     prometheus.Counter       //
	requests         *prometheus.CounterVec   // route, code
	upstreamErrors   *prometheus.CounterVec   // route, kind
	rejected         *prometheus.CounterVec   // reason: unknown_key, key_required, no_route, body_too_large, method_override, ambiguous_key, …
	reloads          *prometheus.CounterVec   // result
	settlements      *prometheus.CounterVec   // result
	leases           *prometheus.CounterVec   // result
}

const ns = "edgelimit_gateway"

// newMetrics makes the gateway's series, each named under ns, and
// registers each with reg as it is made. A clash panics: it is a wiring
// mistake (two gateways on one registry), not something to run with.
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(prometheus.WrapRegistererWithPrefix(ns+"_", reg))
	m := &metrics{
		decisions:        f.NewCounterVec(prometheus.CounterOpts{Name: "decisions_total", Help: "Rate-limit decisions by result (allowed, denied), binding rule and mode (enforced, shadow, fail_open, fail_closed, local_fallback)."}, []string{"result", "rule", "mode"}),
		storeUnavailable: f.NewCounterVec(prometheus.CounterOpts{Name: "store_unavailable_total", Help: "Decisions the shared store could not make, by reason (error, timeout, caller_deadline, migrating, circuit_open)."}, []string{"reason"}),
		failOpen:         f.NewCounter(prometheus.CounterOpts{Name: "fail_open_total", Help: "Requests allowed unchecked because the store was unavailable."}),
		failClosed:       f.NewCounter(prometheus.CounterOpts{Name: "fail_closed_total", Help: "Requests refused with 503 because the store was unavailable."}),
		giveBackFailed: f.NewCounter(prometheus.CounterOpts{Name: "give_back_failed_total",
			Help: "Refused requests of more rules than one limiter call takes whose earlier calls' charge could not be given back (the store failed): those units stay spent until they refill."}),
		checkLatency: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "check_duration_seconds",
			Help:    "Latency of one limiter call, by store (shared, local) and status (ok, error, timeout).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"store", "status"}),
		circuitState: f.NewGauge(prometheus.GaugeOpts{
			Name: "circuit_state",
			Help: "Store circuit breaker: 0 closed, 1 half-open, 2 open.",
		}),
		circuitOpens:   f.NewCounter(prometheus.CounterOpts{Name: "circuit_opens_total", Help: "Times the store circuit breaker opened."}),
		requests:       f.NewCounterVec(prometheus.CounterOpts{Name: "requests_total", Help: "Responses by route and status code."}, []string{"route", "code"}),
		upstreamErrors: f.NewCounterVec(prometheus.CounterOpts{Name: "upstream_errors_total", Help: "Proxied requests that failed, by route and kind (timeout, unreachable, client_body)."}, []string{"route", "kind"}),
		rejected:       f.NewCounterVec(prometheus.CounterOpts{Name: "rejected_total", Help: "Requests refused before any limit was checked, by reason."}, []string{"reason"}),
		reloads:        f.NewCounterVec(prometheus.CounterOpts{Name: "config_reloads_total", Help: "Configuration reloads by result (ok, failed)."}, []string{"result"}),
		leases: f.NewCounterVec(prometheus.CounterOpts{Name: "inflight_leases_total",
			Help: "In-flight slots' lease operations by result: renewed, renew_lost (the lease had lapsed and every slot was taken), renew_failed and release_failed (the store failed: the slot expires with its lease), released."}, []string{"result"}),
		settlements: f.NewCounterVec(prometheus.CounterOpts{Name: "settlements_total",
			Help: "Token reservations settled after the answer, by result: ok (the store charged or gave back the difference), none (the answer used what was reserved), unchecked (no store had charged the reservation: failed open or closed), failed (the store failed: the reservation stands)."}, []string{"result"}),
	}
	m.sharedOK = m.checkLatency.WithLabelValues("shared", "ok")
	m.localOK = m.checkLatency.WithLabelValues("local", "ok")
	for _, r := range []string{"error", "timeout", "caller_deadline", "migrating", "circuit_open"} {
		m.storeUnavailable.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "failed"} {
		m.reloads.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "none", "unchecked", "failed"} {
		m.settlements.WithLabelValues(r)
	}
	for _, r := range []string{"renewed", "renew_lost", "renew_failed", "released", "release_failed"} {
		m.leases.WithLabelValues(r)
	}
	return m
}

// countResponse counts one response of route with status code.
func (m *metrics) countResponse(route string, code int) {
	m.requests.WithLabelValues(route, codeLabel(code)).Inc()
}

// codeLabels are the label values of the status codes, made once: a
// label made per response was an allocation on every request.
var codeLabels = func() (l [600]string) {
	for i := range l {
		l[i] = strconv.Itoa(i)
	}
	return l
}()

func codeLabel(code int) string {
	if code >= 0 && code < len(codeLabels) {
		return codeLabels[code]
	}
	return strconv.Itoa(code)
}
