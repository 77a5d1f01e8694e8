package analytics

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// urlSecrets are what an alert URL may carry besides its host: a password,
// a path token, query and fragment values.
var urlSecrets = []string{"am-pass", "secret-path", "query-secret", "frag-secret"}

func wantNoURLSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, leak := range urlSecrets {
		if strings.Contains(s, leak) {
			t.Errorf("%s shows %q: %s", what, leak, s)
		}
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ give, want string }{
		{"http://am-user:am-pass@am:9093/?token=query-secret&x=query-secret#frag-secret", "http://am-user:xxxxx@am:9093/?token=xxxxx&x=xxxxx#xxxxx"},
		{"https://hooks.example/edge?access_token=query-secret", "https://hooks.example/edge?access_token=xxxxx"},
		{"http://am:9093", "http://am:9093"},
		{"http://am:9093/?a=query-secret;b=query-secret", "http://am:9093/"},
		{"http://am-user:am-pass@am:9093/%zz", "(unparsable, not shown: it may hold a password)"},
	}
	for _, tt := range tests {
		if got := RedactURL(tt.give); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

// TestAlertURLSecretsNotShown: a bad alert URL is named in Validate's error,
// and an unreachable one in the error Process returns (which serve logs),
// by neither its password nor its path nor its query and fragment values.
func TestAlertURLSecretsNotShown(t *testing.T) {
	c := defaults()
	c.Alerts.AlertmanagerURL = "ftp://am-user:am-pass@am:9093/?token=query-secret#frag-secret"
	c.Alerts.WebhookURL = "ftp://hooks.example/hook/secret-path?token=query-secret"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "am:9093") || !strings.Contains(err.Error(), "ftp://hooks.example") {
		t.Errorf("Validate() = %v, want an error naming am:9093 and ftp://hooks.example", err)
	} else {
		wantNoURLSecret(t, "Validate's error", err.Error())
	}

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := defaults().Alerts
	cfg.AlertmanagerURL = "http://am-user:am-pass@" + addr + "/?token=query-secret"
	cfg.WebhookURL = "http://" + addr + "/hook/secret-path?token=query-secret#frag-secret"
	a := NewAlerter(cfg, &http.Client{Timeout: 5 * time.Second}, time.Now)
	err = a.Process(context.Background(), []Alert{{Name: AlertFailOpen, Severity: "critical", Firing: true, Ratio: 0.5}})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Process to %s = %v, want an error naming it", addr, err)
	}
	wantNoURLSecret(t, "Process's error", err.Error())
}

// TestAlertmanagerURLWithQuery: an Alertmanager URL with a query (a
// proxy's token) is posted to at /api/v2/alerts with that query, not at
// its own path with the API's path appended to the query's value.
func TestAlertmanagerURLWithQuery(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.URL.Path + "?" + r.URL.RawQuery:
		default:
		}
	}))
	defer srv.Close()
	cfg := defaults().Alerts
	cfg.AlertmanagerURL = srv.URL + "/am/?token=t1"
	a := NewAlerter(cfg, srv.Client(), time.Now)
	if err := a.Process(context.Background(), []Alert{{Name: AlertFailOpen, Severity: "critical", Firing: true, Ratio: 0.5}}); err != nil {
		t.Fatal(err)
	}
	if p := <-got; p != "/am/api/v2/alerts?token=t1" {
		t.Errorf("posted to %s, want /am/api/v2/alerts?token=t1", p)
	}
}
