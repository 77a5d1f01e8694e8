package gateway

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// Header names, canonical so they can be set without re-canonicalising.
const (
	hLimit      = "X-Ratelimit-Limit"
	hRemaining  = "X-Ratelimit-Remaining"
	hReset      = "X-Ratelimit-Reset"
	hPolicy     = "Ratelimit-Policy"
	hRateLimit  = "Ratelimit"
	hRetryAfter = "Retry-After"
)

// rateHeaders are the headers a gateway owns; upstream copies are dropped.
var rateHeaders = []string{hLimit, hRemaining, hReset, hPolicy, hRateLimit, hReserved, hSettled}

// setRateHeaders writes the rate-limit headers wherever their values are
// known: RateLimit-Policy from the rules in force (always known), the rest
// from the limiter's decision (unknown when the store failed open or
// closed). Shadow rules stay invisible to clients. It allocates the
// headers' value slices once and their varying text once: a header per
// allocation was a third of the request path's garbage.
func setRateHeaders(h http.Header, v verdict) {
	policy := v.policy
	if policy == "" {
		policy = policyHeader(v.rules)
	}
	decided := v.known && len(v.d.Rules) > 0
	if !decided {
		if policy != "" {
			h[hPolicy] = []string{policy}
		}
		return
	}
	// Every value but the policy, in one buffer and then one string:
	// RateLimit, then X-RateLimit-Limit, -Remaining and -Reset.
	var arr [256]byte
	b := appendRateList(arr[:0], v.d.Rules)
	rl := len(b)
	bind := v.d.BindingRule()
	visible := !bind.Rule.Shadow
	var ends [3]int
	if visible {
		for i, n := range [3]int64{bind.Rule.Capacity(), bind.Remaining, seconds(resetOf(bind))} {
			b = strconv.AppendInt(b, n, 10)
			ends[i] = len(b)
		}
	}
	text := string(b)
	vals := make([]string, 0, 5)
	add := func(k, val string) {
		vals = append(vals, val)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if policy != "" {
		add(hPolicy, policy)
	}
	if rl > 0 {
		add(hRateLimit, text[:rl])
	}
	if visible {
		add(hLimit, text[rl:ends[0]])
		add(hRemaining, text[ends[0]:ends[1]])
		add(hReset, text[ends[1]:ends[2]])
	}
}

// appendRateList appends the RateLimit value of rr: each enforced rule's
// remaining units and seconds until full.
func appendRateList(b []byte, rr []limiter.RuleResult) []byte {
	start := len(b)
	for _, r := range rr {
		if r.Rule.Shadow {
			continue
		}
		if len(b) > start {
			b = append(b, ", "...)
		}
		b = appendItem(b, r.Rule.Name, "r", r.Remaining, "t", seconds(resetOf(r)))
	}
	return b
}

// resetOf is what a rule's result says of when to come back: when it is
// full again, or for an in-flight rule (whose slots free when answers
// end, not by time) its retry.
func resetOf(r limiter.RuleResult) time.Duration {
	if inFlight(r.Rule) {
		return r.RetryAfter
	}
	return r.ResetAfter
}

// policyHeader is the RateLimit-Policy value of rules: "" when every rule
// is a shadow rule.
func policyHeader(rules []limiter.Rule) string {
	var arr [256]byte
	b := arr[:0]
	for _, r := range rules {
		if r.Shadow || inFlight(r) {
			continue // (an in-flight rule promises no rate)
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		q, w := quota(r)
		b = appendItem(b, r.Name, "q", q, "w", w)
	}
	return string(b)
}

// quota is what a rule promises a client, in the IETF draft's terms: q
// units per w seconds. q is the most the rule admits at once (a token
// bucket's burst, else its limit), which is also X-RateLimit-Limit, so the
// remaining count never exceeds it; w is how long the rule takes to refill
// q, rounded up, so q per w never promises more than the rule's rate. A
// client that spends q units every w seconds is never denied. With burst =
// limit (the default) this is simply limit per period.
func quota(r limiter.Rule) (q, w int64) {
	return r.Capacity(), seconds(r.Window())
}

// appendItem appends one structured-field list item: "name";k1=v1;k2=v2.
// Rule names are validated to need no escaping.
func appendItem(b []byte, name, k1 string, v1 int64, k2 string, v2 int64) []byte {
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";`...)
	b = append(b, k1...)
	b = append(b, '=')
	b = strconv.AppendInt(b, v1, 10)
	b = append(b, ';')
	b = append(b, k2...)
	b = append(b, '=')
	return strconv.AppendInt(b, v2, 10)
}

// seconds rounds d up to whole seconds.
// windowSeconds is a rule's window as the JSON bodies show it: its
// period, or for a calendar rule its longest window (Rule.Window).
func windowSeconds(r limiter.Rule) int64 {
	if r.Calendar != nil {
		return seconds(r.Window())
	}
	return seconds(r.Period)
}

func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// jitterFraction bounds the jitter relative to the wait: a client told to
// come back after a long wait may come a little later, one that only has to
// wait a moment is not told to wait much longer.
const jitterFraction = 4 // at most a quarter of the wait

// retryAfter is the Retry-After value for a wait of d: d plus a random
// jitter below min(maxJitter, d/4), rounded up to whole seconds. It is
// never earlier than allowed, denied clients of a long wait do not all come
// back in the same second, and a wait under a second is told 1.
func retryAfter(d, maxJitter time.Duration) int64 {
	if j := min(maxJitter, d/jitterFraction); j > 0 {
		d += rand.N(j)
	}
	return max(1, seconds(d))
}

// problem is an RFC 9457 problem detail.
type problem struct {
	Type     string      `json:"type"`
	Title    string      `json:"title"`
	Status   int         `json:"status"`
	Detail   string      `json:"detail,omitempty"`
	Violated []violation `json:"violated_rules,omitempty"`
	Route    string      `json:"route,omitempty"`
	Upstream string      `json:"upstream,omitempty"`
}

// violation names a rule that denied the request.
type violation struct {
	Name          string `json:"name"`
	Limit         int64  `json:"limit"`
	WindowSeconds int64  `json:"window_seconds"`
	Capacity      int64  `json:"capacity"`
	Remaining     int64  `json:"remaining"`
	// RetryAfterSeconds is this rule's own wait, rounded up, without
	// jitter; absent when no wait helps.
	RetryAfterSeconds int64 `json:"retry_after_seconds,omitempty"`
	// InFlight marks an in-flight rule: Limit requests at once, no window.
	InFlight bool `json:"in_flight,omitempty"`
}

// Problem types.
const (
	probRateLimited  = "urn:edgelimit:problem:rate-limited"
	probOverCapacity = "urn:edgelimit:problem:cost-exceeds-capacity"
	probUndecidable  = "urn:edgelimit:problem:undecidable-request"
	probUnavailable  = "urn:edgelimit:problem:limiter-unavailable"
	probUnknownKey   = "urn:edgelimit:problem:unknown-api-key"
	probKeyRequired  = "urn:edgelimit:problem:api-key-required"
	probNoRoute      = "urn:edgelimit:problem:no-route"
	probBodyTooLarge = "urn:edgelimit:problem:body-too-large"
	// A body naming an API key the request was not charged to.
	probBodyKey = "urn:edgelimit:problem:api-key-in-body"
	// A body the gateway must read but cannot decode.
	probUnsupportedEncoding = "urn:edgelimit:problem:unsupported-content-encoding"
	probUnsupportedCharset  = "urn:edgelimit:problem:unsupported-charset"
	probUpstreamDown        = "urn:edgelimit:problem:upstream-unavailable"
	probUpstreamSlow        = "urn:edgelimit:problem:upstream-timeout"
	probClientTimeout       = "urn:edgelimit:problem:request-timeout"
	probInternal            = "urn:edgelimit:problem:internal"
	probBadRequest          = "urn:edgelimit:problem:bad-request"
	probForbidden           = "urn:edgelimit:problem:forbidden"
)

func writeProblem(w http.ResponseWriter, p problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	buf := getJSONBuffer()
	*buf = appendProblem(*buf, &p)
	h := w.Header()
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	h["Content-Length"] = []string{strconv.Itoa(len(*buf))}
	w.WriteHeader(p.Status)
	_, _ = w.Write(*buf)
	putJSONBuffer(buf)
}

// denial builds the answer to a denied request: its problem and its
// Retry-After in seconds (0: none, because no wait helps).
func denial(v verdict, jitter time.Duration) (problem, int64) {
	if !v.known {
		// Failed closed: the store is unavailable and the rules say refuse.
		return problem{
			Type:   probUnavailable,
			Status: http.StatusServiceUnavailable,
			Detail: "The rate limiter's store is unavailable and this plan refuses requests it cannot check. Retry later.",
		}, retryAfter(v.retry, jitter)
	}
	p := problem{Type: probRateLimited, Status: http.StatusTooManyRequests}
	violated := v.d.Violated()
	for _, rr := range violated {
		p.Violated = append(p.Violated, violationOf(rr, v.d.Reason == ""))
	}
	if v.d.Reason != "" {
		if v.retry > 0 {
			// Local fallback: the cost exceeds this gateway's share only.
			p.Type = probOverCapacity
			p.Detail = "The rate limiter's shared store is unavailable and this gateway enforces only its share of the limits, which is smaller than this request's cost: " +
				v.d.Reason + ". Retry once the store is back."
			return p, retryAfter(v.retry, jitter)
		}
		p.Type = probOverCapacity
		p.Detail = "This request costs more than the rules can ever admit at once (" + v.d.Reason +
			"). Waiting will not help, so there is no Retry-After: send a smaller request or use a plan with a larger burst."
		return p, 0
	}
	p.Detail = "Rate limit exceeded: " + describe(violated) + "."
	return p, retryAfter(v.d.RetryAfter(), jitter)
}

func violationOf(rr limiter.RuleResult, withRetry bool) violation {
	v := violation{
		Name:          rr.Rule.Name,
		Limit:         rr.Rule.Limit,
		WindowSeconds: windowSeconds(rr.Rule),
		Capacity:      rr.Rule.Capacity(),
		Remaining:     rr.Remaining,
	}
	if withRetry {
		v.RetryAfterSeconds = seconds(rr.RetryAfter)
	}
	if inFlight(rr.Rule) {
		v.WindowSeconds, v.InFlight = 0, true
	}
	return v
}

func describe(rr []limiter.RuleResult) string {
	parts := make([]string, len(rr))
	for i, r := range rr {
		per := r.Rule.Period.String()
		if r.Rule.Calendar != nil {
			per = r.Rule.Calendar.String()
		}
		parts[i] = fmt.Sprintf("rule %q allows %d per %s", r.Rule.Name, r.Rule.Limit, per)
		if inFlight(r.Rule) {
			parts[i] = fmt.Sprintf("rule %q allows %d requests in flight at once (retry when one of them ends)", r.Rule.Name, r.Rule.Limit)
		}
	}
	return strings.Join(parts, "; ")
}
