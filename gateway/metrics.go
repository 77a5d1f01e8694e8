package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus series. Labels are bounded: rule,
// route and plan names come from the configuration; never a key or an IP.
type metrics struct {
	decisions        *prometheus.CounterVec   // result, rule, mode
	storeUnavailable *prometheus.CounterVec   // reason
	failOpen         prometheus.Counter       //
	failClosed       prometheus.Counter       //
	checkLatency     *prometheus.HistogramVec // store, status
	sharedOK         prometheus.Observer      // checkLatency of successful shared calls, resolved once
	localOK          prometheus.Observer      // checkLatency of local calls
	circuitState     prometheus.Gauge         //
	circuitOpens     prometheus.Counter       //
	requests         *prometheus.CounterVec   // route, code
	upstreamErrors   *prometheus.CounterVec   // route, kind
	rejected         *prometheus.CounterVec   // reason: unknown_key, key_required, no_route, body_too_large
	reloads          *prometheus.CounterVec   // result
}

const ns = "edgelimit_gateway"

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions:        newCounterVec("decisions_total", "Rate-limit decisions by result (allowed, denied), binding rule and mode (enforced, shadow, fail_open, fail_closed, local_fallback).", "result", "rule", "mode"),
		storeUnavailable: newCounterVec("store_unavailable_total", "Decisions the shared store could not make, by reason (error, timeout, caller_deadline, circuit_open).", "reason"),
		failOpen:         newCounter("fail_open_total", "Requests allowed unchecked because the store was unavailable."),
		failClosed:       newCounter("fail_closed_total", "Requests refused with 503 because the store was unavailable."),
		checkLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "check_duration_seconds",
			Help:    "Latency of one limiter call, by store (shared, local) and status (ok, error, timeout).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"store", "status"}),
		circuitState: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "circuit_state",
			Help: "Store circuit breaker: 0 closed, 1 half-open, 2 open.",
		}),
		circuitOpens:   newCounter("circuit_opens_total", "Times the store circuit breaker opened."),
		requests:       newCounterVec("requests_total", "Responses by route and status code.", "route", "code"),
		upstreamErrors: newCounterVec("upstream_errors_total", "Proxied requests that failed, by route and kind (timeout, unreachable, client_body).", "route", "kind"),
		rejected:       newCounterVec("rejected_total", "Requests refused before any limit was checked, by reason.", "reason"),
		reloads:        newCounterVec("config_reloads_total", "Configuration reloads by result (ok, failed).", "result"),
	}
	reg.MustRegister(m.decisions, m.storeUnavailable, m.failOpen, m.failClosed, m.checkLatency,
		m.circuitState, m.circuitOpens, m.requests, m.upstreamErrors, m.rejected, m.reloads)
	m.sharedOK = m.checkLatency.WithLabelValues("shared", "ok")
	m.localOK = m.checkLatency.WithLabelValues("local", "ok")
	for _, r := range []string{"error", "timeout", "caller_deadline", "circuit_open"} {
		m.storeUnavailable.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "failed"} {
		m.reloads.WithLabelValues(r)
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

// newCounterVec is the gateway's counter name (under ns) with labels.
func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
}

// newCounter is the gateway's counter name (under ns), without labels.
func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help})
}
