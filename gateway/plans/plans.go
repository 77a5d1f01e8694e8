// Package plans holds what a gateway configuration says about limits:
// plans of rules, their failure policies, API keys with their overrides,
// and routes. The gateway enforces them; the what-if and usage statements
// read them from the same file, without the HTTP server.
package plans

import (
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// FailurePolicy says what a rule does while the shared store is unavailable.
type FailurePolicy string

// Failure policies.
const (
	// FailOpen allows the request and counts it as fail-open.
	FailOpen FailurePolicy = "open"
	// FailClosed answers 503 with a Retry-After.
	FailClosed FailurePolicy = "closed"
	// FailLocal enforces this gateway's share of the limit (limit ÷
	// the gateway's expected_gateways) in memory until the store returns.
	FailLocal FailurePolicy = "local"
)

// DefaultTunnelMaxDuration bounds an upgraded connection's lifetime.
const DefaultTunnelMaxDuration = time.Hour

// Plan is a named list of rules.
type Plan struct {
	Rules []Rule `yaml:"rules"`
}

// Rule is one limit of a plan: the limiter's rule (name, limit, period,
// burst, algorithm, shadow; see limiter.Rule) and what to do when the
// shared store cannot check it.
type Rule struct {
	limiter.Rule `yaml:",inline"`
	// FailurePolicy overrides the gateway's failure_policy for this rule.
	FailurePolicy FailurePolicy `yaml:"failure_policy"`
	// Unit is what the rule counts: requests (the default: each request
	// its route's cost) or tokens (a token budget: on a route with a
	// Tokens setting, each request reserves tokens before it is proxied
	// and settles what its answer used after; other routes leave the rule
	// out of their checks).
	Unit Unit `yaml:"unit"`
	// InFlight, when set, makes the rule admit at most this many requests
	// of a key at once across every gateway, instead of a rate (it has no
	// limit or period then): a request holds a slot until its answer
	// ends, streams and upgraded connections included.
	InFlight int64 `yaml:"in_flight"`
	// Lease is how long an in-flight slot outlives a gateway that died
	// holding it: a live gateway renews its slots every Lease/3; default
	// DefaultLease.
	Lease time.Duration `yaml:"lease"`
}

// DefaultLease is an in-flight rule's default Lease.
const DefaultLease = 30 * time.Second

// Limiter is the rule as the limiter checks it: an in-flight rule's
// limit is InFlight and its period the lease.
func (r Rule) Limiter() limiter.Rule {
	lr := r.Rule
	if r.InFlight != 0 {
		lr.Algorithm, lr.Limit, lr.Period = limiter.InFlight, r.InFlight, r.Lease
		if lr.Period == 0 {
			lr.Period = DefaultLease
		}
	}
	return lr
}

// Unit is what a rule counts.
type Unit string

// Units.
const (
	UnitRequests Unit = "requests"
	UnitTokens   Unit = "tokens"
)

// Tokens says how a route's requests are charged to the token rules of
// the caller's plan (see Rule.Unit): reserved before the request is
// proxied, checked with every other rule in the one atomic call, then
// settled by what the answer says it used.
type Tokens struct {
	Reserve Reserve `yaml:"reserve"`
	Settle  Settle  `yaml:"settle"`
	// Unsettled is what a request is charged when its settlement has no
	// usage to go by (the upstream failed, the client went away before
	// the answer ended, the answer reported none): keep (the default:
	// the reservation stands) or refund (nothing: it is given back).
	Unsettled Unsettled `yaml:"unsettled"`
}

// Reserve says how many tokens a request reserves: the number the
// request names (a top-level field of its JSON body, or a header), else
// Default; at most Max.
type Reserve struct {
	// BodyField names a top-level number of the request's JSON body, e.g.
	// max_tokens. The body is then read before the decision.
	BodyField string `yaml:"body_field"`
	// Header names a request header holding the number.
	Header string `yaml:"header"`
	// Default is reserved when the request names no number (or one that
	// is no positive integer); 0 means Max.
	Default int64 `yaml:"default"`
	// BodyBytesPerToken, when set, adds the request body's size divided by
	// it (rounded up) to the reservation: an estimate of the prompt's
	// tokens, which the answer alone reports, so that a client leaving
	// before the usage arrives still pays for its prompt. The body is then
	// read before the decision.
	BodyBytesPerToken int64 `yaml:"body_bytes_per_token"`
	// Max is the most one request reserves: a larger number is reserved
	// at Max (and settled at what it used). Required; at most the
	// capacity of every token rule.
	Max int64 `yaml:"max"`
}

// Settle says where an answer reports the tokens it used: a response
// header or trailer, else a field of the OpenAI-style usage object (in
// a JSON body, or in an event of a text/event-stream answer: the last
// that carries one).
type Settle struct {
	Header string `yaml:"header"`
	// Usage names the usage object's field: default total_tokens (unless
	// Header is set and Usage is "-": the header alone).
	Usage string `yaml:"usage"`
}

// Unsettled is Tokens.Unsettled's rule.
type Unsettled string

// Unsettled rules.
const (
	UnsettledKeep   Unsettled = "keep"
	UnsettledRefund Unsettled = "refund"
)

// APIKey is a known API key. The file holds its SHA-256, never the key.
type APIKey struct {
	// ID names the key in the limiter's keys and, when set, in decision
	// events (key_name), so analysts see which customer a key is; default
	// the first 16 hex digits of SHA256, which events do not carry. It is
	// not secret.
	ID string `yaml:"id"`
	// SHA256 is the hex SHA-256 of the raw key.
	SHA256 string `yaml:"sha256"`
	// Plan limits the key.
	Plan string `yaml:"plan"`
	// Overrides replace parts of the plan's rules for this key, by rule name.
	Overrides map[string]Override `yaml:"overrides"`
}

// Override changes one rule of a plan for one key; zero fields keep the
// plan's value.
type Override struct {
	Limit  int64         `yaml:"limit"`
	Period time.Duration `yaml:"period"`
	Burst  int64         `yaml:"burst"`
}

// Apply is r with o's non-zero fields in place of its own.
func (o Override) Apply(r Rule) Rule {
	if o.Limit != 0 && r.InFlight != 0 {
		r.InFlight = o.Limit
	} else if o.Limit != 0 {
		r.Limit = o.Limit
	}
	if o.Period != 0 {
		r.Period = o.Period
	}
	if o.Burst != 0 {
		r.Burst = o.Burst
	}
	return r
}

// Route sends matching requests to an upstream.
type Route struct {
	// Name labels the route in metrics and events; default PathPrefix.
	Name string `yaml:"name"`
	// PathPrefix matches whole path segments: "/v1/users" matches
	// "/v1/users" and "/v1/users/7" but not "/v1/users2"; a prefix ending
	// in "/" matches anything below it.
	PathPrefix string `yaml:"path_prefix"`
	// Methods restricts the route; default any method but TRACE and
	// TRACK, which get 405 unless the route lists them.
	Methods []string `yaml:"methods"`
	// Upstream names an entry of the gateway's upstreams.
	Upstream string `yaml:"upstream"`
	// Plan, when set, limits every caller of this route by this plan, in a
	// bucket of its own per caller and route, instead of the caller's plan.
	Plan string `yaml:"plan"`
	// Cost is how many units one request uses; default 1.
	Cost int64 `yaml:"cost"`
	// Exempt routes are proxied without any limit check (no limiter call,
	// no rate-limit headers, no event), e.g. health checks.
	Exempt bool `yaml:"exempt"`
	// Upgrades are the protocols a request may switch to ("Connection:
	// upgrade" with "Upgrade: websocket"), e.g. [websocket]; default none:
	// such a request gets 400. A tunnel is charged once, as one request of
	// the route's cost, and is closed after TunnelMaxDuration.
	Upgrades []string `yaml:"upgrades"`
	// TunnelMaxDuration bounds the lifetime of an upgraded connection;
	// default DefaultTunnelMaxDuration (1h). The listener's read and write
	// timeouts do not apply to a tunnel.
	TunnelMaxDuration time.Duration `yaml:"tunnel_max_duration"`
	// Tokens, when set, makes the route charge the token rules of the
	// caller's plan: reserved before the request, settled after its
	// answer (see Tokens).
	Tokens *Tokens `yaml:"tokens"`
	// ReadIdle and WriteIdle replace timeouts.read and timeouts.write, the
	// idle bounds of a proxied exchange, for this route: e.g. a longer
	// write bound for a stream whose events come minutes apart, a shorter
	// read bound for an upload endpoint. Zero: the listener's.
	ReadIdle  time.Duration `yaml:"read_idle"`
	WriteIdle time.Duration `yaml:"write_idle"`
}

// WithDefaults is r with its defaults: named by its prefix, a cost of 1,
// tunnels bounded by DefaultTunnelMaxDuration.
func (r Route) WithDefaults() Route {
	if r.Name == "" {
		r.Name = r.PathPrefix
	}
	if r.Cost == 0 {
		r.Cost = 1
	}
	if r.TunnelMaxDuration == 0 {
		r.TunnelMaxDuration = DefaultTunnelMaxDuration
	}
	return r
}
