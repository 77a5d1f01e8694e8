package analytics

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestEvaluateAlerts(t *testing.T) {
	cfg := defaults().Alerts // 5 % unavailable, 1 % open, 1 % closed, 100 requests
	type firing struct {
		Name     string
		Gateways []string
	}
	tests := []struct {
		name string
		give []GatewayHealth
		want []firing
	}{
		{
			name: "healthy",
			give: []GatewayHealth{{Gateway: "a", Requests: 10000, StoreOK: 10000}, {Gateway: "b", Requests: 10000, StoreOK: 10000}},
		},
		{
			name: "one gateway's store down, failing open",
			give: []GatewayHealth{
				{Gateway: "a", Requests: 10000, StoreOK: 10000},
				{Gateway: "b", Requests: 1000, StoreUnavailable: 900, StoreTimeout: 100, FailOpen: 1000},
			},
			// 1000/11000 = 9 % unavailable, 9 % open.
			want: []firing{{AlertStoreUnavailable, []string{"b"}}, {AlertFailOpen, []string{"b"}}},
		},
		{
			name: "timeouts count as unavailable; fail closed",
			give: []GatewayHealth{
				{Gateway: "a", Requests: 1000, StoreTimeout: 60, FailClosed: 60},
				{Gateway: "b", Requests: 1000, StoreTimeout: 50, FailClosed: 50},
			},
			want: []firing{{AlertStoreUnavailable, []string{"a", "b"}}, {AlertFailClosed, []string{"a", "b"}}},
		},
		{
			name: "spread thin: fleet ratio under the threshold",
			give: []GatewayHealth{
				{Gateway: "a", Requests: 100000, StoreOK: 100000},
				{Gateway: "b", Requests: 100, StoreUnavailable: 100, FailOpen: 100},
			},
		},
		{
			name: "too little traffic",
			give: []GatewayHealth{{Gateway: "a", Requests: 99, StoreUnavailable: 99, FailOpen: 99}},
		},
		{
			name: "at the thresholds exactly",
			give: []GatewayHealth{{Gateway: "a", Requests: 1000, StoreUnavailable: 50, FailOpen: 10, FailClosed: 9}},
			want: []firing{{AlertStoreUnavailable, []string{"a"}}, {AlertFailOpen, []string{"a"}}},
		},
		{name: "no data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			all := EvaluateAlerts(cfg, tt.give)
			if len(all) != 3 {
				t.Fatalf("EvaluateAlerts returned %d alerts, want all 3", len(all))
			}
			var got []firing
			for _, a := range all {
				if a.Firing {
					got = append(got, firing{a.Name, a.Gateways})
				}
				if a.Summary == "" || a.Runbook == "" || a.Severity == "" {
					t.Errorf("alert %s lacks summary, runbook or severity: %+v", a.Name, a)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("EvaluateAlerts firing mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// recorder is an HTTP endpoint that keeps what it was posted.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
	fail   bool
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	r.bodies = append(r.bodies, b)
}

func (r *recorder) setFail(fail bool) {
	r.mu.Lock()
	r.fail = fail
	r.mu.Unlock()
}

func (r *recorder) take() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.bodies
	r.bodies = nil
	return b
}

func TestAlerterDedup(t *testing.T) {
	am, hook := &recorder{}, &recorder{}
	amSrv, hookSrv := httptest.NewServer(am), httptest.NewServer(hook)
	defer amSrv.Close()
	defer hookSrv.Close()
	var mu sync.Mutex
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	cfg := defaults().Alerts
	cfg.AlertmanagerURL, cfg.WebhookURL = amSrv.URL, hookSrv.URL
	cfg.Labels = map[string]string{"cluster": "test"}
	a := NewAlerter(cfg, amSrv.Client(), clock)
	ctx := context.Background()
	open := func(firing bool) []Alert {
		return []Alert{{Name: AlertFailOpen, Severity: "critical", Firing: firing, Ratio: 0.5, Summary: "s", Runbook: "r"}}
	}
	// process evaluates the fail-open alert, firing or not, and fails the
	// test if posting it fails.
	process := func(firing bool) {
		t.Helper()
		if err := a.Process(ctx, open(firing)); err != nil {
			t.Fatal(err)
		}
	}
	// nothingPosted fails the test if Alertmanager or the webhook got a
	// post since the last take.
	nothingPosted := func(what string) {
		t.Helper()
		if n := len(am.take()) + len(hook.take()); n != 0 {
			t.Fatalf("%s posted %d times", what, n)
		}
	}
	amAlerts := func(bodies [][]byte) []postableAlert {
		t.Helper()
		var all []postableAlert
		for _, b := range bodies {
			var as []postableAlert
			if err := json.Unmarshal(b, &as); err != nil {
				t.Fatalf("alertmanager body %s: %v", b, err)
			}
			all = append(all, as...)
		}
		return all
	}

	// Quiet: nothing posted.
	process(false)
	nothingPosted("quiet evaluation")

	// Fires: both told.
	process(true)
	started := clock()
	got := amAlerts(am.take())
	if len(got) != 1 || got[0].Labels["alertname"] != AlertFailOpen || got[0].Labels["cluster"] != "test" ||
		got[0].Labels["source"] != "edgelimit-analytics" || !got[0].StartsAt.Equal(started) || !got[0].EndsAt.After(clock()) {
		t.Fatalf("firing post to alertmanager = %+v", got)
	}
	hooks := hook.take()
	var msg WebhookMessage
	if len(hooks) != 1 || json.Unmarshal(hooks[0], &msg) != nil || msg.Status != "firing" || len(msg.Alerts) != 1 {
		t.Fatalf("firing post to webhook = %q", hooks)
	}

	// Still firing within the resend interval: deduplicated.
	advance(30 * time.Second)
	process(true)
	nothingPosted("repeat within the resend interval")
	if f := a.Firing(); len(f) != 1 || f[0].Name != AlertFailOpen {
		t.Errorf("Firing() = %+v, want the fail-open alert", f)
	}

	// After the resend interval: Alertmanager refreshed, same start; webhook not.
	advance(31 * time.Second)
	process(true)
	if got := amAlerts(am.take()); len(got) != 1 || !got[0].StartsAt.Equal(started) {
		t.Fatalf("resend to alertmanager = %+v, want one alert starting %v", got, started)
	}
	if n := len(hook.take()); n != 0 {
		t.Fatalf("resend posted to the webhook %d times", n)
	}

	// Resolves while Alertmanager is down: retried next time.
	am.setFail(true)
	advance(10 * time.Second)
	resolved := clock()
	if err := a.Process(ctx, open(false)); err == nil {
		t.Fatal("Process with Alertmanager down returned no error")
	}
	if hooks := hook.take(); len(hooks) != 1 || json.Unmarshal(hooks[0], &msg) != nil || msg.Status != "resolved" {
		t.Fatalf("resolved post to webhook = %q", hooks)
	}
	am.setFail(false)
	advance(5 * time.Second)
	process(false)
	if got := amAlerts(am.take()); len(got) != 1 || !got[0].EndsAt.Equal(resolved) {
		t.Fatalf("resolved post to alertmanager = %+v, want endsAt %v", got, resolved)
	}
	if n := len(hook.take()); n != 0 {
		t.Fatalf("webhook told of the resolution twice")
	}
	if f := a.Firing(); len(f) != 0 {
		t.Errorf("Firing() after resolution = %+v", f)
	}

	// Quiet again: nothing more.
	process(false)
	nothingPosted("quiet evaluation after resolution")
}
