package envoyrls

import (
	"errors"
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/limiter"
)

// ErrInvalidConfig wraps every problem Config.Validate reports.
var ErrInvalidConfig = errors.New("invalid grpc config")

// Overrides says what becomes of a request's own limit
// (RateLimitDescriptor.limit).
type Overrides string

// Override policies.
const (
	// OverridesHonor checks the descriptor at the request's limit, as
	// envoyproxy/ratelimit does.
	OverridesHonor Overrides = "honor"
	// OverridesIgnore checks it at the configured limit, if any: the
	// limits are the rate limit service's to set, not the proxy's.
	OverridesIgnore Overrides = "ignore"
	// OverridesReject answers INVALID_ARGUMENT.
	OverridesReject Overrides = "reject"
)

// Undecidable says what a request the service cannot decide as sent gets.
type Undecidable string

// Answers to an undecidable request.
const (
	// UndecidableOverLimit answers OVER_LIMIT, counted in the metrics and
	// a decision event, so Envoy refuses it whatever its
	// failure_mode_deny.
	UndecidableOverLimit Undecidable = "over_limit"
	// UndecidableError answers a gRPC error (INVALID_ARGUMENT,
	// RESOURCE_EXHAUSTED, INTERNAL) with the reason, as earlier versions
	// did; Envoy's default failure_mode_deny: false lets the request
	// through uncounted.
	UndecidableError Undecidable = "error"
)

// Config is the gRPC rate limit service's configuration (the `grpc:`
// section of cmd/gateway's file).
type Config struct {
	// Listen is the gRPC listener's address, e.g. ":8081"; empty (the
	// default) serves no gRPC. Restart.
	Listen string `yaml:"listen"`
	// ConfigDir holds envoyproxy/ratelimit's YAML files, as they are
	// (its RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config); needed with Listen.
	// Reloaded like the gateway's file (cmd/gateway: on SIGHUP and when
	// the files change).
	ConfigDir string `yaml:"config_dir"`
	// Algorithm turns each descriptor's rate_limit into a rule: token_bucket
	// (default: requests_per_unit per unit refilled continuously, burst =
	// requests_per_unit × BurstFactor) or sliding_window (at most
	// requests_per_unit in every epoch-aligned unit, weighted across the
	// window edge; the closest to ratelimit's fixed windows).
	Algorithm limiter.Algorithm `yaml:"algorithm"`
	// BurstFactor scales a token bucket's burst; default 1 (burst =
	// requests_per_unit). Below 1 smooths bursts, e.g. 0.1 lets a 600/min
	// descriptor take at most 60 at once.
	BurstFactor float64 `yaml:"burst_factor"`
	// FailurePolicy is what the descriptors' rules do while Redis is
	// unavailable: open, closed (OVER_LIMIT, so Envoy answers 429 whatever
	// its failure_mode_deny) or local; default the gateway's
	// failure_policy.
	FailurePolicy gateway.FailurePolicy `yaml:"failure_policy"`
	// LimitOverrides is what becomes of RateLimitDescriptor.limit; default
	// honor.
	LimitOverrides Overrides `yaml:"limit_overrides"`
	// Undecidable is what a request gets that the service cannot decide
	// as sent: more than MaxDescriptors descriptors, more than MaxEntries
	// entries in one, a message over MaxMessageBytes, or rules the
	// limiter refuses; default over_limit (or error).
	Undecidable Undecidable `yaml:"undecidable"`
	// ResponseHeaders: false leaves response_headers_to_add empty; default
	// true (the gateway's rate-limit headers, and Retry-After over the
	// limit).
	ResponseHeaders *bool `yaml:"response_headers"`
	// ProblemBody: false leaves raw_body empty; default true (over the
	// limit, the application/problem+json body of the HTTP door, which
	// Envoy sends as the 429's body, with its Content-Type).
	ProblemBody *bool `yaml:"problem_body"`
	// PreviousLayout also checks and charges each descriptor's bucket in
	// the key of its own that releases before shared caller containers
	// kept it in (limiter.Rule.WasTag): on while gateways of such a
	// release still serve the same Redis, so that none of them gives a
	// caller its limit a second time, then off (it costs a key a bucket
	// again). Default false.
	PreviousLayout bool `yaml:"previous_layout"`
	// ShadowMode decides and reports every descriptor but never answers
	// OVER_LIMIT, like ratelimit's SHADOW_MODE; default false.
	ShadowMode bool `yaml:"shadow_mode"`
	// TLS serves gRPC over TLS when CertFile and KeyFile are set. Restart.
	TLS TLS `yaml:"tls"`
	// MaxMessageBytes bounds a request message the service decides as
	// sent; a larger one is undecidable (see Undecidable); default 1 MiB.
	// Restart.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// MaxReceiveBytes bounds a request message the server reads at all,
	// at least MaxMessageBytes: one over it gets RESOURCE_EXHAUSTED from
	// the transport, which Envoy (failure_mode_deny: false) lets through,
	// so keep it above the largest request your Envoy can build (its
	// max_request_headers_kb times the descriptors of a route); default
	// 16 MiB, or MaxMessageBytes if larger. Each stream may hold one
	// message of this size until it is answered. Restart.
	MaxReceiveBytes int `yaml:"max_receive_bytes"`
	// MaxConcurrentStreams bounds streams per connection; default 1024.
	// Restart.
	MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`
	// Keepalive of the server's connections. Restart.
	Keepalive Keepalive `yaml:"keepalive"`
	// MaxConnections caps open gRPC connections; more are closed on
	// accept, so a flood of idle ones cannot take the descriptors the
	// traffic listener and the Redis and Kafka clients need; default 4096
	// (Envoy keeps one connection per worker). Restart.
	MaxConnections int `yaml:"max_connections"`
	// HandshakeTimeout closes a connection that has not finished TLS and
	// the HTTP/2 preface by then; default 10s (grpc-go's own is 120s, for
	// which an idle connection holds its slot). Restart.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// CallTimeout ends a call this long after its headers, if its own
	// deadline (Envoy's grpc-timeout, 20ms by default) has not already:
	// a client that never sends the rest of its request would otherwise
	// hold the call's goroutine and what it sent for as long as it
	// answers keepalive pings; default 10s. Restart.
	CallTimeout time.Duration `yaml:"call_timeout"`
}

// TLS names the server's certificate and key (PEM files).
type TLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// DefaultMaxConnections caps the gRPC listener's open connections.
const DefaultMaxConnections = 4096

// Keepalive tunes gRPC keepalive.
type Keepalive struct {
	// Time is how long a connection may be quiet before the server pings
	// it; default 30s.
	Time time.Duration `yaml:"time"`
	// Timeout is how long the server waits for the ping's answer before
	// closing; default 10s.
	Timeout time.Duration `yaml:"timeout"`
	// MinTime is the shortest interval at which clients may ping (faster
	// ones are closed with ENHANCE_YOUR_CALM); default 5s.
	MinTime time.Duration `yaml:"min_time"`
	// MaxConnectionIdle closes connections without calls for this long;
	// default 0 (never: Envoy keeps one connection per worker).
	MaxConnectionIdle time.Duration `yaml:"max_connection_idle"`
}

// Enabled reports whether the gRPC service is to be served.
func (c Config) Enabled() bool { return c.Listen != "" }

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Algorithm == "" {
		c.Algorithm = limiter.TokenBucket
	}
	if c.BurstFactor == 0 {
		c.BurstFactor = 1
	}
	if c.LimitOverrides == "" {
		c.LimitOverrides = OverridesHonor
	}
	if c.Undecidable == "" {
		c.Undecidable = UndecidableOverLimit
	}
	t := true
	if c.ResponseHeaders == nil {
		c.ResponseHeaders = &t
	}
	if c.ProblemBody == nil {
		c.ProblemBody = &t
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.MaxReceiveBytes == 0 {
		c.MaxReceiveBytes = max(16<<20, c.MaxMessageBytes)
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = 1024
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 10 * time.Second
	}
	if c.Keepalive.Time == 0 {
		c.Keepalive.Time = 30 * time.Second
	}
	if c.Keepalive.Timeout == 0 {
		c.Keepalive.Timeout = 10 * time.Second
	}
	if c.Keepalive.MinTime == 0 {
		c.Keepalive.MinTime = 5 * time.Second
	}
	return c
}

// Validate reports everything wrong with c, each problem naming its field
// under "grpc.", all wrapping ErrInvalidConfig. A disabled service is
// valid whatever else it says.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	c = c.WithDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: grpc.%s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	if c.ConfigDir == "" {
		bad("config_dir", "a directory of envoy ratelimit YAML files is needed with grpc.listen")
	}
	switch c.Algorithm {
	case limiter.TokenBucket, limiter.SlidingWindow:
	default:
		bad("algorithm", "%q is not %q or %q", c.Algorithm, limiter.TokenBucket, limiter.SlidingWindow)
	}
	if c.BurstFactor <= 0 || c.BurstFactor > 1000 {
		bad("burst_factor", "%v must be above 0 and at most 1000", c.BurstFactor)
	}
	switch c.FailurePolicy {
	case "", gateway.FailOpen, gateway.FailClosed, gateway.FailLocal:
	default:
		bad("failure_policy", "%q is not open, closed or local", c.FailurePolicy)
	}
	switch c.LimitOverrides {
	case OverridesHonor, OverridesIgnore, OverridesReject:
	default:
		bad("limit_overrides", "%q is not %q, %q or %q", c.LimitOverrides, OverridesHonor, OverridesIgnore, OverridesReject)
	}
	switch c.Undecidable {
	case UndecidableOverLimit, UndecidableError:
	default:
		bad("undecidable", "%q is not %q or %q", c.Undecidable, UndecidableOverLimit, UndecidableError)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls", "cert_file and key_file go together")
	}
	if c.MaxMessageBytes < 1024 {
		bad("max_message_bytes", "%d is below 1024", c.MaxMessageBytes)
	}
	if c.MaxReceiveBytes < c.MaxMessageBytes {
		bad("max_receive_bytes", "%d is below max_message_bytes (%d)", c.MaxReceiveBytes, c.MaxMessageBytes)
	}
	if c.MaxConnections < 1 {
		bad("max_connections", "%d is below 1", c.MaxConnections)
	}
	for field, d := range map[string]time.Duration{"handshake_timeout": c.HandshakeTimeout, "call_timeout": c.CallTimeout, "keepalive.time": c.Keepalive.Time, "keepalive.timeout": c.Keepalive.Timeout,
		"keepalive.min_time": c.Keepalive.MinTime, "keepalive.max_connection_idle": c.Keepalive.MaxConnectionIdle} {
		if d < 0 {
			bad(field, "%v is negative", d)
		}
	}
	return errors.Join(errs...)
}
