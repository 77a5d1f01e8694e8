package envoyrls

import (
	"fmt"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgelimit/edgelimit/internal/event"
)

// TestEventCarriesDescriptor: a decision event names the domain and the
// checked descriptors' entries, through the gateway's one enforcement step
// on real Redis; values that may be credentials are keyed hashes, never as
// sent; the entries are bounded, and what is left out is counted.
func TestEventCarriesDescriptor(t *testing.T) {
	const rules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: many
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 100}
`
	r := startRLS(t, map[string]string{"edge.yaml": rules}, Config{}, gatewayConfig(), "")
	const secret = "sk_live_0123456789abcdef"
	long := strings.Repeat("x", maxEventValue+1)
	r.ask(t, "edge", 0,
		desc("remote_address", "192.0.2.7"),
		desc("api_key", secret),
		desc("path", "/v1/orders"),
		desc("path", "Bearer "+secret),
		desc("path", "/callback?state=1&access_token="+secret),
		desc("path", long),
		desc("unconfigured", "not checked"),
		desc("path", "/v1/orders")) // the same entry again: once in the event
	evs := r.events.list()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	e := evs[0]
	if e.Domain != "edge" {
		t.Errorf("event domain %q, want edge", e.Domain)
	}
	var keys []string
	for _, d := range e.Descriptor {
		keys = append(keys, d.Key)
		if strings.Contains(d.Value, secret) || strings.Contains(d.Value, long) {
			t.Errorf("event descriptor entry %q carries a secret value as sent: %q", d.Key, d.Value)
		}
	}
	if want := []string{"remote_address", "api_key", "path", "path", "path", "path"}; !cmp.Equal(keys, want) {
		t.Errorf("event descriptor keys %v, want %v (checked descriptors only, duplicates once)", keys, want)
	}
	plain := map[string]bool{"192.0.2.7": true, "/v1/orders": true}
	for _, d := range e.Descriptor {
		if plain[d.Value] {
			continue
		}
		if !strings.HasPrefix(d.Value, "hmac:") || len(d.Value) != len("hmac:")+32 {
			t.Errorf("entry %s = %q, want hmac:<32 hex>", d.Key, d.Value)
		}
	}
	if b, err := event.Encode(e); err != nil {
		t.Fatalf("the event does not encode: %v (%d bytes)", err, len(b))
	}

	// Over the bound: 20 distinct entries keep 16, the other four are
	// counted; an unchecked descriptor is not in the event at all.
	r = startRLS(t, map[string]string{"edge.yaml": rules}, Config{}, gatewayConfig(), "")
	var ds []*commonv3.RateLimitDescriptor
	for i := range 10 {
		ds = append(ds, desc("many", fmt.Sprint(i), "sub", fmt.Sprint(i)))
	}
	ds = append(ds, desc(strings.Repeat("k", maxEventKey+1), "v"))
	if len(ds) > MaxDescriptors {
		t.Fatalf("test sends %d descriptors, over %d", len(ds), MaxDescriptors)
	}
	r.ask(t, "edge", 0, ds...)
	e = r.events.list()[0]
	if len(e.Descriptor) != event.MaxDescriptorEntries {
		t.Errorf("%d entries in the event, want %d", len(e.Descriptor), event.MaxDescriptorEntries)
	}
	if got := testutil.ToFloat64(r.svc.dropped); got != 4 {
		t.Errorf("dropped entries = %v, want 4 (the long key's descriptor is not checked)", got)
	}
}

func TestSecretValue(t *testing.T) {
	tests := []struct {
		key, value string
		want       bool
	}{
		{"remote_address", "10.0.0.1", false},
		{"generic_key", "default", false},
		{"path", "/v1", false},
		{"api_key", "abc", true},
		{"x-api-key", "abc", true},
		{"auth_header", "abc", true},
		{"Authorization", "abc", true},
		{"session_id", "abc", true},
		{"user", "Bearer abc", true},
		{"user", "basic dXNlcjpwYXNz", true},
		{"user", strings.Repeat("a", maxEventValue+1), true},
		{"user", strings.Repeat("a", maxEventValue), false},
		// Inside a URL: its user info's password, or a parameter named
		// like a credential, escaped or not.
		{"path", "/cb?state=1&access_token=abc", true},
		{"path", "/login?user=a&PASSWORD=hunter2", true},
		{"path", "/x;jsessionid=abc", true},
		{"path", "/x#id_token=abc", true},
		{"path", "/x?%74oken=abc", true},
		{"query", "X-Amz-Signature=abc&X-Amz-Date=1", true},
		{"url", "https://user:pass@example.com/x", true},
		{"upstream", "user:pass@10.0.0.1:6379", true},
		{"path", "/v1/orders?page=2&sort=asc", false},
		{"path", "/v1/keys/42", false},
		{"user", "alice@example.com", false},
		{"url", "https://example.com/a@b", false},
	}
	for _, tt := range tests {
		if got := secretValue(tt.key, tt.value); got != tt.want {
			t.Errorf("secretValue(%q, %.20q) = %v, want %v", tt.key, tt.value, got, tt.want)
		}
	}
}

// TestConfiguredSecretNamesNoRule: a credential configured as a
// descriptor's value (one customer's API key given a limit of its own) is
// never in what the door answers or publishes: the rule is named by the
// descriptor's place in its list, not by the value, in the response's
// statuses, headers and problem body, the decision event and the metrics.
func TestConfiguredSecretNamesNoRule(t *testing.T) {
	const secret = "sk_live_0123456789abcdef"
	rules := `domain: edge
descriptors:
  - key: api_key
    value: ` + secret + `
    rate_limit: {unit: hour, requests_per_unit: 1}
    descriptors:
      - key: session
        value: sess_` + secret + `
        rate_limit: {unit: hour, requests_per_unit: 1}
`
	r := startRLS(t, map[string]string{"edge.yaml": rules}, Config{}, gatewayConfig(), "")
	var seen []string
	for range 2 {
		resp := r.ask(t, "edge", 0, desc("api_key", secret), desc("api_key", secret, "session", "sess_"+secret))
		seen = append(seen, resp.String())
	}
	if !strings.Contains(seen[1], "OVER_LIMIT") {
		t.Fatalf("second request: %s, want OVER_LIMIT (1 an hour)", seen[1])
	}
	for _, st := range []string{"edge.api_key_-1", "edge.api_key_-1.session_-1"} {
		if !strings.Contains(seen[0], st) {
			t.Errorf("response %s does not name rule %s", seen[0], st)
		}
	}
	for _, e := range r.events.list() {
		b, err := event.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, string(b))
	}
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		seen = append(seen, mf.String())
	}
	for _, s := range seen {
		if strings.Contains(s, secret) {
			t.Errorf("a configured secret is carried as sent in %.300q", s)
		}
	}
}
