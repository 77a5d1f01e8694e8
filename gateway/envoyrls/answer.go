package envoyrls

import (
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

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

// answer fills resp from the store's verdict v on check c: each
// descriptor's status, the problem body over the limit, and the
// rate-limit headers Enforce wrote into h.
func answer(resp *rlsv3.RateLimitResponse, cfg Config, c check, v gateway.Verdict, h http.Header) {
	// One allocation for the statuses and one for their durations.
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(c.picks))
	durs := make([]durationpb.Duration, len(c.picks))
	for i, p := range c.picks {
		if p.rule < 0 {
			resp.Statuses[i] = unchecked(p)
			continue
		}
		st := &sts[i]
		st.Code, st.CurrentLimit = rlsv3.RateLimitResponse_OK, p.current
		rr, ok := result(v, c.rules[p.rule].Bucket)
		switch {
		case ok:
			if !rr.Allowed && !rr.Rule.Shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			st.LimitRemaining = uint32(min(max(0, rr.Remaining), math.MaxUint32))
			d := &durs[i]
			d.Seconds, d.Nanos = int64(rr.ResetAfter/time.Second), int32(rr.ResetAfter%time.Second)
			st.DurationUntilReset = d
		case !v.Known && !v.Allowed:
			// Failed closed: every checked descriptor refuses.
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
	}
	if !v.Allowed && len(v.Problem) > 0 && *cfg.ProblemBody {
		// Envoy sends raw_body as the 429's body: the same problem the
		// HTTP door answers, naming the violated descriptors.
		resp.RawBody = v.Problem
		h["Content-Type"] = []string{"application/problem+json"}
	}
	if *cfg.ResponseHeaders {
		n := 0
		for _, vs := range h {
			n += len(vs)
		}
		hvs := make([]corev3.HeaderValue, 0, n)
		resp.ResponseHeadersToAdd = make([]*corev3.HeaderValue, 0, n)
		for k, vs := range h {
			for _, val := range vs {
				hvs = append(hvs, corev3.HeaderValue{Key: lowerName(k), Value: val})
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &hvs[len(hvs)-1])
			}
		}
		sortHeaders(resp.ResponseHeadersToAdd)
	}
}
