package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// A token budget (see plans.Tokens): a route with a tokens setting
// reserves tokens of the caller's token rules (unit: tokens) before it
// proxies a request, checked with every other rule of the key in the one
// atomic call, and settles what the answer used after it: the difference
// is charged (overdrawing the rules past their limits: limiter.Settle) or
// given back. Check first and charge later, every request that arrives
// while the budget still shows room gets in; reserved, the budget holds
// to within what answers use beyond their reservations.

// Header names of a settlement: the reservation, sent with the answer's
// headers, and what was settled, sent as trailers where the answer can
// carry them (chunked HTTP/1.1, HTTP/2).
const (
	hReserved = "X-Ratelimit-Reserved"
	hSettled  = "X-Ratelimit-Settled"
)

// Bounds of what a request or an answer is read for: a body read for its
// reservation is at most max_body_bytes (as any body); an answer's JSON is
// parsed whole up to maxUsageBody, past that from its last maxUsageTail
// bytes (where OpenAI's usage object is: the body's last field); an event
// stream's line longer than maxUsageLine is skipped.
const (
	maxUsageBody = 1 << 20
	maxUsageTail = 64 << 10
	maxUsageLine = 1 << 20
)

// defaultUsageField is the usage object's field a settlement reads.
const defaultUsageField = "total_tokens"

// jsonFieldRE is a JSON field name the configuration may name.
var jsonFieldRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validateTokens checks a route's tokens setting (r.Tokens).
func (c Config) validateTokens(bad func(field, format string, args ...any), field string, r Route) {
	t := r.Tokens
	if r.Exempt {
		bad(field, "an exempt route checks no limits, so it has no tokens to reserve")
	}
	if len(r.Upgrades) > 0 {
		bad(field, "a route that upgrades (%v) has no answer to settle from", r.Upgrades)
	}
	rs := t.Reserve
	switch {
	case rs.Max <= 0:
		bad(field+".reserve.max", "%d: the most tokens one request reserves is needed, and positive", rs.Max)
	case rs.Max > limiter.MaxCost:
		bad(field+".reserve.max", "%d is above %d", rs.Max, int64(limiter.MaxCost))
	}
	if rs.Default < 0 || rs.Default > rs.Max {
		bad(field+".reserve.default", "%d must be from 0 (max) to reserve.max (%d)", rs.Default, rs.Max)
	}
	if rs.BodyField != "" {
		if !jsonFieldRE.MatchString(rs.BodyField) {
			bad(field+".reserve.body_field", "%q is not a top-level JSON field name (letters, digits, '_', '-')", rs.BodyField)
		}
		if len(r.Methods) > 0 && !slices.ContainsFunc(r.Methods, hasBody) {
			bad(field+".reserve.body_field", "route methods %v never carry a body to read %q from", r.Methods, rs.BodyField)
		}
	}
	if rs.BodyBytesPerToken < 0 {
		bad(field+".reserve.body_bytes_per_token", "%d is negative", rs.BodyBytesPerToken)
	}
	if rs.Header != "" && !validHeaderName(rs.Header) {
		bad(field+".reserve.header", "%q is not a header name", rs.Header)
	}
	s := t.Settle
	if s.Header != "" && !validHeaderName(s.Header) {
		bad(field+".settle.header", "%q is not a header name", s.Header)
	}
	switch {
	case s.Usage == "-" && s.Header == "":
		bad(field+".settle.usage", `"-" (no usage object) needs a settle.header to settle from`)
	case s.Usage != "" && s.Usage != "-" && !jsonFieldRE.MatchString(s.Usage):
		bad(field+".settle.usage", "%q is not a usage field name, e.g. total_tokens or completion_tokens", s.Usage)
	}
	switch t.Unsettled {
	case "", plans.UnsettledKeep, plans.UnsettledRefund:
	default:
		bad(field+".unsettled", "%q is not %q or %q", t.Unsettled, plans.UnsettledKeep, plans.UnsettledRefund)
	}
	// A reservation no token rule can hold would deny every request that
	// makes it, whatever the budget's state.
	if rs.Max > 0 {
		for _, name := range sortedKeys(c.Plans) {
			if r.Plan != "" && r.Plan != name {
				continue
			}
			for _, rule := range c.Plans[name].Rules {
				if rule.Unit == plans.UnitTokens && rule.Capacity() > 0 && rs.Max > rule.Capacity() {
					bad(field+".reserve.max", "%d is above the capacity (%d) of plan %q's token rule %q: a request reserving that much would never be admitted",
						rs.Max, rule.Capacity(), name, rule.Name)
				}
			}
		}
		for i, k := range c.APIKeys {
			p, ok := c.Plans[k.Plan]
			if !ok || r.Plan != "" {
				continue
			}
			for _, rule := range p.Rules {
				if o, ok := k.Overrides[rule.Name]; ok && rule.Unit == plans.UnitTokens {
					if cp := o.Apply(rule).Capacity(); cp > 0 && rs.Max > cp {
						bad(field+".reserve.max", "%d is above the capacity (%d) of token rule %q as api_keys[%d] overrides it", rs.Max, cp, rule.Name, i)
					}
				}
			}
		}
	}
}

// hasBody says whether requests of method m may carry a body to read.
func hasBody(m string) bool {
	switch strings.ToUpper(m) {
	case http.MethodGet, http.MethodHead, http.MethodDelete, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// validatePlanUnits refuses a plan without a rule of requests: routes
// without a tokens setting leave token rules out, and the check API
// in-flight rules too, and would check nothing.
func validatePlanUnits(bad func(field, format string, args ...any), field string, p Plan) {
	if len(p.Rules) > 0 && !slices.ContainsFunc(p.Rules, func(r Rule) bool { return r.Unit != plans.UnitTokens && r.InFlight == 0 }) {
		bad(field+".rules", "every rule counts tokens or requests in flight: add a rule of requests (e.g. a request rate), or the check API and routes without a tokens setting would check nothing")
	}
}

// planVariants adds to p (compiled from rules) which of its rules count
// tokens and which requests in flight, and the plans of the others: the
// one routes without a tokens setting check (noTokens), and the one the
// check API checks (forCheck), which holds no slots either.
func planVariants(p *plan, rules []Rule, cfg Config) {
	var noTokens, forCheck []Rule
	for i, r := range rules {
		switch {
		case r.Unit == plans.UnitTokens:
			p.tokens = append(p.tokens, i)
		case r.InFlight != 0:
			p.inflight = append(p.inflight, i)
			noTokens = append(noTokens, r)
		default:
			noTokens = append(noTokens, r)
			forCheck = append(forCheck, r)
		}
	}
	if len(p.tokens) > 0 && len(noTokens) > 0 {
		p.noTokens = compilePlan(p.name, noTokens, cfg)
	}
	if len(forCheck) < len(rules) && len(forCheck) > 0 {
		p.forCheck = compilePlan(p.name, forCheck, cfg)
	}
}

// forRoute is the plan a request on route rt (nil: one without a plan
// of its own) checks: p itself on a route that settles tokens, else p
// without its token rules; for the check API (check), which neither
// settles nor sees an answer end, without its in-flight rules too.
func (p *plan) forRoute(rt *route, check bool) *plan {
	switch {
	case check && p.forCheck != nil:
		return p.forCheck
	case (rt == nil || rt.Tokens == nil) && p.noTokens != nil:
		return p.noTokens
	}
	return p
}

// withReservation sets the reservation of a request on a token route into l:
// its plan's token rules charged n instead of the call's cost.
func (l *limits) withReservation(n int64) {
	if len(l.plan.tokens) == 0 {
		return
	}
	if sameRules(l.rules, l.plan.rules) {
		l.rules = slices.Clone(l.rules)
	}
	for _, i := range l.plan.tokens {
		l.rules[i].Cost = n
	}
}

// reservation is what a request on a route with tokens t reserves: the
// number its header or body field names (the larger, where it names
// both: the client writes both, and the upstream may honour either),
// capped at the maximum, else the default. body is the request's body
// when t reads a field from it.
func reservation(t *plans.Tokens, h http.Header, body []byte) int64 {
	n, ok := int64(0), false
	if t.Reserve.Header != "" {
		if v := h.Get(t.Reserve.Header); v != "" {
			n, ok = positive(strings.TrimSpace(v))
		}
	}
	if t.Reserve.BodyField != "" && len(body) > 0 {
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) == nil {
			if raw, found := fields[t.Reserve.BodyField]; found {
				if b, bok := positive(string(raw)); bok {
					n, ok = max(n, b), true
				}
			}
		}
	}
	if !ok {
		n = t.Reserve.Default
		if n == 0 {
			n = t.Reserve.Max
		}
	}
	if per := t.Reserve.BodyBytesPerToken; per > 0 {
		n += (int64(len(body)) + per - 1) / per
	}
	return min(n, t.Reserve.Max)
}

// readsBody says whether a request's reservation needs its body.
func readsBody(t *plans.Tokens) bool {
	return t.Reserve.BodyField != "" || t.Reserve.BodyBytesPerToken > 0
}

// positive reads a positive count of tokens (see nonNegative).
func positive(s string) (int64, bool) {
	n, ok := nonNegative(s)
	return n, ok && n > 0
}

// readBody reads the whole of r's body (at most maxBody bytes) before the
// decision, and puts it back (see readAhead).
func readBody(w http.ResponseWriter, r *http.Request, maxBody int64, idle time.Duration) ([]byte, *problem) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	return readAhead(w, r, maxBody, maxBody, idle)
}

// tokenUse is what a proxied request on a token route learns of its
// answer, for its settlement: filled in by the proxy (usageTap) as the
// answer passes, read once serve has returned.
type tokenUse struct {
	t        *plans.Tokens
	reserved int64
	// complete: the answer's body was read to its end.
	complete bool
	// used is the tokens the answer reported (header, trailer or usage),
	// when found.
	used  int64
	found bool
}

// settled is what the request is charged in the end: what its answer
// reported, else the route's rule for an answer without usage.
func (u *tokenUse) settled() int64 {
	switch {
	case u.found:
		return u.used
	case u.t.Unsettled == plans.UnsettledRefund:
		return 0
	}
	return u.reserved
}

// onResponse is the proxy's ModifyResponse step of a token route: the
// usage header, and a tap on the body for the usage object and trailers.
func (u *tokenUse) onResponse(resp *http.Response) {
	if h := u.t.Settle.Header; h != "" {
		if n, ok := nonNegative(resp.Header.Get(h)); ok {
			u.used, u.found = n, true
		}
	}
	field := u.t.Settle.Usage
	switch field {
	case "-":
		field = ""
	case "":
		field = defaultUsageField
	}
	kind := usageNone
	if resp.Header.Get("Content-Encoding") == "" || strings.EqualFold(resp.Header.Get("Content-Encoding"), "identity") {
		ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		switch {
		case field == "":
		case ct == "text/event-stream":
			kind = usageSSE
		case ct == "application/json" || strings.HasSuffix(ct, "+json"):
			kind = usageJSON
		}
	}
	resp.Body = &usageTap{ReadCloser: resp.Body, u: u, resp: resp, kind: kind, field: field}
}

// nonNegative reads a count of tokens: an integer, as JSON may write it
// (12 or 12.0).
func nonNegative(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, n >= 0 && n <= limiter.MaxCost
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != float64(int64(f)) || f < 0 || f > limiter.MaxCost {
		return 0, false
	}
	return int64(f), true
}

// How an answer reports its usage.
const (
	usageNone = iota // in a header or trailer only
	usageJSON        // a JSON body's top-level usage object
	usageSSE         // an event's usage object; the last one counts
)

// usageTap reads an answer's usage as it passes to the client, holding at
// most maxUsageBody (JSON) or maxUsageLine (an event's line) bytes.
type usageTap struct {
	io.ReadCloser
	u     *tokenUse
	resp  *http.Response
	kind  int
	field string
	buf   []byte
	// over: a JSON body past maxUsageBody (buf holds its tail), or an
	// event line past maxUsageLine (skipped to its end).
	over bool
	done bool
}

func (t *usageTap) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if n > 0 && t.kind != usageNone {
		t.feed(p[:n])
	}
	if err == io.EOF && !t.done {
		t.done = true
		t.finish()
	}
	return n, err
}

func (t *usageTap) feed(b []byte) {
	if t.kind == usageJSON {
		t.buf = append(t.buf, b...)
		if len(t.buf) > maxUsageBody {
			t.over = true
		}
		if t.over && len(t.buf) > 2*maxUsageTail {
			t.buf = append(t.buf[:0], t.buf[len(t.buf)-maxUsageTail:]...)
		}
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !t.over {
				t.buf = append(t.buf, b...)
				if len(t.buf) > maxUsageLine {
					t.over, t.buf = true, t.buf[:0]
				}
			}
			return
		}
		if !t.over {
			t.buf = append(t.buf, b[:i]...)
			t.event(t.buf)
		}
		t.over, t.buf = false, t.buf[:0]
		b = b[i+1:]
	}
}

// event reads one line of an event stream: a data line whose JSON
// carries a usage object sets the usage (the last one counts).
func (t *usageTap) event(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	t.usage(bytes.TrimSpace(data))
}

// usage reads the usage object of a JSON document.
func (t *usageTap) usage(doc []byte) {
	var v struct {
		Usage map[string]json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(doc, &v) != nil {
		return
	}
	t.take(v.Usage)
}

// take reads the usage object's field.
func (t *usageTap) take(usage map[string]json.RawMessage) {
	if raw, ok := usage[t.field]; ok {
		if n, ok := nonNegative(string(raw)); ok {
			t.u.used, t.u.found = n, true
		}
	}
}

// finish reads what the whole answer says: a JSON body's usage, and the
// usage trailer.
func (t *usageTap) finish() {
	t.u.complete = true
	switch {
	case t.kind == usageJSON && !t.over:
		t.usage(t.buf)
	case t.kind == usageJSON:
		// Past maxUsageBody: the last "usage" key of the tail. (Inside a
		// JSON string its quotes would be escaped.)
		if i := bytes.LastIndex(t.buf, []byte(`"usage"`)); i >= 0 {
			rest := bytes.TrimLeft(t.buf[i+len(`"usage"`):], " \t\r\n")
			if rest, ok := bytes.CutPrefix(rest, []byte{':'}); ok {
				var usage map[string]json.RawMessage
				if json.NewDecoder(bytes.NewReader(rest)).Decode(&usage) == nil {
					t.take(usage)
				}
			}
		}
	case t.kind == usageSSE && len(t.buf) > 0 && !t.over:
		t.event(t.buf)
	}
	t.buf = nil
	if h := t.u.t.Settle.Header; h != "" {
		if n, ok := nonNegative(t.resp.Trailer.Get(h)); ok {
			t.u.used, t.u.found = n, true
		}
	}
}

// settler is a store that settles (*limiter.Redis, *limiter.Memory).
type settler interface {
	Settle(ctx context.Context, key string, rules []limiter.Rule, delta int64, at time.Time) (limiter.Decision, error)
}

// settle charges (or gives back) what a proxied request on a token route
// used beyond its reservation, in the store that decided it, and
// publishes the settlement record; h gets the settled figures as
// trailers. A request the failure policy let through charged no store:
// its settlement is only recorded. A settlement the store fails leaves
// the reservation charged (the limiter's favour), counted and logged.
func (g *Gateway) settle(ctx context.Context, h http.Header, st *state, c *call, v verdict, u *tokenUse) {
	used := u.settled()
	delta := used - u.reserved
	result := "none"
	var after *limiter.Decision
	if delta != 0 {
		result = "unchecked"
		s, ok := g.chargedBy(v).(settler)
		if rules := settledRules(c.limits.plan, v); len(rules) > 0 && ok {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.cfg.StoreDeadline)
			d, err := s.Settle(sctx, c.limits.key, rules, delta, v.d.Time)
			cancel()
			if err != nil {
				result = "failed"
				g.log.Warn("settle a token reservation", "route", c.route, "delta", delta, "error", err.Error())
			} else {
				result, after = "ok", &d
			}
		}
	}
	g.m.settlements.WithLabelValues(result).Inc()
	h[http.TrailerPrefix+hSettled] = []string{strconv.FormatInt(used, 10)}
	if after != nil {
		if b := appendRateList(nil, after.Rules); len(b) > 0 {
			h[http.TrailerPrefix+hRateLimit] = []string{string(b)}
		}
	}
	g.publishSettlement(c, v, u.reserved, used, after)
}

// settledRules are the rules of v (as decided, directives applied) that
// count tokens and were charged: their results admitted the request.
func settledRules(p *plan, v verdict) []limiter.Rule {
	if !v.known || !v.d.Allowed || p == nil || len(p.tokens) == 0 {
		return nil
	}
	var out []limiter.Rule
	for _, rr := range v.d.Rules {
		if rr.Allowed && p.countsTokens(rr.Rule.Name) {
			out = append(out, rr.Rule)
		}
	}
	return out
}

// countsTokens says whether p's rule called name counts tokens.
func (p *plan) countsTokens(name string) bool {
	for _, i := range p.tokens {
		if p.rules[i].Name == name {
			return true
		}
	}
	return false
}

// publishSettlement sends the settlement record of call c: what it
// reserved and what it used, its cost the difference. after is the
// store's state after the settlement, nil when no store settled.
func (g *Gateway) publishSettlement(c *call, v verdict, reserved, used int64, after *limiter.Decision) {
	if g.pub == nil {
		return
	}
	ev := g.callEvent(c, g.now())
	ev.Allowed, ev.Cost, ev.StoreStatus, ev.Mode = true, used-reserved, v.store, event.ModeSettlement
	ev.Reserved, ev.Settled = reserved, used
	if after != nil && len(after.Rules) > 0 {
		ev.Time = after.Time
		b := after.BindingRule()
		ev.BindingRule, ev.Limit, ev.Remaining = b.Rule.Name, b.Rule.Limit, b.Remaining
	}
	g.pub.Publish(ev)
}
