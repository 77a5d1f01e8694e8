package envoyrls

import (
	"net/url"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/gateway"
)

// Bounds on what a decision event carries of a request's descriptors: the
// event is one per request and lands in ClickHouse, so a request cannot
// make it large.
const (
	// maxEventKey is the longest descriptor key an event carries; an entry
	// with a longer one is left out (and counted).
	maxEventKey = 64
	// maxEventValue is the longest value an event carries as sent; a
	// longer one is hashed, since long opaque values are mostly tokens.
	maxEventValue = 128
)

// secretWords mark a descriptor key whose value may be a credential: Envoy's
// request_headers action names the entry after the operator's choice of
// descriptor_key, e.g. "api_key" or "auth_header".
var secretWords = []string{"auth", "token", "key", "secret", "passw", "pwd", "cookie", "session",
	"credential", "signature", "jwt", "bearer", "private", "otp"}

// plainKeys are Envoy's own descriptor keys: their values are never secrets,
// though "generic_key" holds the word "key".
var plainKeys = map[string]bool{
	"generic_key": true, "header_match": true, "source_cluster": true, "destination_cluster": true,
	"remote_address": true, "masked_remote_address": true, "query_match": true,
}

// secretValue says whether the event must carry value's hash rather than
// value: its key names a credential, or it looks like one (an
// Authorization header's scheme, or too long to be a plain name), or it
// holds one inside a URL (a path descriptor's ":path" carries the query).
func secretValue(key, value string) bool {
	if len(value) > maxEventValue {
		return true
	}
	if len(value) >= 7 && strings.EqualFold(value[:7], "bearer ") || len(value) >= 6 && strings.EqualFold(value[:6], "basic ") {
		return true
	}
	if urlSecret(value) {
		return true
	}
	return !plainKeys[key] && secretName(key)
}

// secretName says whether a key or parameter name names a credential.
func secretName(name string) bool {
	k := strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// urlSecret says whether value holds a URL's password (user:pass@host,
// with or without a scheme) or a parameter named like a credential
// (?access_token=…, ;jsessionid=…, #id_token=…), its name unescaped, so
// no spelling of one is carried as sent.
func urlSecret(value string) bool {
	if !strings.ContainsAny(value, "@=") {
		return false // no user:pass@, no parameter: the common case, at no cost
	}
	auth := value
	if _, rest, ok := strings.Cut(value, "://"); ok {
		auth = rest
	}
	auth = strings.TrimPrefix(auth, "//")
	if i := strings.IndexAny(auth, "/?#"); i >= 0 {
		auth = auth[:i]
	}
	if at := strings.LastIndex(auth, "@"); at >= 0 && strings.Contains(auth[:at], ":") {
		return true
	}
	for _, p := range strings.FieldsFunc(value, func(r rune) bool { return r == '?' || r == '&' || r == ';' || r == '#' }) {
		name, _, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		if u, err := url.QueryUnescape(name); err == nil {
			name = u
		}
		if secretName(name) {
			return true
		}
	}
	return false
}

// eventDescriptor is what the decision event carries of the checked
// descriptors: their entries in request order, each distinct pair once, at
// most gateway.MaxDescriptorEntries of them; what is left out is counted in
// dropped.
func eventDescriptor(all []resolved, picks []pick, dropped prometheus.Counter) []gateway.DescriptorEntry {
	var out []gateway.DescriptorEntry
	n := 0
	for i, f := range all {
		if picks[i].rule < 0 {
			continue
		}
	entries:
		for _, e := range f.entries {
			if len(e.key) > maxEventKey {
				n++
				continue
			}
			for _, o := range out {
				if o.Key == e.key && o.Value == e.value {
					continue entries
				}
			}
			if len(out) == gateway.MaxDescriptorEntries {
				n++
				continue
			}
			out = append(out, gateway.DescriptorEntry{Key: e.key, Value: e.value, Secret: secretValue(e.key, e.value)})
		}
	}
	if n > 0 {
		dropped.Add(float64(n))
	}
	return out
}
