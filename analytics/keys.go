package analytics

import "net/netip"

// DirectiveKey is the key a split directive is filed under for a key the
// events name by kind and key id. It must match what the gateway looks up:
// the gateway never sees analytics' view of a key except through this.
func DirectiveKey(kind, keyID string) string {
	return kind + ":" + keyID
}

// IPKey is the IP limiter key of a client address, as the gateway computes
// it: "ip:<addr>" for IPv4 (and IPv4-mapped IPv6), "ip:<prefix>/64" for
// IPv6, whose /64 one subscriber usually holds whole. ok is false for
// anything that is not an address.
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
