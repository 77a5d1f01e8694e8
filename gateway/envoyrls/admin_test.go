package envoyrls

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/event"
)

// TestAdminResetsADescriptorsBucket: the gateway's admin API, given the
// door, resets the bucket a descriptor counts in, and audits it with a
// decision event (mode admin) naming the domain and the entries, a
// value that may be a credential hashed.
func TestAdminResetsADescriptorsBucket(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "memory")
	a, err := gateway.NewAdmin(r.gw, gateway.AdminConfig{Tokens: map[string]gateway.Secret{"oncall": "0123456789abcdef0"}})
	if err != nil {
		t.Fatal(err)
	}
	a.SetDoor(r.svc)
	mux := http.NewServeMux()
	a.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	r.ask(t, "test", 0, desc("generic_key", "one"))
	if r.ask(t, "test", 0, desc("generic_key", "one")).GetOverallCode() != over {
		t.Fatal("second of 1 a day: want OVER_LIMIT")
	}
	q := url.Values{"domain": {"test"}, "entry": {"generic_key=one"}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+gateway.AdminPath+"/reset?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reset: %s", resp.Status)
	}
	if st := r.ask(t, "test", 0, desc("generic_key", "one")).GetStatuses()[0]; st.GetCode() != ok {
		t.Errorf("after reset: %v, want OK", st)
	}
	var audit *event.Decision
	for _, e := range r.events.list() {
		if e.Mode == event.ModeAdmin {
			audit = &e
		}
	}
	if audit == nil || audit.Admin != (event.AdminAction{Action: "reset", Actor: "oncall"}) || audit.Domain != "test" ||
		len(audit.Descriptor) != 1 || audit.Descriptor[0] != (event.DescriptorEntry{Key: "generic_key", Value: "one"}) {
		t.Errorf("audit event %+v, want a reset by oncall of test's generic_key=one", audit)
	}
}
