package analytics

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Config holds the detectors' thresholds and the alert settings. The zero
// value of a field means its default (given in the field's comment);
// Validate applies them before it checks, and reports every problem.
type Config struct {
	// Interval is how often the detectors and alerts run. Default 5s.
	Interval time.Duration `yaml:"interval"`
	// StaleAfter is how old the newest data may be for a run to act on it.
	// On staler data a run keeps the directives as they are (they expire
	// on their own) and resolves no alert. Default 2m: a consumer that
	// commits every second is never that far behind unless it is stuck.
	StaleAfter time.Duration `yaml:"stale_after"`
	// Hot configures hot-key detection and split directives.
	Hot HotConfig `yaml:"hot"`
	// NAT configures NAT-shared IP detection and NAT directives.
	NAT NATConfig `yaml:"nat"`
	// Alerts configures the fleet-wide alerts.
	Alerts AlertConfig `yaml:"alerts"`
}

// HotConfig says when a key is hot and how its split is sized. A key is hot
// when its request rate over Window reaches MinRate, or when it carries at
// least MinShare of all traffic while its rate reaches ShareMinRate.
type HotConfig struct {
	// Disabled turns hot-key detection and splits off.
	Disabled bool `yaml:"disabled"`
	// Window is how far back the request rate is measured. The rollups are
	// per minute, so the rate covers the minute holding now-Window up to
	// now. Default 1m.
	Window time.Duration `yaml:"window"`
	// MinSpan is the recent span a key's rate is also measured over, to
	// the second (the rollups have minutes): a key is hot when its rate
	// over the window or over the last MinSpan reaches the threshold, so a
	// key that turns hot is found within seconds. At most Window.
	// Default 15s.
	MinSpan time.Duration `yaml:"min_span"`
	// MinRate is the request rate (per second) that makes a key hot on its
	// own. Default 100.
	MinRate float64 `yaml:"min_rate"`
	// MinShare is the share of all traffic (0..1] that makes a key hot; a
	// negative value turns the share test off. Default 0.2.
	MinShare float64 `yaml:"min_share"`
	// ShareMinRate is the rate (per second) a key needs before MinShare
	// applies, so a quiet fleet does not split its few keys. Default 10.
	ShareMinRate float64 `yaml:"share_min_rate"`
	// CoolRatio keeps a key that is already split hot until its rate falls
	// below CoolRatio × the threshold it crossed, so a key hovering at the
	// threshold does not flap. Default 0.5.
	CoolRatio float64 `yaml:"cool_ratio"`
	// MinGateways is how many gateways must carry a key before it is
	// split: a key seen by one gateway gains nothing. Default 2.
	MinGateways int `yaml:"min_gateways"`
	// MinGatewayShare is the floor of each gateway's share, so a gateway
	// that saw little of the key is not starved when load shifts.
	// Default 0.05.
	MinGatewayShare float64 `yaml:"min_gateway_share"`
	// TTL is how long a split lives after the run that last saw the key
	// hot; every run refreshes it. Default 2m.
	TTL time.Duration `yaml:"ttl"`
	// MaxKeys caps the split directives, hottest first. Default 100.
	MaxKeys int `yaml:"max_keys"`
}

// NATConfig says when an IP is NAT-shared and how far its anonymous limit is
// raised. An IP is flagged when, over Window, it carries at least
// MinDistinctKeys distinct keys or MinDistinctUserAgents distinct user
// agents, and at least MinRequests requests.
type NATConfig struct {
	// Disabled turns NAT detection and directives off.
	Disabled bool `yaml:"disabled"`
	// Window is how far back distinct keys and user agents are counted.
	// Default 10m.
	Window time.Duration `yaml:"window"`
	// MinDistinctKeys flags an IP carrying this many distinct keys; a
	// negative value turns the test off. Default 10.
	MinDistinctKeys int64 `yaml:"min_distinct_keys"`
	// MinDistinctUserAgents flags an IP carrying this many distinct user
	// agents; a negative value turns the test off. Default 20.
	MinDistinctUserAgents int64 `yaml:"min_distinct_user_agents"`
	// MinRequests is the least traffic a flagged IP must carry. Default 100.
	MinRequests int64 `yaml:"min_requests"`
	// PerClient is the factor each estimated client adds: factor =
	// max(1, clients × PerClient), at most MaxFactor. Default 0.5 (not
	// every client behind a NAT is anonymous at once).
	PerClient float64 `yaml:"per_client"`
	// MaxFactor bounds the raise. Default 50; at most 1000.
	MaxFactor float64 `yaml:"max_factor"`
	// UserAgentMaxFactor bounds the raise of an IP flagged on user agents
	// alone (fewer than MinDistinctKeys authenticated keys): one client can
	// rotate its User-Agent at will. Default 2; at least 1, at most 1000.
	UserAgentMaxFactor float64 `yaml:"user_agent_max_factor"`
	// CoolRatio keeps a flagged IP flagged until its evidence falls below
	// CoolRatio × the thresholds. Default 0.5.
	CoolRatio float64 `yaml:"cool_ratio"`
	// TTL is how long a NAT directive lives after the run that last
	// flagged the IP. Default 15m.
	TTL time.Duration `yaml:"ttl"`
	// MaxIPs caps the NAT directives, most clients first. Default 1000.
	MaxIPs int `yaml:"max_ips"`
}

// AlertConfig says when fleet-wide store trouble alerts and where alerts go.
type AlertConfig struct {
	// Disabled turns alert evaluation off.
	Disabled bool `yaml:"disabled"`
	// Window is how far back the ratios are measured. Default 2m.
	Window time.Duration `yaml:"window"`
	// StoreUnavailableRatio fires EdgelimitFleetStoreUnavailable when this
	// share of decisions found the store unavailable or timed out.
	// Default 0.05.
	StoreUnavailableRatio float64 `yaml:"store_unavailable_ratio"`
	// FailOpenRatio fires EdgelimitFleetFailOpen when this share of
	// decisions failed open. Default 0.01.
	FailOpenRatio float64 `yaml:"fail_open_ratio"`
	// FailClosedRatio fires EdgelimitFleetFailClosed when this share of
	// decisions failed closed. Default 0.01.
	FailClosedRatio float64 `yaml:"fail_closed_ratio"`
	// MinRequests is the least traffic in Window for any alert to fire.
	// Default 100.
	MinRequests int64 `yaml:"min_requests"`
	// ResendInterval is how often a firing alert is re-posted to
	// Alertmanager, which forgets alerts that are not refreshed. A firing
	// alert's endsAt is 4 × ResendInterval ahead, so it resolves by itself
	// if analytics stops. Default 1m.
	ResendInterval time.Duration `yaml:"resend_interval"`
	// AlertmanagerURL is Alertmanager's base URL (alerts go to
	// /api/v2/alerts). Empty: not used.
	AlertmanagerURL string `yaml:"alertmanager_url"`
	// WebhookURL receives a JSON POST on every firing and resolved
	// transition. Empty: not used. It may carry a token in its path, so
	// cmd/analytics reads it as a secret of its own.
	WebhookURL string `yaml:"-"`
	// Labels are added to every alert (e.g. cluster).
	Labels map[string]string `yaml:"labels"`
	// GeneratorURL links alerts back to analytics' dashboard. Optional.
	GeneratorURL string `yaml:"generator_url"`
}

// Errors returned by Validate.
var (
	ErrBadWindow    = errors.New("analytics: bad window")
	ErrBadThreshold = errors.New("analytics: bad threshold")
	ErrBadURL       = errors.New("analytics: bad url")
)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	setDefault(&c.Interval, 5*time.Second)
	setDefault(&c.StaleAfter, 2*time.Minute)
	h := &c.Hot
	setDefault(&h.Window, time.Minute)
	setDefault(&h.MinSpan, min(15*time.Second, h.Window))
	setDefault(&h.MinRate, 100)
	setDefault(&h.MinShare, 0.2)
	setDefault(&h.ShareMinRate, 10)
	setDefault(&h.CoolRatio, 0.5)
	setDefault(&h.MinGateways, 2)
	setDefault(&h.MinGatewayShare, 0.05)
	setDefault(&h.TTL, 2*time.Minute)
	setDefault(&h.MaxKeys, 100)
	n := &c.NAT
	setDefault(&n.Window, 10*time.Minute)
	setDefault(&n.MinDistinctKeys, 10)
	setDefault(&n.MinDistinctUserAgents, 20)
	setDefault(&n.MinRequests, 100)
	setDefault(&n.PerClient, 0.5)
	setDefault(&n.MaxFactor, 50)
	setDefault(&n.UserAgentMaxFactor, 2)
	setDefault(&n.CoolRatio, 0.5)
	setDefault(&n.TTL, 15*time.Minute)
	setDefault(&n.MaxIPs, 1000)
	a := &c.Alerts
	setDefault(&a.Window, 2*time.Minute)
	setDefault(&a.StoreUnavailableRatio, 0.05)
	setDefault(&a.FailOpenRatio, 0.01)
	setDefault(&a.FailClosedRatio, 0.01)
	setDefault(&a.MinRequests, 100)
	setDefault(&a.ResendInterval, time.Minute)
	return c
}

// setDefault sets *p to v when *p is its type's zero value, which means
// "the default" in every Config field.
func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate reports every problem that keeps the detectors from running,
// joined, after applying the defaults (so a zero Config is valid).
func (c Config) Validate() error {
	c = c.WithDefaults()
	return errors.Join(
		bad(c.Interval < 100*time.Millisecond, ErrBadWindow, "interval %v, want at least 100ms", c.Interval),
		c.Hot.validate(), c.NAT.validate(), c.Alerts.validate(),
	)
}

// The bounds are written as !(in range), so that a NaN (YAML's .nan) is
// out of every range rather than in all of them.
func (h HotConfig) validate() error {
	return errors.Join(
		bad(h.Window < time.Second || h.Window > 24*time.Hour, ErrBadWindow, "hot window %v outside [1s, 24h]", h.Window),
		bad(h.MinSpan < time.Second || h.MinSpan > h.Window, ErrBadWindow, "hot min span %v outside [1s, window %v]", h.MinSpan, h.Window),
		bad(h.TTL < time.Second, ErrBadWindow, "hot ttl %v under 1s", h.TTL),
		bad(!(h.MinRate > 0), ErrBadThreshold, "hot min rate %v must be positive", h.MinRate),
		bad(!(h.MinShare <= 1), ErrBadThreshold, "hot min share %v outside [0, 1]", h.MinShare),
		bad(!(h.ShareMinRate >= 0), ErrBadThreshold, "hot share min rate %v negative", h.ShareMinRate),
		bad(!(h.CoolRatio > 0 && h.CoolRatio <= 1), ErrBadThreshold, "hot cool ratio %v outside (0, 1]", h.CoolRatio),
		bad(h.MinGateways < 1, ErrBadThreshold, "hot min gateways %d under 1", h.MinGateways),
		bad(!(h.MinGatewayShare > 0 && h.MinGatewayShare <= 0.5), ErrBadThreshold, "min gateway share %v outside (0, 0.5]", h.MinGatewayShare),
		bad(h.MaxKeys < 1, ErrBadThreshold, "hot max keys %d under 1", h.MaxKeys),
	)
}

func (n NATConfig) validate() error {
	return errors.Join(
		bad(n.Window < time.Second || n.Window > 24*time.Hour, ErrBadWindow, "nat window %v outside [1s, 24h]", n.Window),
		bad(n.TTL < time.Second, ErrBadWindow, "nat ttl %v under 1s", n.TTL),
		bad(n.MinDistinctKeys <= 0 && n.MinDistinctUserAgents <= 0, ErrBadThreshold, "nat needs min distinct keys or min distinct user agents"),
		bad(n.MinRequests < 0, ErrBadThreshold, "nat min requests %d negative", n.MinRequests),
		bad(!(n.PerClient > 0), ErrBadThreshold, "nat per-client factor %v must be positive", n.PerClient),
		bad(!(n.MaxFactor >= 1 && n.MaxFactor <= 1000), ErrBadThreshold, "nat max factor %v outside [1, 1000]", n.MaxFactor),
		// A raise under 1 is no directive the gateways take: one such IP
		// would fail the write of every NAT directive, run after run.
		bad(!(n.UserAgentMaxFactor >= 1 && n.UserAgentMaxFactor <= 1000), ErrBadThreshold,
			"nat user agent max factor %v outside [1, 1000]", n.UserAgentMaxFactor),
		bad(!(n.CoolRatio > 0 && n.CoolRatio <= 1), ErrBadThreshold, "nat cool ratio %v outside (0, 1]", n.CoolRatio),
		bad(n.MaxIPs < 1, ErrBadThreshold, "nat max ips %d under 1", n.MaxIPs),
	)
}

func (a AlertConfig) validate() error {
	errs := []error{
		bad(a.Window < time.Second || a.Window > 24*time.Hour, ErrBadWindow, "alert window %v outside [1s, 24h]", a.Window),
		bad(a.ResendInterval < time.Second, ErrBadWindow, "alert resend interval %v under 1s", a.ResendInterval),
	}
	for name, r := range map[string]float64{
		"store unavailable": a.StoreUnavailableRatio,
		"fail open":         a.FailOpenRatio,
		"fail closed":       a.FailClosedRatio,
	} {
		if !(r > 0 && r <= 1) {
			errs = append(errs, fmt.Errorf("%w: %s ratio %v outside (0, 1]", ErrBadThreshold, name, r))
		}
	}
	errs = append(errs, bad(a.MinRequests < 0, ErrBadThreshold, "alert min requests %d negative", a.MinRequests))
	for name, u := range map[string]string{"alertmanager": a.AlertmanagerURL, "webhook": a.WebhookURL} {
		if u == "" {
			continue
		}
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			shown := RedactURL(u)
			if name == "webhook" && err == nil {
				// Its path may be the token (a chat service's hook URL).
				shown = p.Scheme + "://" + p.Host
			}
			errs = append(errs, fmt.Errorf("%w: %s url %q: want http(s)://host[:port]/...", ErrBadURL, name, shown))
		}
	}
	return errors.Join(errs...)
}

// RedactURL is raw as it may be printed or logged: the password of its
// user info and every query and fragment value (?token=…, by whatever
// name) as xxxxx; a URL too malformed to parse is not shown at all.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable, not shown: it may hold a password)"
	}
	if u.RawQuery != "" {
		q := u.Query() // pairs it cannot read are dropped: never shown
		for k := range q {
			q[k] = []string{"xxxxx"}
		}
		u.RawQuery = q.Encode()
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = "xxxxx", ""
	}
	return u.Redacted()
}

// bad is the error "kind: format" when cond holds, else nil (which
// errors.Join drops).
func bad(cond bool, kind error, format string, args ...any) error {
	if !cond {
		return nil
	}
	return fmt.Errorf("%w: "+format, append([]any{kind}, args...)...)
}
