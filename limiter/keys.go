package limiter

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
)

// The identity part of limiter keys. The gateway builds them to check a
// caller, analytics builds the same ones to name the caller in directives:
// these functions are the one definition both use.

// APIKeyKey is the limiter key of an API key, by its configured id (never
// the raw key).
func APIKeyKey(id string) string { return "k:" + id }

// UserKey keys a user id as given when it is short and plain, and by its
// hash otherwise, so no header value can stretch or break a Redis key.
func UserKey(u string) string {
	if len(u) <= 128 && plainKey(u) {
		return "u:" + u
	}
	sum := sha256.Sum256([]byte(u))
	return "u#" + hex.EncodeToString(sum[:16])
}

// IPKey is the limiter key of a client address: "ip:<addr>" for IPv4 (and
// IPv4-mapped IPv6), "ip:<prefix>/64" for IPv6, whose /64 one subscriber
// usually holds whole. ok is false for anything that is not an address.
func IPKey(ip string) (key string, ok bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "", false
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return "ip:" + a.String(), true
	}
	p, _ := a.Prefix(64)
	return "ip:" + p.String(), true
}

// DirectiveKey is the key a split directive is filed under for a caller
// that decision events name by kind ("api_key", "user", "ip") and key id
// (the events' keyed hash of the limiter key).
func DirectiveKey(kind, keyID string) string { return kind + ":" + keyID }

func plainKey(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == '@' || c == ':':
		default:
			return false
		}
	}
	return true
}
