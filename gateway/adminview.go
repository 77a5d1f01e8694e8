package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// keyView is the body of every admin answer: the caller, its directives
// and the live state of each rule set.
type keyView struct {
	// Action is "reset" or "clear" after a change; absent for show.
	Action    string `json:"action,omitempty"`
	Kind      string `json:"kind"`
	APIKeyID  string `json:"api_key_id,omitempty"`
	KeyID     string `json:"key_id"`
	Plan      string `json:"plan,omitempty"`
	GatewayID string `json:"gateway_id"`
	// Store is "shared" (Redis) or "memory" (this process only).
	Store    string        `json:"store"`
	RuleSets []ruleSetView `json:"rule_sets"`
}

type ruleSetView struct {
	Scope      string         `json:"scope"`
	Route      string         `json:"route,omitempty"`
	Plan       string         `json:"plan"`
	Directives directivesView `json:"directives"`
	Buckets    []bucketView   `json:"buckets"`
}

// directivesView is what analytics' directives do to a rule set here.
type directivesView struct {
	NAT   *limiter.NATDirective   `json:"nat,omitempty"`
	Split *limiter.SplitDirective `json:"split,omitempty"`
	// SplitSkipped: a live split names the key, but this rule set stays in
	// the shared bucket (it holds a rule longer than split_max_period, or
	// a share would be below one unit).
	SplitSkipped bool `json:"split_skipped,omitempty"`
}

type bucketView struct {
	Bucket  string     `json:"bucket"`
	InForce bool       `json:"in_force"`
	TTLMS   int64      `json:"ttl_ms"`
	Rules   []ruleView `json:"rules"`
	// Error is the store's failure to read this bucket, if it failed.
	Error string `json:"error,omitempty"`
}

type ruleView struct {
	Name          string `json:"name"`
	Algorithm     string `json:"algorithm"`
	Limit         int64  `json:"limit"`
	WindowSeconds int64  `json:"window_seconds"`
	Capacity      int64  `json:"capacity"`
	Shadow        bool   `json:"shadow,omitempty"`
	// Found is false when nothing is stored: the rule is full.
	Found        bool  `json:"found"`
	Remaining    int64 `json:"remaining"`
	Count        int64 `json:"count,omitempty"`
	Previous     int64 `json:"previous,omitempty"`
	ResetAfterMS int64 `json:"reset_after_ms"`
	// A calendar rule's: its calendar, the window at the store's clock,
	// and what was granted in it (its window admits limit + granted).
	Calendar    string     `json:"calendar,omitempty"`
	WindowStart *time.Time `json:"window_start,omitempty"`
	WindowEnd   *time.Time `json:"window_end,omitempty"`
	Granted     int64      `json:"granted,omitempty"`
}

// view reads the live state of every bucket of t's rule sets.
func (a *Admin) view(ctx context.Context, st *state, t target, action string) keyView {
	v := keyView{Action: action, Kind: t.id.kind.String(), APIKeyID: t.apiKeyID, KeyID: a.g.keyID(&t.id),
		GatewayID: a.g.gatewayID, Store: "memory"}
	if a.g.shared {
		v.Store = "shared"
	}
	if t.id.plan != nil {
		v.Plan = t.id.plan.name
	}
	ka, _ := a.g.store.(keyAdmin)
	now := a.g.now()
	d := a.g.currentDirectives()
	for _, s := range t.sets {
		bs, dv := a.buckets(st, t, s, d, now)
		sv := ruleSetView{Scope: s.scope, Route: s.route, Plan: s.l.plan.name, Directives: dv}
		for _, b := range bs {
			bv := bucketView{Bucket: b.name, InForce: b.inForce}
			var ks limiter.KeyState
			var err error
			if ka == nil {
				err = errors.New("the store cannot inspect keys")
			} else {
				ks, err = ka.Inspect(ctx, b.key, b.rules)
			}
			if err != nil {
				bv.Error = err.Error()
			}
			bv.TTLMS = ks.TTL.Milliseconds()
			for i, rule := range b.rules {
				rv := ruleView{Name: rule.Name, Algorithm: string(rule.Algorithm), Limit: rule.Limit,
					WindowSeconds: windowSeconds(rule), Capacity: rule.Capacity(), Shadow: rule.Shadow, Remaining: rule.Capacity()}
				if rv.Algorithm == "" {
					rv.Algorithm = string(limiter.TokenBucket)
				}
				if err == nil && i < len(ks.Rules) {
					rs := ks.Rules[i]
					rv.Found, rv.Remaining, rv.Count, rv.Previous = rs.Found, rs.Remaining, rs.Count, rs.Previous
					rv.ResetAfterMS = rs.ResetAfter.Milliseconds()
					rv.Granted = rs.Granted
				}
				if c := rule.Calendar; c != nil {
					rv.Calendar = c.String()
					at := now
					if err == nil {
						at = ks.Time // the store's clock picks the window
					}
					start, end := c.Bounds(at)
					rv.WindowStart, rv.WindowEnd = &start, &end
				}
				bv.Rules = append(bv.Rules, rv)
			}
			sv.Buckets = append(sv.Buckets, bv)
		}
		v.RuleSets = append(v.RuleSets, sv)
	}
	return v
}

func (a *Admin) writeView(w http.ResponseWriter, v keyView) { a.writeJSON(w, v) }

func (a *Admin) writeJSON(w http.ResponseWriter, v any) {
	body, _ := json.MarshalIndent(v, "", "  ")
	w.Header()["Content-Type"] = []string{"application/json"}
	w.Header()["Cache-Control"] = []string{"no-store"}
	_, _ = w.Write(append(body, '\n'))
}
