package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// checkRequest is the body of POST /v1/check. The caller is identified by
// key, else by user or ip, else like any request (its own API key header
// or address). User, ip and plan name someone other than the caller, so
// only trusted proxies may set them.
type checkRequest struct {
	// Key is a raw API key.
	Key string `json:"key"`
	// User is a user id (trusted peers only).
	User string `json:"user"`
	// IP is a client address (trusted peers only).
	IP string `json:"ip"`
	// Plan names the plan to check instead of the caller's (trusted peers only).
	Plan string `json:"plan"`
	// Method and Path select a route: its plan (if it has one) and cost.
	Method string `json:"method"`
	Path   string `json:"path"`
	// Cost defaults to the route's cost, or 1.
	Cost int64 `json:"cost"`
}

// checkResponse is the decision, with the same headers as proxied traffic.
type checkResponse struct {
	Allowed bool   `json:"allowed"`
	KeyKind string `json:"key_kind"`
	Plan    string `json:"plan"`
	Route   string `json:"route,omitempty"`
	Cost    int64  `json:"cost"`
	Mode    string `json:"mode"`
	Store   string `json:"store"`
	// RetryAfterMS is the exact wait before the request would be allowed,
	// without jitter; RetryAfterSeconds is the Retry-After header's value.
	RetryAfterMS      int64       `json:"retry_after_ms,omitempty"`
	RetryAfterSeconds int64       `json:"retry_after_seconds,omitempty"`
	Reason            string      `json:"reason,omitempty"`
	Binding           string      `json:"binding_rule,omitempty"`
	Rules             []checkRule `json:"rules,omitempty"`
	Problem           *problem    `json:"problem,omitempty"`
}

type checkRule struct {
	Name          string `json:"name"`
	Limit         int64  `json:"limit"`
	WindowSeconds int64  `json:"window_seconds"`
	Capacity      int64  `json:"capacity"`
	Shadow        bool   `json:"shadow,omitempty"`
	// The rest are known only when a store decided.
	Allowed      *bool  `json:"allowed,omitempty"`
	Remaining    *int64 `json:"remaining,omitempty"`
	ResetSeconds *int64 `json:"reset_seconds,omitempty"`
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
}

const maxCheckBody = 64 << 10

// serveCheck answers POST /v1/check: 200 allowed, 429 denied, 503 when the
// store is unavailable and the rules fail closed; the body is the decision
// in every case. It only turns the JSON into a call and the verdict into
// its body: the enforcement step is the proxied traffic's.
func (g *Gateway) serveCheck(w http.ResponseWriter, r *http.Request, st *state) {
	routeName := "check"
	status := http.StatusOK
	defer func() { g.m.countResponse(routeName, status) }()
	c, rt, p := g.checkCall(w, r, st)
	if p != nil {
		status = p.Status
		writeProblem(w, *p)
		return
	}
	if rt != nil {
		routeName = rt.Name
	}
	v := g.enforce(r.Context(), st, &c)
	a := answerFor(w.Header(), v, st)
	status = a.status
	if v.canceled || v.err != nil {
		a.write(w)
		return
	}
	resp := checkBody(c, rt, v, a)
	buf := getJSONBuffer()
	*buf = appendCheckResponse(*buf, &resp)
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	w.WriteHeader(status)
	_, _ = w.Write(*buf)
	putJSONBuffer(buf)
}

// Header values every JSON answer sets, shared: net/http only reads a
// header's value slice, so the request path need not allocate one.
var (
	jsonContentType    = []string{"application/json"}
	problemContentType = []string{"application/problem+json"}
	noStore            = []string{"no-store"}
)

// checkCall parses a check request into a call, or the problem to answer
// instead. rt is the route it names, if any.
func (g *Gateway) checkCall(w http.ResponseWriter, r *http.Request, st *state) (call, *route, *problem) {
	bad := func(code int, typ, detail string) (call, *route, *problem) {
		// Charged like the traffic's refusals: the check API is on the
		// traffic listener, and answers a route probe too.
		if d := g.chargeRefused(w.Header(), r, st, "check"); d != nil {
			return call{}, nil, d
		}
		return call{}, nil, &problem{Type: typ, Status: code, Detail: detail}
	}
	var req checkRequest
	if err := readCheckRequest(w, r, &req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return bad(http.StatusRequestEntityTooLarge, probBodyTooLarge, "The check request is larger than 64 KiB.")
		}
		return bad(http.StatusBadRequest, probBadRequest, "The body must be a JSON check request: "+err.Error())
	}
	if req.Cost < 0 {
		return bad(http.StatusBadRequest, probBadRequest, "cost must be positive")
	}
	peerTrusted := st.peerTrusted(r)
	if !peerTrusted && (req.User != "" || req.IP != "" || req.Plan != "") {
		return bad(http.StatusForbidden, probForbidden, "Only trusted proxies may check for a user, an ip or a plan.")
	}

	var id identity
	switch {
	case req.Key != "":
		ip, ok := st.clientIP(r)
		if !ok {
			p := g.refusal(errBadForwardedFor)
			return call{}, nil, &p
		}
		k := st.lookupKey(req.Key)
		switch {
		case k != nil:
			id = k.identity()
			id.clientIP = ip
		case st.cfg.UnknownKey == UnknownKeyAnonymous && st.anonymous != nil:
			id = identity{kind: event.KindIP, key: ipKey(ip), plan: st.anonymous, clientIP: ip}
		default:
			p := g.failedAuth(r.Context(), w.Header(), st, errUnknownKey, call{id: identity{clientIP: ip, peerTrusted: peerTrusted},
				route: "check", method: r.Method, userAgent: r.UserAgent()})
			return call{}, nil, &p
		}
	case req.User != "":
		if st.user == nil {
			return bad(http.StatusBadRequest, probBadRequest, "No user plan is configured.")
		}
		id = identity{kind: event.KindUser, key: limiter.UserKey(req.User), plan: st.user}
	case req.IP != "":
		if st.anonymous == nil {
			return bad(http.StatusBadRequest, probBadRequest, "No anonymous plan is configured.")
		}
		a, err := netip.ParseAddr(req.IP)
		if err != nil {
			return bad(http.StatusBadRequest, probBadRequest, "ip is not an IP address.")
		}
		// The address as proxied traffic names it: "::ffff:192.0.2.1" is
		// 192.0.2.1 in events too, and a zone (of any length) is no part
		// of whom it names.
		ip := a.Unmap().WithZone("").String()
		key, _ := limiter.IPKey(ip)
		id = identity{kind: event.KindIP, key: key, plan: st.anonymous, clientIP: ip}
	default:
		var ierr identifyError
		if id, ierr = st.identify(r); ierr != identified {
			p := g.failedAuth(r.Context(), w.Header(), st, ierr, call{id: id, route: "check", method: r.Method, userAgent: r.UserAgent()})
			return call{}, nil, &p
		}
	}
	id.peerTrusted = peerTrusted

	var rt *route
	if req.Path != "" {
		req.Method = strings.ToUpper(req.Method)
		if req.Method == "" {
			req.Method = http.MethodGet
		}
		p, _, _ := strings.Cut(req.Path, "?")
		p, err := normalizePath(p, st.cfg.Paths)
		if err != nil {
			return bad(http.StatusBadRequest, probBadPath, "path holds "+err.Error()+".")
		}
		if rt = st.match(req.Method, p); rt == nil {
			return bad(http.StatusNotFound, probNoRoute, "No route matches this method and path.")
		}
	}
	c := call{id: id, limits: st.limitsFor(id, rt, true), cost: req.Cost, route: "check", method: eventMethod(req.Method), userAgent: r.UserAgent()}
	if rt != nil {
		c.route = rt.Name
	}
	if req.Plan != "" {
		p, ok := st.plans[req.Plan]
		if !ok {
			return bad(http.StatusBadRequest, probBadRequest, "Unknown plan "+strconv.Quote(req.Plan)+".")
		}
		c.limits.plan, c.limits.rules = p, p.rules
		c.limits.key = id.key + "|p:" + req.Plan
	}
	if c.cost == 0 {
		c.cost = 1
		if rt != nil {
			c.cost = rt.Cost
		}
	}
	return c, rt, nil
}

// readCheckRequest parses r's body into req as a json.Decoder that
// disallows unknown fields would, errors included. A small body of the
// usual shape (exact lower-case names, plain strings, an integer cost) is
// parsed here without reflection and with one allocation; anything else
// (escapes, non-ASCII, nulls, other spellings, a body of unknown or large
// length, a read error) is decoded by encoding/json from the same bytes,
// so its answer and its error message are json's.
func readCheckRequest(w http.ResponseWriter, r *http.Request, req *checkRequest) error {
	body := http.MaxBytesReader(w, r.Body, maxCheckBody)
	if r.ContentLength < 0 || r.ContentLength > maxFastCheckBody {
		return decodeCheckRequest(body, req)
	}
	buf := getJSONBuffer()
	defer putJSONBuffer(buf)
	b, err := readAllInto((*buf)[:0], body)
	*buf = b
	if err != nil {
		// What json would have made of the bytes read, then the error.
		return decodeCheckRequest(io.MultiReader(bytes.NewReader(b), errReader{err}), req)
	}
	if parseCheckRequest(b, req) {
		return nil
	}
	*req = checkRequest{}
	return decodeCheckRequest(bytes.NewReader(b), req)
}

// maxFastCheckBody bounds the bodies readCheckRequest reads whole before
// parsing: a check request is a few dozen bytes.
const maxFastCheckBody = 2 << 10

func decodeCheckRequest(body io.Reader, req *checkRequest) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	return dec.Decode(req)
}

// readAllInto appends what r holds to b, as io.ReadAll does.
func readAllInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// parseCheckRequest parses b into req if b is one JSON object whose
// members are check request fields spelled exactly as tagged, with
// strings of printable ASCII and no escapes, and cost a plain integer,
// surrounded by whitespace only; it reports false, req in an unknown
// state, for anything else. On what it accepts json gives the same
// result: the last of repeated members wins there too.
func parseCheckRequest(b []byte, req *checkRequest) bool {
	// One string holds the body; every field is a slice of it.
	s := string(b)
	i := skipSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return skipSpace(s, i+1) == len(s)
	}
	for {
		name, j, ok := plainString(s, i)
		if !ok {
			return false
		}
		i = skipSpace(s, j)
		if i == len(s) || s[i] != ':' {
			return false
		}
		i = skipSpace(s, i+1)
		if name == "cost" {
			n, j, ok := plainInt(s, i)
			if !ok {
				return false
			}
			req.Cost, i = n, j
		} else {
			v, j, ok := plainString(s, i)
			field := req.stringField(name)
			if !ok || field == nil {
				return false // for an unknown name, json's error names it
			}
			*field, i = v, j
		}
		i = skipSpace(s, i)
		if i == len(s) {
			return false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
		case '}':
			return skipSpace(s, i+1) == len(s)
		default:
			return false
		}
	}
}

// stringField is the string member of r whose JSON name is name, or nil.
func (r *checkRequest) stringField(name string) *string {
	for _, f := range [...]struct {
		name string
		p    *string
	}{{"key", &r.Key}, {"user", &r.User}, {"ip", &r.IP}, {"plan", &r.Plan}, {"method", &r.Method}, {"path", &r.Path}} {
		if f.name == name {
			return f.p
		}
	}
	return nil
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at s[i] made of printable ASCII without
// escapes, and returns its content and the index after it.
func plainString(s string, i int) (string, int, bool) {
	if i == len(s) || s[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return s[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", i, false
		}
	}
	return "", i, false
}

// plainInt reads a JSON number at s[i] that is an integer of at most 18
// digits (so it cannot overflow int64), without fraction or exponent.
func plainInt(s string, i int) (int64, int, bool) {
	j := i
	neg := j < len(s) && s[j] == '-'
	if neg {
		j++
	}
	start := j
	var n int64
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		n = n*10 + int64(s[j]-'0')
		j++
	}
	digits := j - start
	if digits == 0 || digits > 18 || (digits > 1 && s[start] == '0') {
		return 0, i, false
	}
	if j < len(s) && (s[j] == '.' || s[j] == 'e' || s[j] == 'E') {
		return 0, i, false
	}
	if neg {
		n = -n
	}
	return n, j, true
}

// checkBody renders a decision as the check API's body.
func checkBody(c call, rt *route, v verdict, a answer) checkResponse {
	resp := checkResponse{
		Allowed: v.allowed, KeyKind: c.id.kind.String(), Plan: c.limits.plan.name, Cost: c.cost,
		Mode: v.mode.String(), Store: v.store.String(),
	}
	if rt != nil {
		resp.Route = rt.Name
	}
	if len(v.rules) > 0 {
		// One allocation each for the rules and for the numbers they point
		// to; the other pointers point into the decision.
		resp.Rules = make([]checkRule, len(v.rules))
		var nums []int64
		if v.known {
			nums = make([]int64, 2*len(v.d.Rules))
		}
		for i, rule := range v.rules {
			cr := &resp.Rules[i]
			*cr = checkRule{Name: rule.Name, Limit: rule.Limit, WindowSeconds: windowSeconds(rule), Capacity: rule.Capacity(), Shadow: rule.Shadow}
			if v.known && i < len(v.d.Rules) {
				rr := &v.d.Rules[i]
				reset, retry := &nums[2*i], &nums[2*i+1]
				*reset, *retry = seconds(rr.ResetAfter), rr.RetryAfter.Milliseconds()
				cr.Allowed, cr.Remaining, cr.ResetSeconds = &rr.Allowed, &rr.Remaining, reset
				if *retry > 0 {
					cr.RetryAfterMS = retry
				}
			}
		}
	}
	if v.known && len(v.d.Rules) > 0 {
		resp.Binding = v.d.BindingRule().Rule.Name
	}
	if !v.allowed {
		resp.Problem = a.problem
		resp.Reason = v.d.Reason
		resp.RetryAfterSeconds = a.retryAfter
		if v.known && v.d.Reason == "" {
			resp.RetryAfterMS = ceilMS(v.d.RetryAfter())
		} else if a.retryAfter > 0 {
			resp.RetryAfterMS = ceilMS(v.retry)
		}
	}
	return resp
}

// ceilMS rounds d up to whole milliseconds.
func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
