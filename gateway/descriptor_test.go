package gateway

import (
	"strconv"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/event"
)

// TestEventDescriptorBounds: whatever a Call carries, its event encodes:
// entries past the bound and keys too long are left out, long values and
// secrets hashed with the gateway's key.
func TestEventDescriptorBounds(t *testing.T) {
	g, err := New(testConfig("http://127.0.0.1:1"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("v", event.MaxFieldLen+1)
	in := []DescriptorEntry{{Key: long, Value: "x"}, {Key: "token", Value: "s3cret", Secret: true}, {Key: "big", Value: long}}
	for i := range 20 {
		in = append(in, DescriptorEntry{Key: "k", Value: strconv.Itoa(i)})
	}
	out := g.eventDescriptor(in)
	if len(out) != event.MaxDescriptorEntries {
		t.Fatalf("%d entries, want %d", len(out), event.MaxDescriptorEntries)
	}
	if out[0].Key != "token" || !strings.HasPrefix(out[0].Value, hashedPrefix) || out[0].Value == hashedPrefix+"s3cret" {
		t.Errorf("secret entry %+v, want its keyed hash", out[0])
	}
	if out[1].Key != "big" || !strings.HasPrefix(out[1].Value, hashedPrefix) {
		t.Errorf("long value %.40q, want it hashed", out[1].Value)
	}
	if _, err := event.Encode(event.Decision{Descriptor: out}); err != nil {
		t.Errorf("the bounded descriptor does not encode: %v", err)
	}
}
