package analytics_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tool finds a command-line tool of the real-server tier: it skips when the
// tool is missing locally and fails where servers are required (make test,
// CI), like internal/testenv does for servers.
func tool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("EDGELIMIT_REQUIRE_SERVERS") != "" || os.Getenv("CI") != "" {
		tb.Fatalf("%s not found: %v (apt-get install prometheus prometheus-alertmanager)", name, err)
	}
	tb.Skipf("%s not installed", name)
	return ""
}

// TestAlertRules runs the alert rules' unit tests (deploy/prometheus/
// alerts_test.yml) and checks the example configurations, so make test
// covers the files on-call relies on.
func TestAlertRules(t *testing.T) {
	dir := filepath.Join("..", "deploy", "prometheus")
	promtool := tool(t, "promtool")
	for _, tc := range []struct {
		name string
		bin  string
		args []string
		want string
	}{
		{"rules check", promtool, []string{"check", "rules", "alerts.yml"}, "SUCCESS: 8 rules found"},
		{"rules unit tests", promtool, []string{"test", "rules", "alerts_test.yml"}, "SUCCESS"},
		{"prometheus config", promtool, []string{"check", "config", "prometheus.yml"}, "is valid prometheus config"},
		{"alertmanager config", "amtool", []string{"check-config", "alertmanager.yml"}, "SUCCESS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := tc.bin
			if bin == "amtool" {
				bin = tool(t, "amtool")
			}
			cmd := exec.Command(bin, tc.args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(tc.args, " "), err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("%s %s printed no %q:\n%s", filepath.Base(bin), strings.Join(tc.args, " "), tc.want, out)
			}
		})
	}
}
