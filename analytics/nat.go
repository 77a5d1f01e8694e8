package analytics

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// IPTraffic is one client address's traffic over a window, as the NAT
// query returns it. IPv6 clients come grouped by /64.
type IPTraffic struct {
	IP       string
	Requests int64
	Denied   int64
	// DistinctKeys counts authenticated keys (api_key, user) and
	// DistinctUserAgents the user agents of allowed requests.
	DistinctKeys       int64
	DistinctUserAgents int64
}

// NATIP is an address the detector flagged as shared by many clients,
// with its evidence and the raise it gets.
type NATIP struct {
	// IP is the address (or IPv6 /64 network) and Key its IP limiter key.
	IP                 string `json:"ip"`
	Key                string `json:"key"`
	Requests           int64  `json:"requests"`
	Denied             int64  `json:"denied"`
	DistinctKeys       int64  `json:"distinct_keys"`
	DistinctUserAgents int64  `json:"distinct_user_agents"`
	// Clients is the estimated number of distinct clients behind the IP:
	// the larger of its distinct keys and distinct user agents.
	Clients int64 `json:"clients"`
	// Factor is how far the IP's anonymous limit is raised.
	Factor float64 `json:"factor"`
	// Reason is what flagged it: "keys", "user_agents", or "cooling".
	Reason string `json:"reason"`
	// Since is when the detector first flagged the IP in this run of
	// analytics (set by Detector).
	Since time.Time `json:"since,omitzero"`
}

// DetectNATs returns the NAT-shared IPs among rows, most clients first.
// flagged holds the IP keys under a NAT directive now: they stay flagged
// until their evidence falls under CoolRatio × the thresholds.
func DetectNATs(cfg NATConfig, rows []IPTraffic, flagged map[string]bool) []NATIP {
	if cfg.Disabled {
		return nil
	}
	var out []NATIP
	for _, r := range rows {
		key, ok := limiter.IPKey(r.IP)
		if !ok {
			continue
		}
		n := NATIP{
			IP: r.IP, Key: key, Requests: r.Requests, Denied: r.Denied,
			DistinctKeys: r.DistinctKeys, DistinctUserAgents: r.DistinctUserAgents,
			Clients: max(r.DistinctKeys, r.DistinctUserAgents),
		}
		// Only allowed traffic is evidence: a client flooding itself into
		// denials proves nothing about others sharing its address.
		allowed := r.Requests - r.Denied
		over := func(v, threshold int64, ratio float64) bool {
			return threshold > 0 && float64(v) >= ratio*float64(threshold)
		}
		busy := allowed >= cfg.MinRequests
		held := flagged[key] && float64(allowed) >= cfg.CoolRatio*float64(cfg.MinRequests)
		switch {
		case busy && over(r.DistinctKeys, cfg.MinDistinctKeys, 1):
			n.Reason = "keys"
		case busy && over(r.DistinctUserAgents, cfg.MinDistinctUserAgents, 1):
			n.Reason = "user_agents"
		case held && (over(r.DistinctKeys, cfg.MinDistinctKeys, cfg.CoolRatio) ||
			over(r.DistinctUserAgents, cfg.MinDistinctUserAgents, cfg.CoolRatio)):
			n.Reason = "cooling"
		default:
			continue
		}
		n.Factor = NATFactor(cfg, n.Clients)
		ratio := 1.0
		if n.Reason == "cooling" {
			ratio = cfg.CoolRatio
		}
		if !over(r.DistinctKeys, cfg.MinDistinctKeys, ratio) {
			// User agents cost nothing to rotate: without enough distinct
			// authenticated keys the raise stays small.
			n.Factor = min(n.Factor, cfg.UserAgentMaxFactor)
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b NATIP) int {
		return cmp.Or(cmp.Compare(b.Clients, a.Clients), cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.Key, b.Key))
	})
	if len(out) > cfg.MaxIPs {
		out = out[:cfg.MaxIPs]
	}
	return out
}

// NATFactor is the raise for an IP with clients estimated clients:
// clients × PerClient, rounded to two decimals, within [1, MaxFactor].
func NATFactor(cfg NATConfig, clients int64) float64 {
	f := float64(clients) * cfg.PerClient
	f = math.Round(f*100) / 100
	return min(max(1, f), cfg.MaxFactor, 1000)
}

// NATDirectives turns flagged IPs into NAT directives expiring ttl after
// now.
func NATDirectives(ips []NATIP, now time.Time, ttl time.Duration) []limiter.NATDirective {
	ds := make([]limiter.NATDirective, 0, len(ips))
	for _, n := range ips {
		ds = append(ds, limiter.NATDirective{Key: n.Key, Factor: n.Factor, Clients: n.Clients, Expires: now.Add(ttl)})
	}
	return ds
}
