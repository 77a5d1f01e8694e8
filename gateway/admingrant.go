package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// grantView is the body of a grant's answer.
type grantView struct {
	Action    string `json:"action"`
	Kind      string `json:"kind"`
	APIKeyID  string `json:"api_key_id,omitempty"`
	KeyID     string `json:"key_id"`
	GatewayID string `json:"gateway_id"`
	// Store is "shared" (Redis: one grant serves the fleet) or "memory".
	Store  string         `json:"store"`
	Rule   string         `json:"rule"`
	Units  int64          `json:"units"`
	Grants []grantSetView `json:"grants"`
}

type grantSetView struct {
	Scope string `json:"scope"` // as rule_sets name them: "plan:pro", "route:export"
	// Granted is the window's grants in all, now; its window admits
	// limit + granted, until window_end.
	Limit       int64     `json:"limit"`
	Granted     int64     `json:"granted"`
	Count       int64     `json:"count"`
	Remaining   int64     `json:"remaining"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
}

// grant gives the caller units more of a calendar rule's current window
// (negative: takes them back, never below none), in the shared bucket of
// every rule set of t that has the rule, and audits it as a reset is: a
// log line and a decision-stream record (mode admin, action "grant", the
// rule as binding_rule, the window's allowance after it as limit and
// what is left as remaining). The grant ends with the window. A split
// never applies to a calendar rule, so the shared bucket is the one.
func (a *Admin) grant(w http.ResponseWriter, r *http.Request, actor string) {
	st := a.g.st.Load()
	t, p := a.resolve(r, st)
	if p != nil {
		writeProblem(w, *p)
		return
	}
	q := r.URL.Query()
	name := q.Get("rule")
	units, err := strconv.ParseInt(q.Get("units"), 10, 64)
	if name == "" || err != nil || units == 0 {
		writeProblem(w, problem{Type: probBadRequest, Status: http.StatusBadRequest,
			Detail: "A grant needs rule (a calendar rule's name) and units (a non-zero integer; negative takes back what was granted)."})
		return
	}
	kg, ok := a.g.store.(keyGranter)
	if !ok {
		writeProblem(w, problem{Type: probAdminStore, Status: http.StatusNotImplemented, Detail: "This gateway's limiter store cannot grant units."})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	now := a.g.now()
	d := a.g.currentDirectives()
	v := grantView{Action: "grant", Kind: t.id.kind.String(), APIKeyID: t.apiKeyID, KeyID: a.g.keyID(&t.id),
		GatewayID: a.g.gatewayID, Store: "memory", Rule: name, Units: units}
	if a.g.shared {
		v.Store = "shared"
	}
	attrs := []any{"action", "grant", "actor", actor, "remote_addr", r.RemoteAddr, "kind", t.id.kind.String(),
		"key_id", v.KeyID, "rule", name, "units", units}
	if t.apiKeyID != "" {
		attrs = append(attrs, "api_key_id", t.apiKeyID) // a name from the config, not a secret
	}
	var failed error
	for _, s := range t.sets {
		bs, _ := a.buckets(st, t, s, d, now)
		shared := bs[0] // the shared bucket comes first
		i := slices.IndexFunc(shared.rules, func(rule limiter.Rule) bool { return rule.Name == name && rule.Calendar != nil })
		if i < 0 {
			continue
		}
		rule := shared.rules[i]
		g, err := kg.Grant(ctx, shared.key, rule, units)
		if err != nil {
			failed = errors.Join(failed, fmt.Errorf("%s: %w", scopeName(s), err))
			continue
		}
		gv := grantSetView{Scope: scopeName(s), Limit: rule.Limit, Granted: g.Granted, Count: g.Count, Remaining: g.Remaining,
			WindowStart: g.Start.In(rule.Calendar.Location()), WindowEnd: g.End.In(rule.Calendar.Location())}
		v.Grants = append(v.Grants, gv)
		a.auditGrant(t, s, actor, rule, gv, g.Time)
		a.log.Info("admin key grant", append(attrs, "rule_set", gv.Scope, "granted", g.Granted, "remaining", g.Remaining,
			"window_start", g.Start, "window_end", g.End)...)
	}
	if failed != nil {
		a.log.Error("admin key grant failed", append(attrs, "error", failed.Error())...)
		writeProblem(w, problem{Type: probAdminStore, Status: http.StatusServiceUnavailable,
			Detail: "The limiter store failed to grant (" + strconv.Itoa(len(v.Grants)) + " rule sets done); see the gateway log, and check with show before you retry: a grant that failed late may have been stored."})
		return
	}
	if len(v.Grants) == 0 {
		writeProblem(w, problem{Type: probBadRequest, Status: http.StatusBadRequest,
			Detail: "No calendar rule named " + strconv.Quote(name) + " applies to this caller: only a calendar rule's window takes a grant."})
		return
	}
	a.writeJSON(w, v)
}

// auditGrant publishes a grant's decision-stream record: mode admin,
// action "grant", the rule as the binding rule, the window's allowance
// after it (limit + granted) as limit and what it still admits as
// remaining; cost 0, so no reader counts it as usage. Its time is the
// store's when it granted (at; the gateway's when zero), the clock of the
// decisions around it, so a what-if replays it in its place among them.
func (a *Admin) auditGrant(t target, s ruleSet, actor string, rule limiter.Rule, g grantSetView, at time.Time) {
	if a.g.pub == nil {
		return
	}
	now := at
	if now.IsZero() {
		now = a.g.now()
	}
	store := event.StoreOK
	if !a.g.shared {
		store = event.StoreUnknown
	}
	a.g.pub.Publish(event.Decision{
		ID: event.NewID(now), Time: now, GatewayID: a.g.gatewayID,
		KeyID: a.g.keyID(&t.id), KeyKind: t.id.kind, KeyName: t.id.name, ClientIP: t.id.clientIP,
		Route: s.route, Method: http.MethodPost, Plan: s.l.plan.name,
		BindingRule: rule.Name, Limit: rule.Limit + g.Granted, Remaining: g.Remaining,
		Allowed: true, StoreStatus: store, Mode: event.ModeAdmin,
		Admin: event.AdminAction{Action: "grant", Actor: actor},
	})
}
