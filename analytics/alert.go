package analytics

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GatewayHealth is one gateway's decisions over a window (or one minute),
// from the per-gateway rollup.
type GatewayHealth struct {
	Minute           time.Time `json:"minute,omitzero"`
	Gateway          string    `json:"gateway"`
	Requests         int64     `json:"requests"`
	Denied           int64     `json:"denied"`
	StoreOK          int64     `json:"store_ok"`
	StoreUnavailable int64     `json:"store_unavailable"`
	StoreTimeout     int64     `json:"store_timeout"`
	StoreLocalCache  int64     `json:"store_local_cache"`
	FailOpen         int64     `json:"fail_open"`
	FailClosed       int64     `json:"fail_closed"`
	LocalFallback    int64     `json:"local_fallback"`
	// Check latency quantiles and maximum, in microseconds.
	LatencyP50 float64 `json:"latency_p50_us"`
	LatencyP90 float64 `json:"latency_p90_us"`
	LatencyP99 float64 `json:"latency_p99_us"`
	LatencyMax float64 `json:"latency_max_us"`
}

// Alert names posted by analytics. They differ from the Prometheus rules'
// (EdgelimitStoreUnavailable, ...) because they look at the whole fleet's
// events, not one gateway's counters.
const (
	AlertStoreUnavailable = "EdgelimitFleetStoreUnavailable"
	AlertFailOpen         = "EdgelimitFleetFailOpen"
	AlertFailClosed       = "EdgelimitFleetFailClosed"
)

// RunbookURL is the runbook section of the alert named name, posted as its
// runbook_url annotation (the Prometheus rules' convention): the section of
// docs/runbook.md whose heading is the name.
func RunbookURL(name string) string {
	return "https://github.com/edgelimit/edgelimit/blob/main/docs/runbook.md#" + strings.ToLower(name)
}

// Alert is one alert's evaluation: firing or not, with its evidence.
type Alert struct {
	Name     string `json:"name"`
	Severity string `json:"severity"`
	Firing   bool   `json:"firing"`
	// Ratio is the share of decisions in the window with the condition;
	// Threshold is the ratio at which it fires.
	Ratio     float64 `json:"ratio"`
	Threshold float64 `json:"threshold"`
	// Count is the decisions with the condition; Requests all decisions.
	Count    int64 `json:"count"`
	Requests int64 `json:"requests"`
	// Gateways are the gateways over the threshold, worst first.
	Gateways    []string `json:"gateways"`
	Summary     string   `json:"summary"`
	Description string   `json:"description"`
	Runbook     string   `json:"runbook"`
}

// EvaluateAlerts evaluates the fleet-wide alerts over gateways' health in
// one window. Every alert is returned, firing or not; none fires on less
// traffic than cfg.MinRequests.
func EvaluateAlerts(cfg AlertConfig, gateways []GatewayHealth) []Alert {
	if cfg.Disabled {
		return nil
	}
	var total int64
	for _, g := range gateways {
		total += g.Requests
	}
	defs := []struct {
		name, what, runbook string
		threshold           float64
		count               func(GatewayHealth) int64
	}{
		{AlertStoreUnavailable, "found the rate-limit store unavailable or timed out",
			"Check Redis (PING, INFO, SLOWLOG, failovers) and the network from the gateways; GET /api/store-health lists the gateways affected; failure policies decide what callers see meanwhile.",
			cfg.StoreUnavailableRatio, func(g GatewayHealth) int64 { return g.StoreUnavailable + g.StoreTimeout }},
		{AlertFailOpen, "failed open (allowed unchecked)",
			"Limits are not enforced: restore the store first; if it stays down and upstreams suffer, switch the affected rules to failure_policy local or closed.",
			cfg.FailOpenRatio, func(g GatewayHealth) int64 { return g.FailOpen }},
		{AlertFailClosed, "failed closed (refused with 503)",
			"Callers are refused: restore the store first; for a long outage consider failure_policy local for the affected rules.",
			cfg.FailClosedRatio, func(g GatewayHealth) int64 { return g.FailClosed }},
	}
	out := make([]Alert, 0, len(defs))
	for _, d := range defs {
		a := Alert{Name: d.name, Severity: "critical", Threshold: d.threshold, Requests: total, Runbook: d.runbook}
		type bad struct {
			gw    string
			ratio float64
		}
		var worst []bad
		for _, g := range gateways {
			c := d.count(g)
			a.Count += c
			if r := ratio(c, g.Requests); g.Requests > 0 && r >= d.threshold {
				worst = append(worst, bad{g.Gateway, r})
			}
		}
		a.Ratio = ratio(a.Count, total)
		a.Firing = total >= max(1, cfg.MinRequests) && a.Ratio >= d.threshold
		slices.SortFunc(worst, func(x, y bad) int { return cmp.Or(cmp.Compare(y.ratio, x.ratio), cmp.Compare(x.gw, y.gw)) })
		for _, w := range worst {
			a.Gateways = append(a.Gateways, w.gw)
		}
		a.Summary = fmt.Sprintf("%.1f%% of the fleet's decisions %s", 100*a.Ratio, d.what)
		a.Description = fmt.Sprintf("%d of %d decisions in the window %s (threshold %.1f%%); gateways over the threshold: %s.",
			a.Count, a.Requests, d.what, 100*d.threshold, gatewayList(a.Gateways))
		out = append(out, a)
	}
	return out
}

func gatewayList(gws []string) string {
	switch {
	case len(gws) == 0:
		return "none"
	case len(gws) > 10:
		return strings.Join(gws[:10], ", ") + " and " + strconv.Itoa(len(gws)-10) + " more"
	}
	return strings.Join(gws, ", ")
}

// Alerter posts alert transitions to Alertmanager and/or a webhook,
// deduplicated: Alertmanager gets a firing alert when it starts and again
// every ResendInterval (it forgets alerts that are not refreshed, and
// merges repeats by their labels), and once more when it resolves; the
// webhook gets each transition, firing or resolved, once. A post that fails
// is retried on the next Process.
type Alerter struct {
	cfg    AlertConfig
	client *http.Client
	now    func() time.Time

	mu    sync.Mutex
	state map[string]*alertState
}

type alertState struct {
	alert      Alert
	startsAt   time.Time
	resolvedAt time.Time // zero while firing
	amSent     time.Time // last accepted Alertmanager post of this status
	hookSent   bool      // the webhook accepted this status
}

// NewAlerter returns an alerter posting with client (http.DefaultClient if
// nil) and reading time from now (time.Now if nil).
func NewAlerter(cfg AlertConfig, client *http.Client, now func() time.Time) *Alerter {
	if client == nil {
		client = http.DefaultClient
	}
	if now == nil {
		now = time.Now
	}
	return &Alerter{cfg: cfg, client: client, now: now, state: make(map[string]*alertState)}
}

// Firing returns the alerts firing now, by name.
func (a *Alerter) Firing() []Alert {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Alert
	for _, name := range slices.Sorted(maps.Keys(a.state)) {
		if st := a.state[name]; st.resolvedAt.IsZero() {
			out = append(out, st.alert)
		}
	}
	return out
}

// firingOrNil is Firing for a possibly nil alerter.
func (a *Alerter) firingOrNil() []Alert {
	if a == nil {
		return nil
	}
	return a.Firing()
}

// Process takes one evaluation's alerts and posts what changed. It returns
// the posts' errors, joined; the alerts' state advances regardless.
func (a *Alerter) Process(ctx context.Context, alerts []Alert) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	am, hook := a.cfg.AlertmanagerURL != "", a.cfg.WebhookURL != ""
	var toAM, toHook []*alertState
	for _, al := range alerts {
		st := a.state[al.Name]
		if al.Firing {
			if st == nil || !st.resolvedAt.IsZero() {
				st = &alertState{startsAt: now}
				a.state[al.Name] = st
			}
			st.alert = al
		} else {
			if st == nil {
				continue
			}
			if st.resolvedAt.IsZero() {
				st.resolvedAt, st.amSent, st.hookSent = now, time.Time{}, false
			}
		}
		resend := st.resolvedAt.IsZero() && now.Sub(st.amSent) >= a.cfg.ResendInterval
		if am && (st.amSent.IsZero() || resend) {
			toAM = append(toAM, st)
		}
		if hook && !st.hookSent {
			toHook = append(toHook, st)
		}
	}
	var errs []error
	if len(toAM) > 0 {
		if err := a.post(ctx, AlertmanagerAPI(a.cfg.AlertmanagerURL, "alerts"), a.amBody(toAM, now)); err != nil {
			errs = append(errs, fmt.Errorf("post alerts to alertmanager: %w", err))
		} else {
			for _, st := range toAM {
				st.amSent = now
			}
		}
	}
	if len(toHook) > 0 {
		if err := a.post(ctx, a.cfg.WebhookURL, a.hookBody(toHook, now)); err != nil {
			errs = append(errs, fmt.Errorf("post alerts to webhook: %w", err))
		} else {
			for _, st := range toHook {
				st.hookSent = true
			}
		}
	}
	for name, st := range a.state {
		if !st.resolvedAt.IsZero() && (!am || !st.amSent.IsZero()) && (!hook || st.hookSent) {
			delete(a.state, name)
		}
	}
	return errors.Join(errs...)
}

// AlertmanagerAPI is the URL of Alertmanager's API v2 endpoint (alerts,
// status) under base, base's query kept: appended to the text, the path
// would land inside a query (?token=…/api/v2/alerts).
func AlertmanagerAPI(base, endpoint string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base // Validate refuses it
	}
	return u.JoinPath("api", "v2", endpoint).String()
}

// postableAlert is Alertmanager's API v2 alert (POST /api/v2/alerts).
type postableAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

func (a *Alerter) postable(st *alertState, now time.Time) postableAlert {
	labels := map[string]string{}
	maps.Copy(labels, a.cfg.Labels)
	labels["alertname"] = st.alert.Name
	labels["severity"] = st.alert.Severity
	labels["source"] = "edgelimit-analytics"
	ends := now.Add(4 * a.cfg.ResendInterval)
	if !st.resolvedAt.IsZero() {
		ends = st.resolvedAt
	}
	return postableAlert{
		Labels: labels,
		Annotations: map[string]string{
			"summary":     st.alert.Summary,
			"description": st.alert.Description,
			"runbook":     st.alert.Runbook,
			"runbook_url": RunbookURL(st.alert.Name),
			"value":       strconv.FormatFloat(st.alert.Ratio, 'f', 4, 64),
		},
		StartsAt:     st.startsAt.UTC(),
		EndsAt:       ends.UTC(),
		GeneratorURL: a.cfg.GeneratorURL,
	}
}

func (a *Alerter) amBody(sts []*alertState, now time.Time) any {
	out := make([]postableAlert, 0, len(sts))
	for _, st := range sts {
		out = append(out, a.postable(st, now))
	}
	return out
}

// WebhookMessage is what the webhook receives: the shape of Alertmanager's
// own webhook notifications (version 4), so receivers written for those
// read it too.
type WebhookMessage struct {
	Version  string         `json:"version"`
	Status   string         `json:"status"`
	Receiver string         `json:"receiver"`
	Alerts   []WebhookAlert `json:"alerts"`
}

// WebhookAlert is one alert in a WebhookMessage.
type WebhookAlert struct {
	Status       string            `json:"status"`
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

func (a *Alerter) hookBody(sts []*alertState, now time.Time) any {
	m := WebhookMessage{Version: "4", Status: "resolved", Receiver: "edgelimit-analytics"}
	for _, st := range sts {
		p := a.postable(st, now)
		status := "resolved"
		if st.resolvedAt.IsZero() {
			status, m.Status = "firing", "firing"
			p.EndsAt = time.Time{}
		}
		m.Alerts = append(m.Alerts, WebhookAlert{
			Status: status, Labels: p.Labels, Annotations: p.Annotations,
			StartsAt: p.StartsAt, EndsAt: p.EndsAt, GeneratorURL: p.GeneratorURL,
		})
	}
	return m
}

func (a *Alerter) post(ctx context.Context, target string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b))
	if err != nil {
		// Not err: it quotes the URL. Validate refused such a URL anyway.
		return errors.New("not a valid URL")
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// Its text repeats the URL whole, and the error is logged:
			// the webhook's path and either URL's query may hold a token.
			err = fmt.Errorf("%s %s://%s: %w", ue.Op, req.URL.Scheme, req.URL.Host, ue.Err)
		}
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
