package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway/event"
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
// in every case.
func (g *Gateway) serveCheck(w http.ResponseWriter, r *http.Request, st *state) {
	routeName := "check"
	status := http.StatusOK
	defer func() { g.m.requests.WithLabelValues(routeName, strconv.Itoa(status)).Inc() }()
	bad := func(code int, typ, detail string) {
		status = code
		writeProblem(w, problem{Type: typ, Status: code, Detail: detail})
	}
	var req checkRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			bad(http.StatusRequestEntityTooLarge, probBodyTooLarge, "The check request is larger than 64 KiB.")
			return
		}
		bad(http.StatusBadRequest, probBadRequest, "The body must be a JSON check request: "+err.Error())
		return
	}
	if req.Cost < 0 {
		bad(http.StatusBadRequest, probBadRequest, "cost must be positive")
		return
	}
	peerTrusted := st.isTrusted(peerIP(r.RemoteAddr))
	if !peerTrusted && (req.User != "" || req.IP != "" || req.Plan != "") {
		bad(http.StatusForbidden, probForbidden, "Only trusted proxies may check for a user, an ip or a plan.")
		return
	}

	var id identity
	switch {
	case req.Key != "":
		k := st.lookupKey(req.Key)
		if k == nil {
			if st.cfg.UnknownKey != UnknownKeyAnonymous || st.anonymous == nil {
				status = http.StatusUnauthorized
				g.refuse(w, errUnknownKey)
				return
			}
			id = identity{kind: event.KindIP, key: ipKey(st.clientIP(r)), plan: st.anonymous, clientIP: st.clientIP(r)}
		} else {
			id = identity{kind: event.KindAPIKey, key: "k:" + k.id, plan: k.plan, clientIP: st.clientIP(r)}
		}
	case req.User != "":
		if st.user == nil {
			bad(http.StatusBadRequest, probBadRequest, "No user plan is configured.")
			return
		}
		id = identity{kind: event.KindUser, key: userKey(req.User), plan: st.user}
	case req.IP != "":
		if st.anonymous == nil {
			bad(http.StatusBadRequest, probBadRequest, "No anonymous plan is configured.")
			return
		}
		id = identity{kind: event.KindIP, key: ipKey(req.IP), plan: st.anonymous, clientIP: req.IP}
		if id.key == "ip:unknown" {
			bad(http.StatusBadRequest, probBadRequest, "ip is not an IP address.")
			return
		}
	default:
		var ierr identifyError
		id, ierr = st.identify(r)
		if ierr != identified {
			status = http.StatusUnauthorized
			g.refuse(w, ierr)
			return
		}
	}
	id.peerTrusted = peerTrusted

	var rt *route
	if req.Path != "" {
		method := strings.ToUpper(req.Method)
		if method == "" {
			method = http.MethodGet
		}
		req.Method = method
		if rt = st.match(method, req.Path); rt == nil {
			bad(http.StatusNotFound, probNoRoute, "No route matches this method and path.")
			return
		}
		routeName = rt.Name
	}
	l := st.limitsFor(id, rt)
	if req.Plan != "" {
		p, ok := st.plans[req.Plan]
		if !ok {
			bad(http.StatusBadRequest, probBadRequest, "Unknown plan "+strconv.Quote(req.Plan)+".")
			return
		}
		l.plan, l.rules = p, p.rules
		l.key = id.key + "|p:" + req.Plan
	}
	g.applyDirectives(&id, &l)
	cost := req.Cost
	if cost == 0 {
		cost = 1
		if rt != nil {
			cost = rt.Cost
		}
	}

	v := g.decide(r.Context(), st, l, cost)
	g.publish(&id, routeName, req.Method, l.plan.name, cost, r.UserAgent(), v)
	if v.canceled {
		status = 499
		w.WriteHeader(status)
		return
	}
	if v.err != nil {
		g.log.Error("limiter refused its input", "route", routeName, "error", v.err.Error())
		bad(http.StatusInternalServerError, probInternal, "")
		return
	}
	g.count(v)
	setRateHeaders(w.Header(), v)

	resp := checkResponse{
		Allowed: v.allowed, KeyKind: kindName(id.kind), Plan: l.plan.name, Cost: cost,
		Mode: modeName(v.mode), Store: storeName(v.store),
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
		p, after := denial(v, st.jitter)
		status = p.Status
		resp.Problem = &p
		resp.Reason = v.d.Reason
		resp.RetryAfterSeconds = after
		if v.known && v.d.Reason == "" {
			resp.RetryAfterMS = ceilMS(v.d.RetryAfter())
		} else if after > 0 {
			resp.RetryAfterMS = ceilMS(v.retry)
		}
		if after > 0 {
			w.Header()[hRetryAfter] = []string{strconv.FormatInt(after, 10)}
		}
	}
	body, _ := json.Marshal(resp)
	w.Header()["Content-Type"] = []string{"application/json"}
	w.Header()["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ceilMS rounds d up to whole milliseconds.
func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func kindName(k event.KeyKind) string {
	switch k {
	case event.KindAPIKey:
		return "api_key"
	case event.KindUser:
		return "user"
	case event.KindIP:
		return "ip"
	}
	return "unknown"
}
