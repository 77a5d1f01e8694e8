package testenv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The shared Prometheus and Alertmanager serve every package under test at
// once: a test names its files after itself and asks for the alerts of its
// own targets only.

// PrometheusFile writes b to the shared Prometheus's folder as
// kind/name.yml (kind is "rules" or "targets", see PrometheusDir) and has
// Prometheus reload; when the test ends it removes the file and reloads
// again, so no rule of the test keeps firing for the next one.
func PrometheusFile(tb testing.TB, kind, name string, b []byte) {
	tb.Helper()
	path := filepath.Join(PrometheusDir(tb), kind, name+".yml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		os.Remove(path)
		ReloadPrometheus(tb)
	})
	ReloadPrometheus(tb)
}

// ReloadPrometheus has the shared Prometheus read its rule files again.
func ReloadPrometheus(tb testing.TB) {
	tb.Helper()
	resp, err := http.Post(PrometheusURL(tb)+"/-/reload", "", nil)
	if err != nil {
		tb.Fatalf("POST /-/reload: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Errorf("POST /-/reload = %d, want 200", resp.StatusCode)
	}
}

// PrometheusHas reports whether an instant query on the shared Prometheus
// returns any series; an unanswered query has none, for a test that waits
// until it has.
func PrometheusHas(tb testing.TB, query string) bool {
	tb.Helper()
	resp, err := http.Get(PrometheusURL(tb) + "/api/v1/query?" + url.Values{"query": {query}}.Encode())
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	return json.NewDecoder(resp.Body).Decode(&r) == nil && len(r.Data.Result) > 0
}

// ActiveAlerts returns the names of the alerts active in the shared
// Alertmanager, neither silenced nor inhibited nor ended, whose labels
// match every matcher, such as `instance="127.0.0.1:9100"`.
func ActiveAlerts(tb testing.TB, matchers ...string) ([]string, error) {
	tb.Helper()
	q := url.Values{"filter": matchers, "active": {"true"}, "silenced": {"false"}, "inhibited": {"false"}}
	resp, err := http.Get(AlertmanagerURL(tb) + "/api/v2/alerts?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/v2/alerts: %s", resp.Status)
	}
	var alerts []struct {
		Labels map[string]string `json:"labels"`
		EndsAt time.Time         `json:"endsAt"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&alerts); err != nil {
		return nil, fmt.Errorf("GET /api/v2/alerts: %w", err)
	}
	var names []string
	for _, a := range alerts {
		// Alertmanager lists a resolved alert until it is garbage
		// collected; it is not active past its end.
		if a.EndsAt.After(time.Now()) {
			names = append(names, a.Labels["alertname"])
		}
	}
	slices.Sort(names)
	return names, nil
}
