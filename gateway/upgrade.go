package gateway

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/plans"
)

// probUpgrade is the problem type of an upgrade a route does not allow.
const probUpgrade = "urn:edgelimit:problem:upgrade-not-allowed"

// DefaultTunnelMaxDuration bounds an upgraded connection's lifetime.
const DefaultTunnelMaxDuration = plans.DefaultTunnelMaxDuration

// upgradeOf is the protocol a request asks to switch to, lower-cased, or
// "" when it asks for none. Like httputil.ReverseProxy, only an Upgrade
// named in Connection counts: without it the proxy drops Upgrade as a
// hop-by-hop header.
func upgradeOf(h http.Header) string {
	up := h.Get("Upgrade")
	if up == "" {
		return ""
	}
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return strings.ToLower(strings.TrimSpace(up))
			}
		}
	}
	return ""
}

// allowsUpgrade says whether rt may switch to protocol up.
func (rt *route) allowsUpgrade(up string) bool {
	return slices.ContainsFunc(rt.Upgrades, func(p string) bool { return strings.EqualFold(p, up) })
}

// tunnel prepares r to become a tunnel: one that the listener's read and
// write timeouts, meant for one request, would cut at an arbitrary point,
// so they are lifted, and one that may stay open only for the route's
// TunnelMaxDuration: the whole tunnel is charged once, as one request of
// the route's cost, so its lifetime is what bounds what it buys. The
// proxy closes both sides when the returned request's context ends.
func tunnel(w http.ResponseWriter, r *http.Request, rt *route) (*http.Request, context.CancelFunc) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(r.Context(), rt.TunnelMaxDuration)
	return r.WithContext(ctx), cancel
}
