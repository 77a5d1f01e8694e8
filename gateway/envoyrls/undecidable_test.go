package envoyrls

import (
	"fmt"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgelimit/edgelimit/internal/event"
)

// many limits every value of k to 2 an hour, each value a bucket.
const many = `
domain: many
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: 2
`

// envoyAdmits is what Envoy's rate limit filter does with an answer under
// its default settings (failure_mode_deny: false): an error lets the
// request through, as does anything but OVER_LIMIT.
func envoyAdmits(resp *rlsv3.RateLimitResponse, err error) bool {
	return err != nil || resp.GetOverallCode() != over
}

// manyDescs is n descriptors of k, values from..from+n-1.
func manyDescs(from, n int) []*commonv3.RateLimitDescriptor {
	out := make([]*commonv3.RateLimitDescriptor, n)
	for i := range out {
		out[i] = desc("k", fmt.Sprint(from+i))
	}
	return out
}

// TestManyLimitedDescriptorsAreDecided: 17 and 64 limited descriptors
// (two and four limiter calls) are each decided exactly against every
// limit, through a real gRPC client, never answered with an error Envoy
// would let through.
func TestManyLimitedDescriptorsAreDecided(t *testing.T) {
	for _, n := range []int{17, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := startRLS(t, map[string]string{"many.yaml": many}, Config{}, gatewayConfig(), "")
			for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
				resp, err := r.try("many", 0, manyDescs(0, n)...)
				if err != nil || resp.GetOverallCode() != want || len(resp.GetStatuses()) != n {
					t.Fatalf("request %d of %d descriptors: %v, %v; want %v with %d statuses", i+1, n, resp, err, want, n)
				}
				if want == ok {
					for j, st := range resp.GetStatuses() {
						if st.GetLimitRemaining() != uint32(1-i) {
							t.Fatalf("request %d, descriptor %d: %v, want %d remaining", i+1, j, st, 1-i)
						}
					}
				}
			}
		})
	}
}

// TestRefusalByALaterCallGivesBack: a request of 17 descriptors whose
// last is spent is refused, and the 16 before it, charged by the first
// limiter call, are given back before the answer.
func TestRefusalByALaterCallGivesBack(t *testing.T) {
	for _, store := range []string{"", "memory"} { // Redis, then the in-memory store
		t.Run(map[string]string{"": "redis", "memory": "memory"}[store], func(t *testing.T) {
			r := startRLS(t, map[string]string{"many.yaml": many}, Config{}, gatewayConfig(), store)
			r.ask(t, "many", 2, desc("k", "16"))
			for range 3 {
				resp := r.ask(t, "many", 0, manyDescs(0, 17)...)
				if resp.GetOverallCode() != over || resp.GetStatuses()[16].GetCode() != over {
					t.Fatalf("17 descriptors, the last spent: %v, want OVER_LIMIT by the last", resp)
				}
				if st := resp.GetStatuses()[0]; st.GetCode() != ok || st.GetLimitRemaining() != 2 {
					t.Errorf("the first descriptor of the refused request: %v, want OK with 2 remaining (its charge given back)", st)
				}
			}
			if st := r.ask(t, "many", 0, desc("k", "0")).GetStatuses()[0]; st.GetLimitRemaining() != 1 {
				t.Errorf("k=0 after three refused requests: %v, want 1 of 2 remaining: they kept nothing", st)
			}
		})
	}
}

// TestUndecidableIsOverLimit: a request the service cannot decide as sent
// (65 descriptors, a descriptor of 33 entries, a message over
// max_message_bytes) is answered OVER_LIMIT, counted in
// grpc_ratelimit_requests_total{code="over_limit"} and in a decision
// event, so that Envoy refuses it under its default settings; with
// grpc.undecidable: error, it gets the error it used to.
func TestUndecidableIsOverLimit(t *testing.T) {
	wide := desc()
	for i := range MaxEntries + 1 {
		wide.Entries = append(wide.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "k", Value: fmt.Sprint(i)})
	}
	big := desc("k", strings.Repeat("x", 8<<10))
	for _, tc := range []struct {
		name string
		ds   []*commonv3.RateLimitDescriptor
		code codes.Code // under grpc.undecidable: error
	}{
		{"65 descriptors", manyDescs(0, MaxDescriptors+1), codes.InvalidArgument},
		{"33 entries", descs(desc("k", "a"), wide), codes.InvalidArgument},
		{"over max_message_bytes", descs(big), codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRLS(t, map[string]string{"many.yaml": many}, Config{MaxMessageBytes: 4096}, gatewayConfig(), "memory")
			resp, err := r.try("many", 0, tc.ds...)
			if err != nil || envoyAdmits(resp, err) {
				t.Fatalf("ShouldRateLimit = %v, %v; want OVER_LIMIT, which Envoy refuses", resp, err)
			}
			if tc.code != codes.ResourceExhausted && len(resp.GetStatuses()) != len(tc.ds) {
				t.Errorf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(tc.ds))
			}
			if !strings.Contains(string(resp.GetRawBody()), "cannot decide") {
				t.Errorf("raw_body %q, want the problem saying why", resp.GetRawBody())
			}
			if got := testutil.ToFloat64(r.svc.calls.WithLabelValues("over_limit")); got != 1 {
				t.Errorf("grpc_ratelimit_requests_total{code=over_limit} = %v, want 1", got)
			}
			evs := r.events.list()
			if len(evs) != 1 || evs[0].Allowed || evs[0].Mode != event.ModeEnforced {
				t.Fatalf("events %+v, want one denial", evs)
			}
			if tc.code != codes.ResourceExhausted && evs[0].Domain != "many" {
				t.Errorf("event domain %q, want many", evs[0].Domain)
			}

			r = startRLS(t, map[string]string{"many.yaml": many}, Config{MaxMessageBytes: 4096, Undecidable: UndecidableError}, gatewayConfig(), "memory")
			if _, err := r.try("many", 0, tc.ds...); status.Code(err) != tc.code {
				t.Errorf("under grpc.undecidable: error: %v, want %v", err, tc.code)
			}
		})
	}
	// A request within the bounds, right after a refused one, is decided
	// as ever: the refusal consumed nothing and the connection is fine.
	r := startRLS(t, map[string]string{"many.yaml": many}, Config{MaxMessageBytes: 4096}, gatewayConfig(), "memory")
	r.try("many", 0, big)
	if st := r.ask(t, "many", 0, desc("k", "a")).GetStatuses()[0]; st.GetCode() != ok || st.GetLimitRemaining() != 1 {
		t.Errorf("after an oversized request: %v, want OK with 1 remaining", st)
	}
}

// TestNegativeHitsGiveBack: is_negative_hits gives back what the
// descriptor's hits_addend (else the request's, at least 1) names,
// exactly, never above the capacity, and is answered OK; in a request
// that another descriptor's limit refuses, it changes nothing, like
// every descriptor of a refused request.
func TestNegativeHitsGiveBack(t *testing.T) {
	for _, store := range []string{"", "memory"} { // Redis, then the in-memory store
		t.Run(map[string]string{"": "redis", "memory": "memory"}[store], func(t *testing.T) {
			r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), store)
			back := func(n uint64) *commonv3.RateLimitDescriptor {
				d := desc("generic_key", "three")
				d.IsNegativeHits, d.HitsAddend = true, wrap(n)
				return d
			}
			r.ask(t, "test", 3, desc("generic_key", "three"))
			for _, tc := range []struct {
				give uint64
				want uint32
			}{{2, 2}, {1 << 60, 3}} {
				resp, err := r.try("test", 0, back(tc.give))
				if err != nil || resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != tc.want {
					t.Fatalf("give back %d: %v, %v; want OK with %d of 3 remaining", tc.give, resp, err, tc.want)
				}
			}
			for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, ok, over} {
				if got := r.ask(t, "test", 0, desc("generic_key", "three")).GetOverallCode(); got != want {
					t.Fatalf("request %d after the give-backs: %v, want %v (3 of 3, never more)", i+1, got, want)
				}
			}
			// Beside a descriptor over its limit: refused, nothing given back.
			one := desc("generic_key", "one")
			r.ask(t, "test", 0, one)
			if resp := r.ask(t, "test", 0, one, back(3)); resp.GetOverallCode() != over || resp.GetStatuses()[1].GetCode() != ok {
				t.Fatalf("give-back beside a spent limit: %v, want OVER_LIMIT by the spent one", resp)
			}
			if st := r.ask(t, "test", 0, back(0)).GetStatuses()[0]; st.GetLimitRemaining() != 1 {
				t.Errorf("give back 1 (hits_addend 0 counts as 1) after the refused request: %v, want 1 remaining: the refused one gave nothing", st)
			}
			// Charged and given back in one request: charged the difference.
			if st := r.ask(t, "test", 2, desc("generic_key", "three"), back(1)).GetStatuses()[0]; st.GetLimitRemaining() != 0 {
				t.Errorf("charge 2 and give back 1: %v, want 0 remaining", st)
			}
		})
	}
}
