package envoyrls

import (
	"math"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/limiter"
)

// sortHeaders orders headers by name, so answers are deterministic.
func sortHeaders(hs []*corev3.HeaderValue) {
	slices.SortStableFunc(hs, func(a, b *corev3.HeaderValue) int { return strings.Compare(a.Key, b.Key) })
}

// result is the decision's result for the rule of bucket, if a store
// decided it.
func result(v gateway.Verdict, bucket string) (limiter.RuleResult, bool) {
	if !v.Known {
		return limiter.RuleResult{}, false
	}
	for _, rr := range v.Decision.Rules {
		if rr.Rule.Bucket == bucket {
			return rr, true
		}
	}
	return limiter.RuleResult{}, false
}

// lowerNames are the header names the gateway sets, in the lower case
// gRPC metadata and HTTP/2 want, made once.
var lowerNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining",
		"X-Ratelimit-Reset", "Retry-After", "Content-Type"} {
		m[k] = strings.ToLower(k)
	}
	return m
}()

func lowerName(k string) string {
	if l, ok := lowerNames[k]; ok {
		return l
	}
	return strings.ToLower(k)
}

// unchecked is the status of a descriptor without a rule to check:
// ratelimit's answer, OK with no current limit; an unlimited one has all
// of its (unbounded) limit remaining.
func unchecked(p pick) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: p.current}
	if p.unlimited {
		st.LimitRemaining = math.MaxUint32
	}
	return st
}
