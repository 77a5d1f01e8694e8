package gateway

import "github.com/edgelimit/edgelimit/internal/event"

// DescriptorEntry is one key/value pair of the rate limit descriptors an
// entry point outside this package (Envoy's rate limit API) decided a Call
// for; the decision event carries them.
type DescriptorEntry struct {
	Key, Value string
	// Secret says the value may be a credential: the event carries its
	// keyed hash ("hmac:<hex>", the key_id's HMAC), never the value.
	Secret bool
}

// MaxDescriptorEntries is the most descriptor entries a decision event
// carries (event.MaxDescriptorEntries); a Call's further entries are left
// out.
const MaxDescriptorEntries = event.MaxDescriptorEntries

// hashedPrefix starts a descriptor value the event carries as a keyed hash.
const hashedPrefix = "hmac:"

// eventDescriptor is what the event carries of a call's descriptor: at most
// event.MaxDescriptorEntries entries, no key or value the event cannot hold
// (the caller bounds them; these are a backstop), secret values hashed. The hash is keyed like key ids, so equal
// values of one fleet still group together in ClickHouse, yet no one without
// the key can test a guess against them.
func (g *Gateway) eventDescriptor(in []DescriptorEntry) []event.DescriptorEntry {
	if len(in) == 0 {
		return nil
	}
	out := make([]event.DescriptorEntry, 0, min(len(in), event.MaxDescriptorEntries))
	for _, e := range in {
		if len(out) == cap(out) {
			break
		}
		if len(e.Key) > event.MaxFieldLen {
			continue // the event would not encode at all
		}
		d := event.DescriptorEntry{Key: e.Key, Value: e.Value}
		if e.Secret || len(e.Value) > event.MaxFieldLen {
			// Prefixed, so a value can never hash like a limiter key.
			d.Value = hashedPrefix + g.keys.id("descriptor|"+e.Value)
		}
		out = append(out, d)
	}
	return out
}
