package gateway

import (
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
)

// DefaultStripHeaders are the identity and forwarding headers a client
// could set to pose as someone else, to the gateway's upstreams: removed
// from requests of untrusted peers (see Config.StripHeaders). Every
// X-Forwarded-* header and Config.UserHeader are removed as well.
var DefaultStripHeaders = append([]string{
	"Forwarded", "X-Forwarded-For", "X-Real-IP", "True-Client-IP", "X-Client-IP",
	"X-Original-Forwarded-For", "X-Cluster-Client-IP", "CF-Connecting-IP", "Fastly-Client-IP",
	// Rails' remote_ip and many PHP apps read Client-IP; services behind
	// Envoy believe X-Envoy-External-Address.
	"Client-IP", "X-Envoy-External-Address", "X-Originating-IP", "X-Remote-IP", "X-Remote-Addr",
}, overridingHeaders...)

// overridingHeaders are the headers with which frameworks let a proxy
// override the path or the method the upstream acts on: they would reach
// what was not decided (a GET charged as cheap, run as a DELETE or
// elsewhere). They are removed from every request, a trusted proxy's
// too (a proxy passes a client's override on as it came), whatever
// strip_headers lists.
var overridingHeaders = []string{
	"X-Original-URL", "X-Rewrite-URL", "X-Override-URL",
	"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override",
}

// overridingFolded are overridingHeaders as sameHeader compares them.
var overridingFolded = func() []string {
	var out []string
	for _, h := range overridingHeaders {
		out = append(out, foldHeader(h))
	}
	return out
}()

// headerSet matches header names the way CGI and WSGI stacks read them:
// case-insensitively and with '_' the same as '-', so "X_User_ID" is
// "X-User-ID" to an upstream and must be stripped like it.
type headerSet map[string]bool

func newHeaderSet(names ...string) headerSet {
	s := headerSet{}
	for _, n := range names {
		if n != "" {
			s[foldHeader(n)] = true
		}
	}
	return s
}

func foldHeader(name string) string {
	return strings.ToLower(strings.ReplaceAll(name, "_", "-"))
}

// scrub removes from h every header of the set, in any spelling, and
// every X-Forwarded-* header.
func (s headerSet) scrub(h http.Header) {
	for k := range h {
		if f := foldHeader(k); s[f] || strings.HasPrefix(f, "x-forwarded-") {
			delete(h, k)
		}
	}
}

// scrubUnderscored removes the underscore spellings of the set's headers.
// A trusted proxy sets the real ones; a client's underscored twin passes
// most proxies untouched and means the same to a CGI or WSGI upstream.
func (s headerSet) scrubUnderscored(h http.Header) {
	for k := range h {
		if strings.Contains(k, "_") {
			if f := foldHeader(k); s[f] || strings.HasPrefix(f, "x-forwarded-") {
				delete(h, k)
			}
		}
	}
}

// setForwarded writes the forwarding headers of a proxied request. From
// an untrusted peer every client-set identity header is gone and the
// gateway's own view is written; a trusted proxy's X-Forwarded-For and
// Forwarded are extended with the peer, and its X-Forwarded-Proto and
// X-Forwarded-Host kept: behind a TLS load balancer the upstream must
// still learn that the client used https.
//
// Under trusted_hops the peer is a proxy of unknown address: its
// forwarding chain is kept and extended too, but no identity header it
// passes on (those need trusted_proxies).
func setForwarded(pr *httputil.ProxyRequest, info *proxyInfo) {
	in, out := pr.In.Header, pr.Out.Header
	if len(in["Connection"]) > 0 {
		keepDecided(in, out)
	}
	delete(out, ProxySecretHeader) // a proxy's proof, never the upstream's business
	// From every peer, whatever strip_headers lists: the gateway decided
	// on the method and path it read.
	removeOverriding(out)
	switch {
	case info.peerTrusted:
		info.strip.scrubUnderscored(out)
	case info.trustedHops:
		info.strip.scrub(out)
	default:
		info.strip.scrub(out)
		pr.SetXForwarded()
		return
	}
	// ReverseProxy removed these before Rewrite; the trusted proxy's
	// values come back.
	for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded"} {
		if v, ok := in[k]; ok {
			out[k] = v
		}
	}
	proto, host := out["X-Forwarded-Proto"], out["X-Forwarded-Host"]
	pr.SetXForwarded() // appends the peer to X-Forwarded-For
	if proto != nil {
		out["X-Forwarded-Proto"] = proto
	}
	if host != nil {
		out["X-Forwarded-Host"] = host
	}
	if fwd := out["Forwarded"]; fwd != nil {
		out["Forwarded"] = append(fwd, "for="+forwardedNode(pr.In.RemoteAddr))
	}
}

// removeOverriding removes the overridingHeaders from h, in any spelling.
func removeOverriding(h http.Header) {
	for k := range h {
		for _, o := range overridingFolded {
			if sameHeader(k, o) {
				delete(h, k)
			}
		}
	}
}

// decidedHeaders are the end-to-end headers the gateway reads a request
// by: its caller and what its body is (the _method scan).
var decidedHeaders = []string{"content-type", "content-encoding", "x-api-key", "authorization"}

// keepDecided puts back into out the decided headers of in, in any
// spelling, that ReverseProxy removed because the client's Connection
// named them: the upstream must read the request the gateway read. A
// POST whose Content-Type went is a form to Rack, _method and all.
func keepDecided(in, out http.Header) {
	for k, v := range in {
		for _, d := range decidedHeaders {
			if sameHeader(k, d) {
				if _, ok := out[k]; !ok {
					out[k] = v
				}
			}
		}
	}
}

// forwardedNode is an address as RFC 7239 writes it: IPv6 in quoted
// brackets.
func forwardedNode(remoteAddr string) string {
	ip := peerIP(remoteAddr)
	if ip == nil {
		return "unknown"
	}
	if ip.To4() == nil {
		return `"[` + ip.String() + `]"`
	}
	return ip.String()
}

// clientIP is the client's address, and false when the request names it
// in a way that cannot be read: a malformed X-Forwarded-For entry where a
// trusted hop says the client is. Such a request is refused (400) rather
// than limited as the proxy's own address, which would put every client
// behind that proxy into one bucket.
//
// Without trusted proxies it is the peer. With trusted_proxies, the
// X-Forwarded-For chain is walked from the peer leftwards while the
// address at hand is trusted. With trusted_hops N, the client is the Nth
// entry from the right, as Envoy's xff_num_trusted_hops.
func (st *state) clientIP(r *http.Request) (string, bool) {
	peer := peerIP(r.RemoteAddr)
	direct := r.RemoteAddr
	if peer != nil {
		direct = peer.String()
	}
	hops := st.cfg.TrustedHops
	if len(st.trusted) == 0 && hops == 0 {
		return direct, true
	}
	if hops == 0 && !st.peerTrusted(r) {
		return direct, true
	}
	var chain []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		chain = append(chain, strings.Split(v, ",")...)
	}
	if len(chain) == 0 {
		return direct, true
	}
	if hops > 0 {
		i := max(0, len(chain)-hops)
		ip := parseForwardedIP(chain[i])
		if ip == nil {
			return "", false
		}
		return ip.String(), true
	}
	for i := len(chain) - 1; i >= 0; i-- {
		ip := parseForwardedIP(chain[i])
		if ip == nil {
			return "", false
		}
		if !st.isTrusted(ip) || i == 0 {
			return ip.String(), true
		}
	}
	return direct, true // not reached
}

func parseForwardedIP(s string) net.IP {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	return net.ParseIP(s)
}
