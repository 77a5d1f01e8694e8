package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/event"
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
	defer func() { g.m.requests.WithLabelValues(routeName, strconv.Itoa(status)).Inc() }()
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
	body, _ := json.Marshal(checkBody(c, rt, v, a))
	w.Header()["Content-Type"] = []string{"application/json"}
	w.Header()["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// checkCall parses a check request into a call, or the problem to answer
// instead. rt is the route it names, if any.
func (g *Gateway) checkCall(w http.ResponseWriter, r *http.Request, st *state) (call, *route, *problem) {
	bad := func(code int, typ, detail string) (call, *route, *problem) {
		return call{}, nil, &problem{Type: typ, Status: code, Detail: detail}
	}
	var req checkRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
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
			id = identity{kind: event.KindAPIKey, key: limiter.APIKeyKey(k.id), plan: k.plan, clientIP: ip, name: k.name}
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
		key, ok := limiter.IPKey(req.IP)
		if !ok {
			return bad(http.StatusBadRequest, probBadRequest, "ip is not an IP address.")
		}
		id = identity{kind: event.KindIP, key: key, plan: st.anonymous, clientIP: req.IP}
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
	c := call{id: id, limits: st.limitsFor(id, rt), cost: req.Cost, route: "check", method: req.Method, userAgent: r.UserAgent()}
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

// checkBody renders a decision as the check API's body.
func checkBody(c call, rt *route, v verdict, a answer) checkResponse {
	resp := checkResponse{
		Allowed: v.allowed, KeyKind: c.id.kind.String(), Plan: c.limits.plan.name, Cost: c.cost,
		Mode: v.mode.String(), Store: v.store.String(),
	}
	if rt != nil {
		resp.Route = rt.Name
	}
	for i, rule := range v.rules {
		cr := checkRule{Name: rule.Name, Limit: rule.Limit, WindowSeconds: seconds(rule.Period), Capacity: rule.Capacity(), Shadow: rule.Shadow}
		if v.known && i < len(v.d.Rules) {
			rr := v.d.Rules[i]
			reset, retry := seconds(rr.ResetAfter), rr.RetryAfter.Milliseconds()
			cr.Allowed, cr.Remaining, cr.ResetSeconds = &rr.Allowed, &rr.Remaining, &reset
			if retry > 0 {
				cr.RetryAfterMS = &retry
			}
		}
		resp.Rules = append(resp.Rules, cr)
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
