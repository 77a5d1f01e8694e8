package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/limiter"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// maxNameLen bounds the names that become part of limiter keys: an API
// key's id, a plan's (the check API's "|p:<plan>"), a route's ("|r:") and
// the gateway's id (a split's "/gw:"). At 128 bytes each the longest key,
// "k:<id>|r:<route>/gw:<gateway>", is 393 bytes, within
// limiter.MaxKeyLen; a longer one is refused by the limiter, so a 500 for
// every request of the key, or only once a split names it.
const maxNameLen = 128

// Validate reports everything wrong with c (after defaults), each problem
// naming its field, all wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}

	if strings.ContainsAny(c.GatewayID, "{}\" \t\r\n") || len(c.GatewayID) > maxNameLen {
		// It becomes part of limiter keys under split directives.
		bad("gateway_id", "%q may not hold braces, quotes or spaces, and is at most 128 bytes", c.GatewayID)
	}
	if c.GatewayID == limiter.OtherGateways {
		// A split names the gateways it saw and files the rest's share
		// under this name: a gateway so named would take that reserve too.
		bad("gateway_id", "%q is the name splits give every gateway they do not name; choose another", c.GatewayID)
	}
	if c.CheckPath != "-" && !strings.HasPrefix(c.CheckPath, "/") {
		bad("check_path", "%q must start with / (or be - to disable)", c.CheckPath)
	} else if n, err := normalizePath(c.CheckPath, c.Paths); c.CheckPath != "-" && (err != nil || n != c.CheckPath) {
		// Requests are matched in normal form; another form never matches.
		bad("check_path", "%q is not a path in normal form", c.CheckPath)
	}
	if len(c.Plans) == 0 {
		bad("plans", "at least one plan is needed")
	}
	for _, name := range sortedKeys(c.Plans) {
		c.validatePlan(name, c.Plans[name], bad)
	}
	planRef := func(field, plan string, required bool) {
		if plan == "" {
			if required {
				bad(field, "a plan is needed")
			}
			return
		}
		if _, ok := c.Plans[plan]; !ok {
			bad(field, "unknown plan %q", plan)
		}
	}
	planRef("anonymous_plan", c.AnonymousPlan, false)
	if c.AuthFailurePlan != "-" {
		planRef("auth_failure_plan", c.AuthFailurePlan, false)
	}
	planRef("user_plan", c.UserPlan, c.UserHeader != "")
	if c.UserHeader != "" && !validHeaderName(c.UserHeader) {
		bad("user_header", "%q is not a header name", c.UserHeader)
	}
	switch c.UnknownKey {
	case UnknownKeyReject:
	case UnknownKeyAnonymous:
		if c.AnonymousPlan == "" {
			bad("unknown_key", "%q needs an anonymous_plan", c.UnknownKey)
		}
	default:
		bad("unknown_key", "%q is not %q or %q", c.UnknownKey, UnknownKeyReject, UnknownKeyAnonymous)
	}

	ids := map[string]int{}
	sums := map[string]int{}
	for i, k := range c.APIKeys {
		field := fmt.Sprintf("api_keys[%d]", i)
		sum := strings.ToLower(k.SHA256)
		if len(sum) != 64 || !isHex(sum) {
			bad(field+".sha256", "want 64 hex digits (the SHA-256 of the key), got %d characters", len(k.SHA256))
		} else if j, dup := sums[sum]; dup {
			bad(field+".sha256", "same key as api_keys[%d]", j)
		} else {
			sums[sum] = i
		}
		id := k.ID
		if id == "" && len(sum) >= 16 {
			id = sum[:16]
		}
		if k.ID != "" && !nameRE.MatchString(k.ID) {
			bad(field+".id", "%q may hold only letters, digits, '_', '-' and '.'", k.ID)
		} else if len(k.ID) > maxNameLen {
			bad(field+".id", "%d bytes, at most %d", len(k.ID), maxNameLen)
		}
		if j, dup := ids[id]; dup && id != "" {
			bad(field+".id", "%q also names api_keys[%d]", id, j)
		}
		ids[id] = i
		planRef(field+".plan", k.Plan, true)
		plan, ok := c.Plans[k.Plan]
		for _, rule := range sortedKeys(k.Overrides) {
			o := k.Overrides[rule]
			ofield := field + ".overrides." + rule
			if !ok {
				continue
			}
			j := slices.IndexFunc(plan.Rules, func(r Rule) bool { return r.Name == rule })
			if j < 0 {
				bad(ofield, "plan %q has no rule %q", k.Plan, rule)
				continue
			}
			if err := o.Apply(plan.Rules[j]).Limiter().Validate(); err != nil {
				bad(ofield, "%v", err)
			}
		}
	}

	notNegative(bad, "trusted_hops", c.TrustedHops)
	for i, p := range c.APIKeyParams {
		if p == "" || strings.ContainsAny(p, "&;=#% +") || (p == "-" && len(c.APIKeyParams) > 1) {
			bad(fmt.Sprintf("api_key_params[%d]", i), "%q is not a query parameter name (or - alone, for none)", p)
		}
	}
	for i, h := range c.StripHeaders {
		if !validHeaderName(h) {
			bad(fmt.Sprintf("strip_headers[%d]", i), "%q is not a header name", h)
		}
	}
	for i, p := range c.TrustedProxies {
		if _, err := parseCIDR(p); err != nil {
			bad(fmt.Sprintf("trusted_proxies[%d]", i), "%v", err)
		}
	}

	for _, name := range sortedKeys(c.Upstreams) {
		u := c.Upstreams[name]
		field := "upstreams." + name
		pu, err := url.Parse(u.URL)
		switch {
		case err != nil:
			// Not err itself: url's errors quote the whole URL, password and all.
			bad(field+".url", "%q is not a URL", redactURL(u.URL))
		case pu.Scheme != "http" && pu.Scheme != "https":
			bad(field+".url", "%q: scheme must be http or https", redactURL(u.URL))
		case pu.Host == "":
			bad(field+".url", "%q has no host", redactURL(u.URL))
		}
		notNegative(bad, field+".timeout", u.Timeout)
		notNegative(bad, field+".connect_timeout", u.ConnectTimeout)
		if u.Timeout >= c.Timeouts.Write {
			bad(field+".timeout", "%v must be shorter than timeouts.write (%v), or a 504 could not be written", u.Timeout, c.Timeouts.Write)
		}
	}
	if len(c.Routes) == 0 {
		bad("routes", "at least one route is needed")
	}
	routeNames := map[string]int{}
	type match struct {
		prefix, method string
	}
	matches := map[match]int{}
	for i, r := range c.Routes {
		field := fmt.Sprintf("routes[%d]", i)
		if !strings.HasPrefix(r.PathPrefix, "/") {
			bad(field+".path_prefix", "%q must start with /", r.PathPrefix)
		} else if n, err := normalizePath(r.PathPrefix, c.Paths); err != nil {
			bad(field+".path_prefix", "%q: %v", r.PathPrefix, err)
		} else if strings.Contains(r.PathPrefix, ";") {
			// Routes match paths without their ";params".
			bad(field+".path_prefix", "%q holds ';'", r.PathPrefix)
		} else if n != r.PathPrefix {
			// Requests are matched in normal form; another form never matches.
			bad(field+".path_prefix", "%q is not in normal form; write %q", r.PathPrefix, n)
		}
		if strings.ContainsAny(r.Name, "{}\"\\ \t\r\n") || len(r.Name) > maxNameLen {
			bad(field+".name", "%q: route names may not hold braces, quotes, backslashes or spaces, and are at most 128 bytes", r.Name)
		}
		if j, dup := routeNames[r.Name]; dup {
			bad(field+".name", "%q also names routes[%d]", r.Name, j)
		}
		routeNames[r.Name] = i
		if _, ok := c.Upstreams[r.Upstream]; !ok {
			bad(field+".upstream", "unknown upstream %q", r.Upstream)
		}
		planRef(field+".plan", r.Plan, false)
		notNegative(bad, field+".cost", r.Cost)
		for j, u := range r.Upgrades {
			if u == "" || strings.Trim(u, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") != "" {
				// Tokens such as "websocket"; no versions or lists.
				bad(fmt.Sprintf("%s.upgrades[%d]", field, j), "%q is not an upgrade protocol name", u)
			}
			if strings.EqualFold(u, "h2c") {
				// An h2c tunnel is an HTTP/2 connection to the upstream: every
				// request on it, to any path, would pass for the one charged.
				bad(fmt.Sprintf("%s.upgrades[%d]", field, j), "h2c would tunnel HTTP/2 requests past the gateway's routes and limits, charged once")
			}
		}
		if r.Tokens != nil {
			c.validateTokens(bad, field+".tokens", r)
		}
		notNegative(bad, field+".tunnel_max_duration", r.TunnelMaxDuration)
		notNegative(bad, field+".read_idle", r.ReadIdle)
		notNegative(bad, field+".write_idle", r.WriteIdle)
		if u, ok := c.Upstreams[r.Upstream]; ok && r.WriteIdle > 0 && u.Timeout >= r.WriteIdle {
			bad(field+".write_idle", "%v must be longer than upstream %q's timeout (%v), or a 504 could not be written", r.WriteIdle, r.Upstream, u.Timeout)
		}
		methods := r.Methods
		if len(methods) == 0 {
			methods = []string{""}
		}
		for _, m := range methods {
			if m != "" && !validMethod(m) {
				bad(field+".methods", "%q is not an HTTP method", m)
			}
			k := match{strings.TrimSuffix(r.PathPrefix, "/"), strings.ToUpper(m)}
			if j, dup := matches[k]; dup {
				bad(field, "same path prefix and method as routes[%d]", j)
			}
			matches[k] = i
		}
	}

	if err := validPolicy(c.FailurePolicy); err != nil {
		bad("failure_policy", "%v", err)
	}
	if c.ExpectedGateways < 1 {
		bad("expected_gateways", "%d must be at least 1", c.ExpectedGateways)
	}
	switch {
	case c.StoreDeadline < time.Millisecond:
		bad("store_deadline", "%v must be at least 1ms", c.StoreDeadline)
	case c.StoreDeadline > 5*time.Second:
		bad("store_deadline", "%v: a store deadline is milliseconds, not seconds", c.StoreDeadline)
	}
	if c.Breaker.Failures < 1 {
		bad("breaker.failures", "%d must be at least 1", c.Breaker.Failures)
	}
	notNegative(bad, "breaker.open", c.Breaker.Open)
	notNegative(bad, "retry_jitter", c.RetryJitter)
	notNegative(bad, "split_max_period", c.SplitMaxPeriod)
	notNegative(bad, "local_max_keys", c.LocalMaxKeys)
	notNegative(bad, "timeouts.read_header", c.Timeouts.ReadHeader)
	notNegative(bad, "timeouts.read", c.Timeouts.Read)
	notNegative(bad, "timeouts.write", c.Timeouts.Write)
	notNegative(bad, "timeouts.idle", c.Timeouts.Idle)
	notNegative(bad, "timeouts.shutdown", c.Timeouts.Shutdown)
	if c.MaxHeaderBytes < 1024 {
		bad("max_header_bytes", "%d is below 1024", c.MaxHeaderBytes)
	}
	if c.MaxConnections < 1 {
		bad("max_connections", "%d must be at least 1", c.MaxConnections)
	}
	notNegative(bad, "max_body_bytes", c.MaxBodyBytes)
	return errors.Join(errs...)
}

// notNegative reports field through bad when v is below zero.
func notNegative[T ~int | ~int64](bad func(field, format string, args ...any), field string, v T) {
	if v < 0 {
		bad(field, "%v is negative", v)
	}
}

func (c Config) validatePlan(name string, p Plan, bad func(field, format string, args ...any)) {
	field := "plans." + name
	if !nameRE.MatchString(name) {
		bad(field, "plan names may hold only letters, digits, '_', '-' and '.'")
	} else if len(name) > maxNameLen {
		bad(field, "a plan name is at most %d bytes", maxNameLen)
	}
	if len(p.Rules) == 0 {
		bad(field+".rules", "a plan needs at least one rule")
	}
	if len(p.Rules) > limiter.MaxRules {
		bad(field+".rules", "%d rules, at most %d", len(p.Rules), limiter.MaxRules)
	}
	validatePlanUnits(bad, field, p)
	seen := map[string]bool{}
	for i, r := range p.Rules {
		rf := fmt.Sprintf("%s.rules[%d]", field, i)
		if !nameRE.MatchString(r.Name) {
			bad(rf+".name", "%q may hold only letters, digits, '_', '-' and '.'", r.Name)
		}
		if seen[r.Name] {
			bad(rf+".name", "duplicate rule %q", r.Name)
		}
		seen[r.Name] = true
		if r.InFlight != 0 {
			validateInFlight(bad, rf, r)
		} else if r.Lease != 0 {
			bad(rf+".lease", "only an in-flight rule (in_flight: N) has a lease")
		}
		if err := r.Limiter().Validate(); err != nil {
			bad(rf, "%v", err)
		}
		if r.FailurePolicy != "" {
			if err := validPolicy(r.FailurePolicy); err != nil {
				bad(rf+".failure_policy", "%v", err)
			}
		}
		switch r.Unit {
		case "", plans.UnitRequests, plans.UnitTokens:
		default:
			bad(rf+".unit", "%q is not %q or %q", r.Unit, plans.UnitRequests, plans.UnitTokens)
		}
	}
}

func validPolicy(p FailurePolicy) error {
	switch p {
	case FailOpen, FailClosed, FailLocal:
		return nil
	}
	return fmt.Errorf("%q is not %q, %q or %q", p, FailOpen, FailClosed, FailLocal)
}

// parseCIDR accepts "10.0.0.0/8" or a single address.
func parseCIDR(s string) (*net.IPNet, error) {
	if !strings.Contains(s, "/") {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
		}
		bits := 128
		if ip4 := ip.To4(); ip4 != nil {
			ip, bits = ip4, 32
		}
		return &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, nil
	}
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		return nil, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
	}
	return n, nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func validHeaderName(s string) bool {
	return s != "" && !strings.ContainsAny(s, " \t\r\n:") && http.CanonicalHeaderKey(s) != ""
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			if c < 'a' || c > 'z' {
				return false
			}
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
