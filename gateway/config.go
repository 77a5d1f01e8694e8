package gateway

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/limiter"
)

// ErrInvalidConfig wraps every problem Validate reports.
var ErrInvalidConfig = errors.New("invalid gateway config")

// UnknownKey says what happens to a request with an API key the
// configuration does not know.
type UnknownKey string

// Unknown key actions.
const (
	// UnknownKeyReject answers 401.
	UnknownKeyReject UnknownKey = "reject"
	// UnknownKeyAnonymous ignores the key and limits the caller as anonymous.
	UnknownKeyAnonymous UnknownKey = "anonymous"
)

// ProxySecretHeader carries TrustedProxySecret from a trusted proxy.
const ProxySecretHeader = "X-Edgelimit-Proxy-Secret"

// Secret is a string that never prints: fmt, slog and YAML see "[redacted]".
type Secret string

// String redacts the secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// MarshalYAML redacts the secret when a configuration is printed.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// Config is the gateway's configuration. The YAML file of cmd/gateway maps
// onto it; every field can change on reload except the ones marked
// "restart".
type Config struct {
	// GatewayID names this instance in decision events; default the host name
	// (set by cmd). Restart.
	GatewayID string `yaml:"gateway_id"`
	// Listen is the traffic listener's address; default ":8080". Restart.
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz, /readyz (and pprof); default
	// "127.0.0.1:9090", loopback so it is not exposed by accident. Restart.
	AdminListen string `yaml:"admin_listen"`
	// Pprof serves /debug/pprof/ on the admin listener; default off. Restart.
	Pprof bool `yaml:"pprof"`
	// ReadyRequiresStore makes /readyz fail while the shared store does not
	// answer. Off by default: the store is shared, so an outage would take
	// every gateway out of its load balancer at once and no failure policy
	// (open, local) could answer. Turn it on where a gateway cut off from
	// Redis alone should hand its traffic to the others.
	ReadyRequiresStore bool `yaml:"ready_requires_store"`
	// CheckPath serves the decision API (POST); default "/v1/check"; "-"
	// disables it.
	CheckPath string `yaml:"check_path"`

	// Plans are named lists of rules.
	Plans map[string]Plan `yaml:"plans"`
	// AnonymousPlan limits callers identified by IP only. Empty means such
	// callers need an API key (401).
	AnonymousPlan string `yaml:"anonymous_plan"`
	// UserHeader carries a user id set by a trusted proxy, e.g. "X-User-ID";
	// empty disables user identity. Ignored from untrusted peers.
	UserHeader string `yaml:"user_header"`
	// UserPlan limits callers identified by UserHeader; default AnonymousPlan.
	UserPlan string `yaml:"user_plan"`
	// APIKeys are the known keys, by SHA-256.
	APIKeys []APIKey `yaml:"api_keys"`
	// UnknownKey is what happens to an unknown API key; default "reject" (401).
	UnknownKey UnknownKey `yaml:"unknown_key"`
	// AuthFailurePlan limits, by client address, requests that fail
	// authentication (an unknown API key, or none where one is needed)
	// before they get 401; over it they get 429, so keys cannot be guessed
	// at line rate. Requests refused before their decision (no route
	// matches: 404; a path, body, _method or upgrade the gateway will not
	// pass on: 400, 413) are charged to the same bucket, so routes cannot
	// be probed at line rate either. Default: the built-in plan
	// "auth-failure", DefaultAuthFailureRule (20 a minute per address);
	// "-" disables it.
	AuthFailurePlan string `yaml:"auth_failure_plan"`
	// IgnoreBearer stops reading API keys from "Authorization: Bearer", for
	// upstreams that use bearer tokens of their own; default false.
	IgnoreBearer bool `yaml:"ignore_bearer"`
	// APIKeyParams are the query parameters that carry an API key, for
	// upstreams that read one there as well as in X-API-Key (Kong's
	// key-auth does by default): a key the gateway did not read would be
	// charged to the client's address while the upstream served the key.
	// With bearer tokens read, RFC 6750's access_token parameter is read
	// too. Names match as PHP, Rack and ASP.NET read them: percent-decoded,
	// in any case, with '.', ' ' and '[' as '_'. Default
	// DefaultAPIKeyParams; ["-"] reads none.
	APIKeyParams []string `yaml:"api_key_params"`
	// TrustedProxies are CIDRs (or single IPs) of proxies whose
	// X-Forwarded-For and UserHeader are believed. Default none: the peer's
	// address is the client's.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// TrustedHops, when set, picks the client address by position: the
	// TrustedHops-th X-Forwarded-For entry from the right, for proxies
	// (e.g. a cloud load balancer) whose addresses are not known; like
	// Envoy's xff_num_trusted_hops. The peer's X-Forwarded-For,
	// X-Forwarded-Proto/Host and Forwarded are then kept and extended, but
	// it is not trusted with UserHeader or other identity headers: that
	// needs TrustedProxies. Default 0: the chain is walked through
	// TrustedProxies only.
	TrustedHops int `yaml:"trusted_hops"`
	// TrustedProxySecret, when set, is what a trusted proxy must also
	// prove: a peer inside TrustedProxies is believed only if its request
	// carries the secret in ProxySecretHeader. A CIDR alone lets every host
	// inside the range state any client address and user; the secret
	// narrows that to the proxies that hold it. The header is removed
	// before a request goes upstream. Default none: the CIDR decides.
	TrustedProxySecret Secret `yaml:"trusted_proxy_secret"`
	// StripHeaders are removed, in any case and with '_' for '-' (as CGI
	// and WSGI stacks read "X_User_ID"), from the requests of untrusted
	// peers before they are proxied; every X-Forwarded-* header and
	// UserHeader always are. Default DefaultStripHeaders. From trusted
	// proxies only the underscored spellings are removed, and the path and
	// method overriding headers (X-Original-URL, X-HTTP-Method-Override, …).
	StripHeaders []string `yaml:"strip_headers"`
	// Routes map path prefixes and methods to upstreams, plans and costs.
	// The longest matching prefix wins; a route naming the method beats one
	// for any method. Routes match the normalised path (see Paths), which
	// is also the path sent upstream.
	Routes []Route `yaml:"routes"`
	// Paths says how request paths are normalised; ambiguous ones get 400.
	Paths PathConfig `yaml:"paths"`
	// Upstreams are the services behind the gateway, by name.
	Upstreams map[string]Upstream `yaml:"upstreams"`

	// FailurePolicy is the default for rules that set none; default "open".
	FailurePolicy FailurePolicy `yaml:"failure_policy"`
	// ExpectedGateways is how many gateways share the limits; the local
	// failure policy enforces limit ÷ ExpectedGateways. Default 1.
	ExpectedGateways int `yaml:"expected_gateways"`
	// StoreDeadline bounds one limiter call; default 25ms.
	StoreDeadline time.Duration `yaml:"store_deadline"`
	// Breaker stops calling a failing store.
	Breaker BreakerConfig `yaml:"breaker"`
	// RetryJitter is the most jitter added to a wait before it is rounded
	// up to Retry-After's whole seconds; the jitter is random below
	// min(RetryJitter, a quarter of the wait), so Retry-After is never
	// earlier than allowed nor much later. Default 3s.
	RetryJitter time.Duration `yaml:"retry_jitter"`
	// KeyHashSecret keys the HMAC that turns identities into event key ids.
	// Every gateway needs the same one so key ids agree; when empty a random
	// one is made at start (key ids then differ per process).
	KeyHashSecret Secret `yaml:"key_hash_secret"`
	// LocalMaxKeys bounds the in-memory store's rule states; default 1<<20.
	LocalMaxKeys int `yaml:"local_max_keys"`
	// SplitMaxPeriod, when set, is the longest rule period a split
	// directive may split: a check holding a longer rule stays in the
	// shared bucket. A split is exact whatever the periods (the limiter
	// checks every share with the shared bucket, and seeds a new share from
	// it), so this only keeps such checks undivided among gateways. Default
	// 0: every check may be split.
	SplitMaxPeriod time.Duration `yaml:"split_max_period"`

	// Timeouts of the traffic listener.
	Timeouts Timeouts `yaml:"timeouts"`
	// MaxConnections caps the traffic listener's open connections; those
	// over it are closed on accept. Default DefaultMaxConnections. Restart.
	MaxConnections int `yaml:"max_connections"`
	// MaxHeaderBytes bounds request headers (431 above); default 32 KiB. Restart.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxBodyBytes bounds request bodies (413 above), and those the gateway
	// reads (forms, JSON: see scanBody) once decoded too; default 10 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
}

// The plan, rule, key and route types are gateway/plans', where readers
// that are no gateway (the what-if, usage statements) find them without
// the HTTP server.
type (
	FailurePolicy = plans.FailurePolicy
	Plan          = plans.Plan
	Rule          = plans.Rule
	APIKey        = plans.APIKey
	Override      = plans.Override
	Route         = plans.Route
)

// Failure policies (plans.FailOpen …).
const (
	FailOpen   = plans.FailOpen
	FailClosed = plans.FailClosed
	FailLocal  = plans.FailLocal
)

// Upstream is a service behind the gateway.
type Upstream struct {
	// URL is the base URL; the request path is appended to its path.
	URL string `yaml:"url"`
	// Timeout bounds the wait for response headers; default 30s. Past it
	// the client gets 504.
	Timeout time.Duration `yaml:"timeout"`
	// ConnectTimeout bounds connecting; default 2s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
}

// PathConfig says how request paths are normalised before routing. The
// normalised path is the one forwarded; see normalizePath for what it
// decodes, resolves and refuses.
type PathConfig struct {
	// AllowParams accepts ';' in path segments (";jsessionid=…"): routes
	// then match each segment without its params, as Java stacks route,
	// and the params are forwarded. Default false: 400, since an upstream
	// that cuts params could run a route other than the one limited.
	AllowParams bool `yaml:"allow_params"`
	// IgnoreCase matches route prefixes case-insensitively, for upstreams
	// that route so ("/api/EXPORT" is then the export route). Default
	// false: case-sensitive, like most upstream routers; the path is
	// forwarded as sent either way.
	IgnoreCase bool `yaml:"ignore_case"`
}

// BreakerConfig tunes the circuit breaker around the store.
type BreakerConfig struct {
	// Failures is how many consecutive store failures open the circuit;
	// default 5.
	Failures int `yaml:"failures"`
	// Open is how long the circuit stays open before one probe; default 1s.
	Open time.Duration `yaml:"open"`
}

// Timeouts of the traffic listener's http.Server (restart to change).
type Timeouts struct {
	// ReadHeader default 5s.
	ReadHeader time.Duration `yaml:"read_header"`
	// Read bounds the request body without progress, default 30s: every
	// read that makes progress pushes the deadline out again, so a slow
	// but active upload is not cut and a stalled one gets 408.
	Read time.Duration `yaml:"read"`
	// Write bounds a proxied exchange without progress, default 60s: every
	// write of the response (or read of the body) pushes it out again, so
	// an active stream (SSE) is not cut and a stalled one is. It must
	// exceed every upstream's timeout so a 504 can still be written.
	Write time.Duration `yaml:"write"`
	// Idle keep-alive default 120s.
	Idle time.Duration `yaml:"idle"`
	// Shutdown bounds the graceful drain; default 20s.
	Shutdown time.Duration `yaml:"shutdown"`
}

// DefaultAuthFailureRule is the rule of the built-in auth failure plan.
var DefaultAuthFailureRule = limiter.Rule{Name: "auth-failure", Limit: 20, Period: time.Minute}

// Defaults.
const (
	DefaultListen         = ":8080"
	DefaultAdminListen    = "127.0.0.1:9090"
	DefaultCheckPath      = "/v1/check"
	DefaultStoreDeadline  = 25 * time.Millisecond
	DefaultRetryJitter    = 3 * time.Second
	DefaultMaxHeaderBytes = 32 << 10
	DefaultMaxBodyBytes   = 10 << 20
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.CheckPath == "" {
		c.CheckPath = DefaultCheckPath
	}
	if c.UserPlan == "" {
		c.UserPlan = c.AnonymousPlan
	}
	if c.UnknownKey == "" {
		c.UnknownKey = UnknownKeyReject
	}
	if c.APIKeyParams == nil {
		c.APIKeyParams = slices.Clone(DefaultAPIKeyParams)
	}
	if c.StripHeaders == nil {
		c.StripHeaders = slices.Clone(DefaultStripHeaders)
	}
	if c.FailurePolicy == "" {
		c.FailurePolicy = FailOpen
	}
	if c.ExpectedGateways == 0 {
		c.ExpectedGateways = 1
	}
	def(&c.StoreDeadline, DefaultStoreDeadline)
	if c.Breaker.Failures == 0 {
		c.Breaker.Failures = 5
	}
	def(&c.Breaker.Open, time.Second)
	def(&c.RetryJitter, DefaultRetryJitter)
	if c.LocalMaxKeys == 0 {
		c.LocalMaxKeys = 1 << 20
	}
	def(&c.Timeouts.ReadHeader, 5*time.Second)
	def(&c.Timeouts.Read, 30*time.Second)
	def(&c.Timeouts.Write, 60*time.Second)
	def(&c.Timeouts.Idle, 120*time.Second)
	def(&c.Timeouts.Shutdown, 20*time.Second)
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if len(c.Upstreams) > 0 {
		ups := make(map[string]Upstream, len(c.Upstreams))
		for name, u := range c.Upstreams {
			def(&u.Timeout, 30*time.Second)
			def(&u.ConnectTimeout, 2*time.Second)
			ups[name] = u
		}
		c.Upstreams = ups
	}
	if len(c.Routes) > 0 {
		routes := slices.Clone(c.Routes)
		for i := range routes {
			routes[i] = routes[i].WithDefaults()
		}
		c.Routes = routes
	}
	return c
}

// MarshalYAML prints the upstream as configured but for a password in its
// URL, which is redacted: what -check prints is safe to paste.
func (u Upstream) MarshalYAML() (any, error) {
	type plain Upstream // without the method, or this would recurse
	p := plain(u)
	p.URL = redactURL(p.URL)
	return p, nil
}

// redactURL hides the password in a URL's user info (http://user:pass@h)
// and every query or fragment value (?access_token=…), also in a URL too
// malformed to parse, wherever one is printed or logged.
func redactURL(s string) string {
	rest := ""
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s, rest = s[:i], redactValues(s[i:])
	}
	if u, err := url.Parse(s); err == nil {
		return u.Redacted() + rest
	}
	scheme, auth, ok := strings.Cut(s, "//")
	if at := strings.LastIndex(auth, "@"); ok && at >= 0 {
		return scheme + "//xxxxx" + auth[at:] + rest
	}
	return s + rest
}

// redactValues writes each value of a query (and fragment) as xxxxx: any
// of them may be a credential, by whatever name.
func redactValues(q string) string {
	var b strings.Builder
	inValue := false
	for i := 0; i < len(q); i++ {
		switch c := q[i]; {
		case c == '?' || c == '&' || c == ';' || c == '#':
			inValue = false
			b.WriteByte(c)
		case c == '=' && !inValue:
			inValue = true
			b.WriteString("=xxxxx")
		case !inValue:
			b.WriteByte(c)
		}
	}
	return b.String()
}
