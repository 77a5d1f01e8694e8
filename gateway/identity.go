package gateway

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/edgelimit/edgelimit/gateway/bodyscan"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// identity is who the caller is, as far as the limits are concerned.
type identity struct {
	kind event.KeyKind
	// key is the limiter key: "k:<api key id>", "u:<user>" or "ip:<addr or
	// /64>". It never holds a raw API key.
	key  string
	plan *plan
	// clientIP is the client's address (full, not the /64).
	clientIP string
	// peerTrusted says the connection's peer is a trusted proxy.
	peerTrusted bool
	// keyID caches the keyed hash of key (see Gateway.keyID).
	keyID string
	// name is an API key's configured id (apiKey.name), for events.
	name string
}

// identifyError is why a caller could not be identified.
type identifyError int

const (
	identified identifyError = iota
	errUnknownKey
	errKeyRequired
	// errBadForwardedFor: a trusted hop names the client unreadably.
	errBadForwardedFor
	// errAmbiguousKey: the request carries more than one API key.
	errAmbiguousKey
	// errAmbiguousUser: a trusted proxy's user header has two values.
	errAmbiguousUser
)

// identity is the caller holding API key k; the request's fields
// (clientIP, peerTrusted) are the caller's to set.
func (k *apiKey) identity() identity {
	return identity{kind: event.KindAPIKey, key: limiter.APIKeyKey(k.id), plan: k.plan, name: k.name}
}

// identify finds the caller: API key, then user header from a trusted
// proxy, then client IP.
func (st *state) identify(r *http.Request) (identity, identifyError) {
	id := identity{peerTrusted: st.peerTrusted(r)}
	var ok bool
	if id.clientIP, ok = st.clientIP(r); !ok {
		return id, errBadForwardedFor
	}
	raw, ok := apiKeyOf(r.Header, r.URL.RawQuery, st.keyParams, st.cfg.IgnoreBearer)
	if !ok {
		return id, errAmbiguousKey
	}
	if raw != "" {
		if k := st.lookupKey(raw); k != nil {
			kid := k.identity()
			kid.clientIP, kid.peerTrusted = id.clientIP, id.peerTrusted
			return kid, identified
		}
		if st.cfg.UnknownKey != UnknownKeyAnonymous {
			return id, errUnknownKey
		}
	}
	if h := st.cfg.UserHeader; h != "" && id.peerTrusted {
		var u oneValue
		for _, v := range r.Header.Values(h) {
			u.add(v)
		}
		if u.two {
			// A proxy that appends its value (HAProxy add-header, Envoy's
			// request_headers_to_add) leaves the client's first: the first
			// would be any user the client names, a fresh budget each.
			return id, errAmbiguousUser
		}
		if u.v != "" {
			id.kind, id.key, id.plan = event.KindUser, limiter.UserKey(u.v), st.user
			return id, identified
		}
	}
	if st.anonymous == nil {
		return id, errKeyRequired
	}
	id.kind, id.key, id.plan = event.KindIP, ipKey(id.clientIP), st.anonymous
	return id, identified
}

// ipKey is the limiter key of a client address the extractor returned.
// It is always an address for TCP peers; anything else shares one bucket
// rather than going unlimited.
func ipKey(ip string) string {
	if k, ok := limiter.IPKey(ip); ok {
		return k
	}
	return "ip:unknown"
}

// DefaultAPIKeyParams are the query parameters read for an API key when
// api_key_params is not set: the spellings public APIs and gateways use.
var DefaultAPIKeyParams = []string{"api_key", "apikey"}

// bearerParam is RFC 6750's query form of a bearer token (§2.3), read
// whenever Authorization: Bearer is.
const bearerParam = "access_token"

// keyParams are the normalised names of the query parameters to read an
// API key from: cfg's, and bearerParam unless bearers are ignored.
func keyParams(cfg Config) []string {
	var out []string
	for _, p := range cfg.APIKeyParams {
		if p != "-" {
			out = append(out, bodyscan.ParamName(p))
		}
	}
	if !cfg.IgnoreBearer {
		out = append(out, bearerParam)
	}
	return out
}

// apiKeyOf reads the API key from X-API-Key, Authorization: Bearer and
// the query parameters params, and false when the request carries two
// different keys. An upstream may read another of them than the gateway
// would pick: the first of repeated fields (Go), the last, or all joined
// (Node); and a CGI or WSGI stack reads "X_API_KEY" as X-API-Key. Charged
// to one key (or to the address, when the first field is empty) and
// served as another, a caller would never meet its key's limits, so such
// a request is refused. Empty values name no key.
func apiKeyOf(h http.Header, rawQuery string, params []string, ignoreBearer bool) (string, bool) {
	var key oneValue
	for name, vs := range h {
		switch {
		case sameHeader(name, "x-api-key"):
			for _, v := range vs {
				// "X-API-Key: A, B" is two fields in one line (RFC 9110
				// §5.3), as a proxy may join them; Spring's List<String>
				// splits it again and serves A.
				for v != "" {
					var part string
					part, v, _ = strings.Cut(v, ",")
					key.add(part)
				}
			}
		case !ignoreBearer && strings.EqualFold(name, "Authorization"):
			for _, a := range vs {
				if tok, ok := bearerToken(a); ok {
					key.add(tok)
				}
			}
		}
	}
	if rawQuery != "" && len(params) > 0 {
		bodyscan.EachParam(rawQuery, params, key.add)
	}
	return key.v, !key.two
}

// bearerToken is the credential of an Authorization value of the Bearer
// scheme (any case), untrimmed. The scheme ends at any space an upstream
// splits on, not only RFC 6750's SP: Flask-HTTPAuth and Django REST
// framework split the value with Python's split(), which also splits on
// HTAB and on the Latin-1 bytes 0x85 and 0xA0 WSGI decodes, and Go's
// strings.Fields on every Unicode space. Read as no key, "Bearer\tKEY"
// was charged to the caller's address and served as KEY.
func bearerToken(a string) (string, bool) {
	const scheme = "bearer"
	if len(a) <= len(scheme) || !strings.EqualFold(a[:len(scheme)], scheme) {
		return "", false
	}
	rest := a[len(scheme):]
	if r, size := utf8.DecodeRuneInString(rest); !unicode.IsSpace(r) && (size != 1 || !latin1Space(rest[0])) {
		return "", false // "Bearerx…": another scheme
	}
	return rest, true
}

// latin1Space says b is a byte that is a space to Python once WSGI has
// decoded a header as Latin-1: NEL (0x85) and NBSP (0xA0); as bytes of
// their own they are no UTF-8, so strings.TrimSpace keeps them.
func latin1Space(b byte) bool { return b == 0x85 || b == 0xa0 }

// trimCredential trims s as the most lenient upstream trims a key: every
// Unicode space (strings.TrimSpace) and the latin1Space bytes, so that
// "KEY\xa0", which Python's strip() makes KEY, is no unknown key here.
func trimCredential(s string) string {
	for {
		t := strings.TrimSpace(s)
		for t != "" && latin1Space(t[0]) {
			t = t[1:]
		}
		for t != "" && latin1Space(t[len(t)-1]) {
			t = t[:len(t)-1]
		}
		if len(t) == len(s) {
			return t
		}
		s = t
	}
}

// oneValue gathers the values of what should be one header: the one
// non-empty value ("" for none), and two when there are different ones.
type oneValue struct {
	v   string
	two bool
}

func (o *oneValue) add(x string) {
	if x = trimCredential(x); x == "" || x == o.v {
		return
	}
	if o.v != "" {
		o.two = true
		return
	}
	o.v = x
}

// sameHeader says name is the lower-case header name folded as
// foldHeader folds it, without allocating.
func sameHeader(name, folded string) bool {
	if len(name) != len(folded) {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case c == '_':
			c = '-'
		}
		if c != folded[i] {
			return false
		}
	}
	return true
}

// peerTrusted reports whether r comes from a trusted proxy: its peer is
// inside trusted_proxies and, with trusted_proxy_secret, it proves the
// secret (compared in constant time).
func (st *state) peerTrusted(r *http.Request) bool {
	if !st.isTrusted(peerIP(r.RemoteAddr)) {
		return false
	}
	secret := st.cfg.TrustedProxySecret
	return secret == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get(ProxySecretHeader)), []byte(secret)) == 1
}

func (st *state) isTrusted(ip net.IP) bool {
	if ip == nil {
		return false
	}
	for _, n := range st.trusted {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

func peerIP(remoteAddr string) net.IP {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	// A link-local peer's zone names this host's interface, not the
	// client; net.ParseIP refuses it, which put every such peer, port and
	// all, into one "ip:unknown" bucket.
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i]
	}
	return net.ParseIP(host)
}
