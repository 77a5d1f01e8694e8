package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

type eventLog struct {
	mu  sync.Mutex
	all []event.Decision
}

func (e *eventLog) Publish(d event.Decision) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, d)
}

func (e *eventLog) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.all)
}

// TestCallOfMoreRulesThanOneLimiterCall: a Call of 40 rules (three
// limiter calls) is decided exactly and all-or-nothing: a refusal by a
// rule of the last call gives back what the first two charged before the
// answer, and the request is one decision event.
func TestCallOfMoreRulesThanOneLimiterCall(t *testing.T) {
	ev := &eventLog{}
	g, err := New(testConfig("http://127.0.0.1:1"), Options{Publisher: ev})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	rules := make([]Rule, 40)
	for i := range rules {
		rules[i] = Rule{Rule: limiter.Rule{Name: fmt.Sprintf("r%d", i), Limit: 5, Period: time.Hour}}
	}
	rules[39].Limit = 1 // the last call's last rule admits one request an hour
	enforce := func() Verdict {
		t.Helper()
		return g.Enforce(context.Background(), Call{Key: "door", Plan: "many", Rules: rules, Cost: 1, Route: "envoy:test"}, http.Header{})
	}
	v := enforce()
	if !v.Allowed || !v.Known || len(v.Decision.Rules) != 40 || v.Decision.Rules[0].Remaining != 4 || v.Decision.Rules[39].Remaining != 0 {
		t.Fatalf("first request: %+v, want allowed with 40 results, r0 at 4 remaining, r39 at 0", v)
	}
	if b := v.Decision.BindingRule(); b.Rule.Name != "r39" {
		t.Errorf("binding rule %q, want r39 (0 remaining)", b.Rule.Name)
	}
	for range 3 {
		v = enforce()
		if v.Allowed || v.Status != http.StatusTooManyRequests || v.Decision.BindingRule().Rule.Name != "r39" {
			t.Fatalf("second request: %+v, want 429 by r39", v)
		}
		// The first two calls' rules read as after their give-back.
		for _, i := range []int{0, 15, 16, 31} {
			if rr := v.Decision.Rules[i]; !rr.Allowed || rr.Remaining != 4 {
				t.Errorf("refused request, rule %d: %+v, want admitting with 4 remaining (its charge given back)", i, rr)
			}
		}
	}
	for i, r := range rules[:39] {
		ks, err := g.local.Inspect(context.Background(), "door", []limiter.Rule{r.Rule})
		if err != nil {
			t.Fatal(err)
		}
		if got := ks.Rules[0].Remaining; got != 4 {
			t.Errorf("after three refused requests, rule %d has %d remaining, want 4: only the admitted request spent", i, got)
		}
	}
	if n := ev.len(); n != 4 {
		t.Errorf("%d decision events for 4 requests, want 4", n)
	}
}
