package envoyrls

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// features is one configuration exercising every feature of the format.
const features = `
domain: test
descriptors:
  - key: generic_key
    value: three
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: generic_key
    value: five
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: generic_key
    value: one
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: generic_key
    value: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: generic_key
    value: free
    rate_limit:
      unlimited: true
  - key: prefix
    value: bar*
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: remote_address
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: database
    value: users
    descriptors:
      - key: tenant
        rate_limit:
          unit: minute
          requests_per_unit: 2
  - key: key1
    rate_limit:
      name: limit1
      unit: minute
      requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 1
      replaces:
        - name: limit1
`

func TestOverLimitAfterTheLimit(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	for i := range 3 {
		resp := r.ask(t, "test", 0, desc("generic_key", "three"))
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != ok || st.GetCode() != ok || st.GetLimitRemaining() != uint32(2-i) {
			t.Fatalf("request %d: overall %v, status %v, want OK with %d remaining", i+1, resp.GetOverallCode(), st, 2-i)
		}
		if got := st.GetCurrentLimit(); got.GetRequestsPerUnit() != 3 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || got.GetName() != "test.generic_key_three" {
			t.Errorf("current_limit = %v, want 3 per MINUTE named test.generic_key_three", got)
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("duration_until_reset = %v, want within a minute", d)
		}
		if resp.GetRawBody() != nil || header(resp, "content-type") != "" {
			t.Errorf("allowed with a body %q", resp.GetRawBody())
		}
		if got, want := header(resp, "x-ratelimit-remaining"), []string{"2", "1", "0"}[i]; got != want {
			t.Errorf("x-ratelimit-remaining = %q, want %q", got, want)
		}
	}
	resp := r.ask(t, "test", 0, desc("generic_key", "three"))
	if resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != over {
		t.Fatalf("4th request: %v, want OVER_LIMIT", resp)
	}
	if header(resp, "x-ratelimit-limit") != "3" || header(resp, "retry-after") == "" {
		t.Errorf("headers %v, want x-ratelimit-limit 3 and a retry-after", resp.GetResponseHeadersToAdd())
	}
	if got := header(resp, "ratelimit-policy"); got != `"test.generic_key_three";q=3;w=60` {
		t.Errorf("ratelimit-policy = %q", got)
	}
	if body := string(resp.GetRawBody()); !strings.Contains(body, `"violated_rules":[{"name":"test.generic_key_three"`) || header(resp, "content-type") != "application/problem+json" {
		t.Errorf("raw_body %s, content-type %q: want the problem naming the descriptor", body, header(resp, "content-type"))
	}
	if got := testutil.ToFloat64(r.svc.calls.WithLabelValues("over_limit")); got != 1 {
		t.Errorf("grpc_ratelimit_requests_total{code=over_limit} = %v, want 1", got)
	}
}

func TestHitsAddendIsTheCost(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	if st := r.ask(t, "test", 2, desc("generic_key", "five")).GetStatuses()[0]; st.GetLimitRemaining() != 3 {
		t.Fatalf("hits_addend 2 of 5: remaining %d, want 3", st.GetLimitRemaining())
	}
	d := desc("generic_key", "five")
	d.HitsAddend = wrap(3)
	if st := r.ask(t, "test", 1, d).GetStatuses()[0]; st.GetLimitRemaining() != 0 || st.GetCode() != ok {
		t.Fatalf("descriptor hits_addend 3 over request's 1: %v, want OK with 0 remaining", st)
	}
	if resp := r.ask(t, "test", 0, desc("generic_key", "five")); resp.GetOverallCode() != over {
		t.Fatalf("after 5 of 5: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
}

// TestHitsAddendPerDescriptor: each descriptor is charged its own
// hits_addend (tokens on one, requests on another, as Envoy AI Gateway
// sends them), in one atomic call: a request whose tokens do not fit is
// OVER_LIMIT and charges neither descriptor. Until issue #12 different
// values were refused with INVALID_ARGUMENT, which Envoy's default
// failure_mode_deny: false let through unlimited.
func TestHitsAddendPerDescriptor(t *testing.T) {
	const ai = `
domain: ai
descriptors:
  - key: tokens
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: requests
    rate_limit:
      unit: minute
      requests_per_unit: 100
`
	for _, algo := range []limiter.Algorithm{limiter.TokenBucket, limiter.SlidingWindow} {
		t.Run(string(algo), func(t *testing.T) {
			r := startRLS(t, map[string]string{"ai.yaml": ai}, Config{Algorithm: algo}, gatewayConfig(), "")
			ask := func() *rlsv3.RateLimitResponse {
				tokens := desc("tokens", "tenant-a")
				tokens.HitsAddend = wrap(5)
				requests := desc("requests", "tenant-a")
				requests.HitsAddend = wrap(1)
				return r.ask(t, "ai", 0, tokens, requests)
			}
			var rem []uint32 // the requests descriptor's remaining, request by request
			for i, want := range []uint32{5, 0} {
				resp := ask()
				tok, req := resp.GetStatuses()[0], resp.GetStatuses()[1]
				// 10 a minute refill one token in 6s; a test's seconds may
				// refill one at most.
				if resp.GetOverallCode() != ok || tok.GetLimitRemaining() < want || tok.GetLimitRemaining() > want+1 {
					t.Fatalf("request %d: %v, tokens %v: want OK with %d tokens remaining (5 each)", i+1, resp.GetOverallCode(), tok, want)
				}
				if got := req.GetLimitRemaining(); got < uint32(98-i) || got > uint32(100-i) {
					t.Fatalf("request %d: requests remaining %d, want %d (1 each)", i+1, got, 99-i)
				}
				rem = append(rem, req.GetLimitRemaining())
			}
			resp := ask()
			tok, req := resp.GetStatuses()[0], resp.GetStatuses()[1]
			if resp.GetOverallCode() != over || tok.GetCode() != over || req.GetCode() != ok {
				t.Fatalf("request 3: %v, tokens %v, requests %v: want OVER_LIMIT on the tokens alone", resp.GetOverallCode(), tok.GetCode(), req.GetCode())
			}
			// Nothing consumed: what the requests descriptor has left only
			// grows (by refill), never drops by the denied request's 1.
			if got := req.GetLimitRemaining(); got < rem[1] {
				t.Errorf("requests remaining after the denied request %d, was %d: the denied request charged it", got, rem[1])
			}
			// The call's cost is the request's hits_addend (0: 1).
			for _, e := range r.events.list() {
				if e.Cost != 1 {
					t.Errorf("decision event cost %d, want the request's 1", e.Cost)
				}
			}
			// Two descriptors of one bucket are one rule, charged once at
			// the higher of their costs: 7 of 10, not 2 and not 9.
			small, big := desc("tokens", "tenant-b"), desc("tokens", "tenant-b")
			small.HitsAddend, big.HitsAddend = wrap(2), wrap(7)
			resp = r.ask(t, "ai", 0, small, big)
			for i, st := range resp.GetStatuses() {
				if st.GetCode() != ok || st.GetLimitRemaining() < 3 || st.GetLimitRemaining() > 4 {
					t.Errorf("one bucket at 2 and 7: status %d %v, want OK with 3 remaining", i, st)
				}
			}
		})
	}
}

// TestHugeHitsAddendCountsInFull: a descriptor's hits_addend (a uint64,
// e.g. bytes sent) above 2^31 is charged in full, never cut down to a
// smaller cost that fits under the limit.
func TestHugeHitsAddendCountsInFull(t *testing.T) {
	const bytes = `
domain: bytes
descriptors:
  - key: tenant
    rate_limit:
      unit: year
      requests_per_unit: 4000000000
`
	r := startRLS(t, map[string]string{"bytes.yaml": bytes}, Config{}, gatewayConfig(), "")
	// 4e9 a year refill 127 a second: the remaining count after one 3e9
	// hit is 1e9 plus what a test's seconds refill, far below 1.1e9.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		d := desc("tenant", "acme")
		d.HitsAddend = wrap(3_000_000_000)
		st := r.ask(t, "bytes", 1, d).GetStatuses()[0]
		if rem := st.GetLimitRemaining(); st.GetCode() != want || rem < 1_000_000_000 || rem >= 1_100_000_000 {
			t.Errorf("hits_addend 3e9 #%d of a 4e9 limit: %v with %d remaining, want %v with 1e9 (and what refilled since)", i+1, st.GetCode(), rem, want)
		}
	}
	// Above any capacity: refused, whatever the value's size.
	d := desc("tenant", "other")
	d.HitsAddend = wrap(math.MaxUint64)
	if st := r.ask(t, "bytes", 1, d).GetStatuses()[0]; st.GetCode() != over {
		t.Errorf("hits_addend 2^64-1: %v, want OVER_LIMIT", st.GetCode())
	}
}

func TestAllOrNothingAcrossDescriptors(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	five, one := desc("generic_key", "five"), desc("generic_key", "one")
	resp := r.ask(t, "test", 0, five, one)
	if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != 4 || resp.GetStatuses()[1].GetLimitRemaining() != 0 {
		t.Fatalf("first: %v", resp)
	}
	resp = r.ask(t, "test", 0, five, one)
	if resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != ok || resp.GetStatuses()[1].GetCode() != over {
		t.Fatalf("second: %v, want OVER_LIMIT by the second descriptor only", resp)
	}
	// The denied request consumed nothing, not even the descriptor that
	// would have admitted it.
	if st := r.ask(t, "test", 0, five).GetStatuses()[0]; st.GetLimitRemaining() != 3 {
		t.Fatalf("five alone after a denial: remaining %d, want 3 (4 before, the denial consumed none)", st.GetLimitRemaining())
	}
}

func TestShadowModeNeverDenies(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	for i := range 3 {
		resp := r.ask(t, "test", 0, desc("generic_key", "shadow"))
		if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCode() != ok {
			t.Fatalf("shadow request %d: %v, want OK", i+1, resp)
		}
	}
	var shadow int
	for _, e := range r.events.list() {
		if e.Mode == event.ModeShadow {
			shadow++
		}
	}
	if shadow != 2 {
		t.Errorf("%d events in shadow mode, want 2 (the requests over the limit)", shadow)
	}
	// Global shadow mode: an enforced descriptor over its limit is OK too.
	r = startRLS(t, map[string]string{"test.yaml": features}, Config{ShadowMode: true}, gatewayConfig(), "")
	for range 2 {
		if resp := r.ask(t, "test", 0, desc("generic_key", "one")); resp.GetOverallCode() != ok {
			t.Fatalf("global shadow_mode: %v, want OK", resp)
		}
	}
}

func TestUnlimitedReplacesAndUnknown(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	for range 3 {
		st := r.ask(t, "test", 0, desc("generic_key", "free")).GetStatuses()[0]
		if st.GetCode() != ok || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != math.MaxUint32 {
			t.Fatalf("unlimited: %v, want OK, no current_limit, all remaining", st)
		}
	}
	// key2 replaces key1's limit1: only key2 is checked.
	resp := r.ask(t, "test", 0, desc("key1", "a"), desc("key2", "b"))
	if st := resp.GetStatuses()[0]; st.GetCurrentLimit() != nil || st.GetCode() != ok {
		t.Errorf("replaced key1: %v, want OK without a limit", st)
	}
	if st := resp.GetStatuses()[1]; st.GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Errorf("key2: %v, want its 1/min", st)
	}
	if resp := r.ask(t, "test", 0, desc("key1", "a"), desc("key2", "b")); resp.GetOverallCode() != over {
		t.Errorf("key2 twice: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	// Without key2, key1's limit applies.
	if st := r.ask(t, "test", 0, desc("key1", "a")).GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetLimitRemaining() != 9 {
		t.Errorf("key1 alone: %v, want 10/min with 9 remaining", st)
	}
	// Unknown descriptors, deeper requests and unknown domains have no limit.
	for _, tc := range []struct {
		domain string
		d      *commonv3.RateLimitDescriptor
	}{
		{"test", desc("nothing", "here")},
		{"test", desc("generic_key", "three", "extra", "entry")},
		{"test", desc("database", "users")},
		{"nosuch", desc("generic_key", "three")},
	} {
		st := r.ask(t, tc.domain, 0, tc.d).GetStatuses()[0]
		if st.GetCode() != ok || st.GetCurrentLimit() != nil {
			t.Errorf("%s %v: %v, want OK without a limit", tc.domain, tc.d, st)
		}
	}
}

func TestWildcardsAndAnyValue(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	check := func(d *commonv3.RateLimitDescriptor, want rlsv3.RateLimitResponse_Code, limited bool) {
		t.Helper()
		st := r.ask(t, "test", 0, d).GetStatuses()[0]
		if st.GetCode() != want || (st.GetCurrentLimit() != nil) != limited {
			t.Errorf("%v: %v, want %v (limited %v)", d, st, want, limited)
		}
	}
	check(desc("prefix", "bar1"), ok, true)
	check(desc("prefix", "bar1"), over, true)
	check(desc("prefix", "bar2"), ok, true) // each value its own bucket
	check(desc("prefix", "baz"), ok, false)
	// Any value: each address counts apart.
	check(desc("remote_address", "10.0.0.1"), ok, true)
	check(desc("remote_address", "10.0.0.1"), ok, true)
	check(desc("remote_address", "10.0.0.1"), over, true)
	check(desc("remote_address", "10.0.0.2"), ok, true)
	// Nested: database=users, then any tenant.
	check(desc("database", "users", "tenant", "a"), ok, true)
	check(desc("database", "users", "tenant", "a"), ok, true)
	check(desc("database", "users", "tenant", "a"), over, true)
	check(desc("database", "users", "tenant", "b"), ok, true)
	check(desc("database", "other", "tenant", "a"), ok, false)

	var withIP bool
	for _, e := range r.events.list() {
		if strings.Contains(e.KeyID, "10.0.0") || strings.Contains(e.KeyID, "tenant") {
			t.Errorf("event key id %q holds a descriptor value", e.KeyID)
		}
		if e.Route != "envoy:test" || e.Plan != "test" || e.Method != "ShouldRateLimit" {
			t.Errorf("event route %q plan %q method %q, want envoy:test, test, ShouldRateLimit", e.Route, e.Plan, e.Method)
		}
		withIP = withIP || e.ClientIP == "10.0.0.1"
	}
	if !withIP {
		t.Error("no event carries remote_address as the client IP")
	}
}

func TestLimitOverrides(t *testing.T) {
	override := func(d *commonv3.RateLimitDescriptor, n uint32) *commonv3.RateLimitDescriptor {
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_HOUR}
		return d
	}
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	st := r.ask(t, "test", 0, override(desc("generic_key", "three"), 100)).GetStatuses()[0]
	if st.GetCurrentLimit().GetRequestsPerUnit() != 100 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || st.GetLimitRemaining() != 99 {
		t.Fatalf("honored override: %v, want 100/HOUR with 99 remaining", st)
	}
	// An override applies to descriptors the config does not limit, too.
	if st := r.ask(t, "test", 0, override(desc("unconfigured", "x"), 7)).GetStatuses()[0]; st.GetLimitRemaining() != 6 {
		t.Fatalf("override of an unconfigured descriptor: %v, want 6 remaining", st)
	}

	// An override of 0 blocks, as a configured 0 does: OVER_LIMIT, not an
	// error that Envoy (failure_mode_deny false) would let through.
	if resp := r.ask(t, "test", 0, override(desc("generic_key", "three"), 0), desc("generic_key", "three")); resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != over {
		t.Fatalf("override of 0: %v, want OVER_LIMIT on it", resp)
	}

	// An override this service cannot count as sent blocks too: a unit
	// Envoy parses from metadata ("UNKNOWN") or none of its own, or a
	// period over limiter.MaxPeriod. An error would be let through.
	for _, lo := range []*commonv3.RateLimitDescriptor_RateLimitOverride{
		{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_UNKNOWN},
		{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit(99)},
		{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_DAY, UnitMultiplier: wrapperspb.UInt32(1000)},
	} {
		d := desc("generic_key", "three")
		d.Limit = lo
		resp, err := r.try("test", 0, d)
		if err != nil || resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != over {
			t.Errorf("override %v: %v, %v; want OVER_LIMIT on it", lo, resp, err)
		}
	}

	r = startRLS(t, map[string]string{"test.yaml": features}, Config{LimitOverrides: OverridesIgnore}, gatewayConfig(), "")
	if st := r.ask(t, "test", 0, override(desc("generic_key", "three"), 100)).GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 3 {
		t.Fatalf("ignored override: %v, want the configured 3", st)
	}
	r = startRLS(t, map[string]string{"test.yaml": features}, Config{LimitOverrides: OverridesReject}, gatewayConfig(), "")
	if _, err := r.try("test", 0, override(desc("generic_key", "three"), 100)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("rejected override: %v, want InvalidArgument", err)
	}
}

// TestOverrideOfTheSameEntries: a request holding one descriptor's entries
// twice, under the configured limit (3 a minute) and under a stricter
// override (1 an hour), is held to both: the override's descriptor is not
// answered by the configured one's bucket, which admitted 3.
func TestOverrideOfTheSameEntries(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	ask := func() *rlsv3.RateLimitResponse {
		strict := desc("generic_key", "three")
		strict.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		return r.ask(t, "test", 0, desc("generic_key", "three"), strict)
	}
	if resp := ask(); resp.GetOverallCode() != ok || resp.GetStatuses()[1].GetLimitRemaining() != 0 {
		t.Fatalf("first request: %v, override's status %v: want OK with 0 of 1 remaining", resp.GetOverallCode(), resp.GetStatuses()[1])
	}
	resp := ask()
	if plain, strict := resp.GetStatuses()[0], resp.GetStatuses()[1]; resp.GetOverallCode() != over || strict.GetCode() != over || plain.GetCode() != ok {
		t.Fatalf("second request: %v, configured %v, override %v: want OVER_LIMIT on the override's 1 an hour", resp.GetOverallCode(), plain, strict)
	}
}

// failurePolicies are what each failure policy answers, and the mode its
// decisions carry, while Redis cannot decide.
var failurePolicies = []struct {
	policy gateway.FailurePolicy
	want   rlsv3.RateLimitResponse_Code
	mode   event.Mode
}{
	{gateway.FailOpen, ok, event.ModeFailOpen},
	{gateway.FailClosed, over, event.ModeFailClosed},
	{gateway.FailLocal, ok, event.ModeLocalFallback},
}

func TestFailurePoliciesWithRedisStopped(t *testing.T) {
	for _, tc := range failurePolicies {
		t.Run(string(tc.policy), func(t *testing.T) {
			srv := testenv.Private(t, "redis")
			// The default 1s deadline: a loaded machine must not fail the
			// call with Redis up; a stopped Redis refuses at once.
			r := startRLS(t, map[string]string{"test.yaml": features}, Config{FailurePolicy: tc.policy}, gatewayConfig(), srv.Get(t, "EDGELIMIT_REDIS_ADDR"))
			if resp := r.ask(t, "test", 0, desc("generic_key", "one")); resp.GetOverallCode() != ok {
				t.Fatalf("with Redis: %v", resp.GetOverallCode())
			}
			srv.Halt(t)
			resp := r.ask(t, "test", 0, desc("generic_key", "five"))
			if resp.GetOverallCode() != tc.want {
				t.Fatalf("Redis stopped, policy %s: %v, want %v", tc.policy, resp.GetOverallCode(), tc.want)
			}
			if tc.policy == gateway.FailClosed && header(resp, "retry-after") == "" {
				t.Errorf("failed closed without retry-after: %v", resp.GetResponseHeadersToAdd())
			}
			evs := r.events.list()
			if last := evs[len(evs)-1]; last.Mode != tc.mode {
				t.Errorf("event mode %v, want %v", last.Mode, tc.mode)
			}
		})
	}
}

// TestFailurePolicyBeforeCallerDeadline hangs Redis (CLIENT PAUSE) and asks
// with a timeout shorter than the store deadline (as Envoy's default 20ms
// is shorter than the default 25ms; here 200ms against 1s, so that a
// loaded machine answers in the fifth left): the failure policy must
// answer before the caller gives up. An answer that
// comes too late is a DeadlineExceeded, which Envoy's default
// failure_mode_deny: false lets through whatever the policy.
func TestFailurePolicyBeforeCallerDeadline(t *testing.T) {
	for _, tc := range failurePolicies {
		t.Run(string(tc.policy), func(t *testing.T) {
			srv := testenv.Private(t, "redis")
			addr := srv.Get(t, "EDGELIMIT_REDIS_ADDR")
			r := startRLS(t, map[string]string{"test.yaml": features}, Config{FailurePolicy: tc.policy}, gatewayConfig(), addr)
			if resp := r.ask(t, "test", 0, desc("generic_key", "one")); resp.GetOverallCode() != ok {
				t.Fatalf("with Redis: %v", resp.GetOverallCode())
			}
			admin := redis.NewClient(&redis.Options{Addr: addr})
			defer admin.Close()
			if err := admin.Do(context.Background(), "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
			before := len(r.events.list())
			for i := range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", fmt.Sprint("10.0.0.", i))}})
				cancel()
				if err != nil {
					t.Fatalf("request %d, Redis hung, policy %s: %v, want the policy's %v", i, tc.policy, err, tc.want)
				}
				if resp.GetOverallCode() != tc.want {
					t.Fatalf("request %d, Redis hung, policy %s: %v, want %v", i, tc.policy, resp.GetOverallCode(), tc.want)
				}
			}
			evs := r.events.list()[before:]
			if len(evs) != 5 {
				t.Fatalf("%d events for 5 requests", len(evs))
			}
			for _, e := range evs {
				if e.Mode != tc.mode || e.StoreStatus != event.StoreTimeout {
					t.Errorf("event mode %v, store %v; want %v, %v", e.Mode, e.StoreStatus, tc.mode, event.StoreTimeout)
				}
			}
		})
	}
}

func TestConcurrentClientsAdmitExactlyTheLimit(t *testing.T) {
	r := startRLS(t, map[string]string{"c.yaml": "domain: conc\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 50}\n"},
		Config{}, gatewayConfig(), "")
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := r.try("conc", 0, desc("k", "same"))
				if err != nil {
					t.Error(err)
					return
				}
				if resp.GetOverallCode() == ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 50 {
		t.Fatalf("10 clients × 10 requests at 50/hour: %d admitted, want exactly 50", got)
	}
}

func TestHealthAndReflection(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(r.conn)
	for _, svc := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v, want SERVING", svc, resp, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range msg.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, " "), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection lists %v, want the rate limit service", names)
	}
	r.svc.Drain()
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after Drain: %v %v, want NOT_SERVING", resp, err)
	}
}

// TestHealthWaitsForReady: with Options.Ready the door says NOT_SERVING
// until the gateway can decide, then SERVING; drained first, it stays
// NOT_SERVING.
func TestHealthWaitsForReady(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(features), 0o644); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gatewayConfig(), gateway.Options{})
	if err != nil {
		t.Fatal(err)
	}
	status := func(s *Service) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := s.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	for _, drainFirst := range []bool{false, true} {
		ready := make(chan struct{})
		s, err := New(Config{Listen: "127.0.0.1:0", ConfigDir: dir}, gw, Options{Ready: ready})
		if err != nil {
			t.Fatal(err)
		}
		if got := status(s); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health before ready = %v, want NOT_SERVING", got)
		}
		want := healthpb.HealthCheckResponse_SERVING
		if drainFirst {
			s.Drain()
			want = healthpb.HealthCheckResponse_NOT_SERVING
		}
		close(ready)
		testenv.WaitFor(t, 10*time.Second, "health to follow readiness", func() bool { return status(s) == want })
		if drainFirst {
			// Give the waiting goroutine its chance to (wrongly) switch.
			time.Sleep(50 * time.Millisecond)
			if got := status(s); got != want {
				t.Errorf("health of a drained door once ready = %v, want NOT_SERVING", got)
			}
		}
	}
}

// TestBadRequests: what Envoy never sends (its filter requires a domain,
// and sends no request without a descriptor) is an error; everything it
// can send is decided (TestUndecidableIsOverLimit).
func TestBadRequests(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	for _, tc := range []struct {
		name   string
		domain string
		ds     []*commonv3.RateLimitDescriptor
	}{
		{"no domain", "", []*commonv3.RateLimitDescriptor{desc("a", "b")}},
		{"no descriptors", "test", nil},
	} {
		if _, err := r.try(tc.domain, 0, tc.ds...); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
}

func TestReloadSwapsTheRules(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	if st := r.ask(t, "test", 0, desc("generic_key", "three")).GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 3 {
		t.Fatalf("before reload: %v", st)
	}
	cfg := Config{Listen: "127.0.0.1:0", ConfigDir: t.TempDir()}
	if err := r.svc.Reload(cfg); err == nil {
		// An empty directory is valid: no domains.
		if st := r.ask(t, "test", 0, desc("generic_key", "three")).GetStatuses()[0]; st.GetCurrentLimit() != nil {
			t.Fatalf("after reload to no domains: %v", st)
		}
	} else {
		t.Fatalf("Reload(empty dir): %v", err)
	}
	bad := Config{Listen: "127.0.0.1:0", ConfigDir: r.dir}
	writeFile(t, r.dir, "broken.yaml", "domain: test2\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if err := r.svc.Reload(bad); err == nil || !strings.Contains(err.Error(), "invalid rate limit unit 'fortnight'") {
		t.Fatalf("Reload(bad unit) = %v, want the unit named", err)
	}
	// The previous rules (none) are still in force.
	if st := r.ask(t, "test", 0, desc("generic_key", "three")).GetStatuses()[0]; st.GetCurrentLimit() != nil {
		t.Fatalf("after a failed reload: %v, want the previous (empty) rules", st)
	}
}

// TestReadmeExamplesBehave serves envoyproxy/ratelimit's README examples
// as they are and checks what the README says of them.
func TestReadmeExamplesBehave(t *testing.T) {
	r := startRLS(t, readmeExamples, Config{}, gatewayConfig(), "")
	// Example 2: both descriptors in one request, 5 a day for marketing
	// to one number; the number's own 100 a day counts those 5 too.
	marketing, number := desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111")
	for i := range 5 {
		if resp := r.ask(t, "messaging", 0, marketing, number); resp.GetOverallCode() != ok {
			t.Fatalf("example 2, request %d: %v", i+1, resp)
		}
	}
	resp := r.ask(t, "messaging", 0, marketing, number)
	if resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != over || resp.GetStatuses()[1].GetCode() != ok {
		t.Fatalf("example 2, 6th marketing message: %v, want OVER_LIMIT by the marketing limit", resp)
	}
	if st := r.ask(t, "messaging", 0, number).GetStatuses()[0]; st.GetCode() != ok || st.GetLimitRemaining() != 94 {
		t.Fatalf("example 2, a plain message: %v, want OK with 94 of 100 left", st)
	}
	// Example 3: the listed address is blocked, others get 10 a second.
	if resp := r.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.5")); resp.GetOverallCode() != over {
		t.Errorf("example 3, blocked address: %v, want OVER_LIMIT", resp)
	}
	if resp := r.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.1")); resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Errorf("example 3, other address: %v, want OK with 9 left", resp)
	}
	// All-or-nothing with a blocked descriptor: the other is not consumed.
	if resp := r.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.1"), desc("remote_address", "50.0.0.5")); resp.GetOverallCode() != over ||
		resp.GetStatuses()[0].GetCode() != ok || resp.GetStatuses()[1].GetCode() != over || resp.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit() != 0 {
		t.Errorf("example 3, both addresses: %v, want OVER_LIMIT by the blocked one", resp)
	}
	if st := r.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.1")).GetStatuses()[0]; st.GetLimitRemaining() < 8 {
		t.Errorf("example 3, after a blocked request: %v, want 8 (or more, refilled) left", st)
	}
	// Example 5: unlimited.
	if st := r.ask(t, "internal", 0, desc("ldap", "x")).GetStatuses()[0]; st.GetLimitRemaining() != math.MaxUint32 {
		t.Errorf("example 5, ldap: %v, want MaxUint32 remaining", st)
	}
	// Example 6: user-a in shadow mode is never limited, user-b is.
	for range 12 {
		if resp := r.ask(t, "example6", 0, desc("service", "auth-service", "user", "user-a")); resp.GetOverallCode() != ok {
			t.Fatalf("example 6, user-a: %v, want OK always", resp)
		}
	}
	// Example 7: with both descriptors, the 10/s limit replaces the 5/s one.
	one, two := desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")
	for i := range 10 {
		resp := r.ask(t, "example7", 0, one, two)
		if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("example 7, request %d: %v, want OK with the first limit replaced", i+1, resp)
		}
	}
	// Example 11: files/* share one threshold of 10, files_no_share/* do not.
	for i, f := range []string{"a.pdf", "a.pdf", "a.pdf", "a.pdf", "a.pdf", "b.csv", "b.csv", "b.csv", "b.csv", "b.csv"} {
		if resp := r.ask(t, "example11", 0, desc("files", "files/"+f)); resp.GetOverallCode() != ok {
			t.Fatalf("example 11, shared request %d: %v", i+1, resp)
		}
	}
	if resp := r.ask(t, "example11", 0, desc("files", "files/c.txt")); resp.GetOverallCode() != over {
		t.Errorf("example 11, files/c.txt after 10 shared: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	for range 10 {
		r.ask(t, "example11", 0, desc("files_no_share", "files_no_share/a.pdf"))
	}
	if resp := r.ask(t, "example11", 0, desc("files_no_share", "files_no_share/b.csv")); resp.GetOverallCode() != ok {
		t.Errorf("example 11, files_no_share/b.csv: %v, want OK (its own threshold)", resp.GetOverallCode())
	}
	// The replaced 5/s limit was not affected: its own bucket is full.
	if st := r.ask(t, "example7", 0, one).GetStatuses()[0]; st.GetLimitRemaining() != 4 {
		t.Errorf("example 7, key_1 alone: %v, want 4 of 5 left (untouched by the replaced requests)", st)
	}
}

// TestOnRedisCluster: a request's descriptors live in one slot (the
// domain's hash tag), so the one call works on Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, limiter.Config{Prefix: "rlscluster" + randHex(6)})
	if err != nil {
		t.Fatal(err)
	}
	r := startRLSOn(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), lim)
	five, one := desc("generic_key", "five"), desc("generic_key", "one")
	if resp := r.ask(t, "test", 0, five, one, desc("remote_address", "10.1.1.1")); resp.GetOverallCode() != ok || resp.GetStatuses()[1].GetLimitRemaining() != 0 {
		t.Fatalf("first on the cluster: %v", resp)
	}
	if resp := r.ask(t, "test", 0, five, one); resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != ok {
		t.Fatalf("second on the cluster: %v, want OVER_LIMIT by the second descriptor", resp)
	}
	if evs := r.events.list(); evs[len(evs)-1].StoreStatus != event.StoreOK {
		t.Errorf("store status %v, want ok (Redis decided, no CROSSSLOT)", evs[len(evs)-1].StoreStatus)
	}
}

// TestOverrideCountsInOneBucketWithOrWithoutItsPair: a caller that sends
// a descriptor under a stricter override (1 an hour) sometimes alone and
// sometimes beside the same entries under their configured limit (3 a
// minute), in either order, counts each limit in one bucket: the
// override's one an hour is spent by the first request, whichever shape
// the next one has.
func TestOverrideCountsInOneBucketWithOrWithoutItsPair(t *testing.T) {
	strict := func() *commonv3.RateLimitDescriptor {
		d := desc("generic_key", "three")
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		return d
	}
	for _, tc := range []struct {
		name          string
		first, second []*commonv3.RateLimitDescriptor
		strictAt      int // the override's index in second
	}{
		{"alone then pair", descs(strict()), descs(desc("generic_key", "three"), strict()), 1},
		{"alone then pair, override first", descs(strict()), descs(strict(), desc("generic_key", "three")), 0},
		{"pair then alone", descs(desc("generic_key", "three"), strict()), descs(strict()), 0},
		{"pair then pair reversed", descs(desc("generic_key", "three"), strict()), descs(strict(), desc("generic_key", "three")), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "memory")
			if resp := r.ask(t, "test", 0, tc.first...); resp.GetOverallCode() != ok {
				t.Fatalf("first request: %v, want OK", resp)
			}
			resp := r.ask(t, "test", 0, tc.second...)
			if resp.GetOverallCode() != over || resp.GetStatuses()[tc.strictAt].GetCode() != over {
				t.Fatalf("second request: %v, want OVER_LIMIT on the override's 1 an hour, spent by the first", resp)
			}
		})
	}
	// The configured limit, too, is one bucket in every shape: 3 a minute.
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "memory")
	r.ask(t, "test", 0, desc("generic_key", "three"))
	r.ask(t, "test", 0, strict(), desc("generic_key", "three"))
	if st := r.ask(t, "test", 0, desc("generic_key", "three")).GetStatuses()[0]; st.GetCode() != ok || st.GetLimitRemaining() != 0 {
		t.Errorf("third of 3 a minute, the second beside an override: %v, want OK with 0 remaining", st)
	}
}
