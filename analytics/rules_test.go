package analytics_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	// promtool must find every rule the file declares.
	rules, err := os.ReadFile(filepath.Join(dir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	declared := len(regexp.MustCompile(`(?m)^\s*- alert: `).FindAll(rules, -1))
	for _, tc := range []struct {
		name string
		bin  string
		args []string
		want string
	}{
		{"rules check", promtool, []string{"check", "rules", "alerts.yml"}, fmt.Sprintf("SUCCESS: %d rules found", declared)},
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

// TestAlertRulesNameRealMetrics keeps the rules in step with the code: every
// edgelimit_* series an alert reads must be registered by the gateway, its
// publisher, the consumer or analytics (a renamed metric would silence an
// alert).
func TestAlertRulesNameRealMetrics(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, glob := range []string{"../gateway/*.go", "../gateway/publish/*.go", "../consumer/*.go", "*.go"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
	}
	code := src.String()
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`edgelimit_[a-z_]+`).FindAllString(string(rules), -1) {
		names[m] = true
	}
	if len(names) < 8 {
		t.Fatalf("found only %d metric names in alerts.yml: %v", len(names), names)
	}
	for m := range names {
		if !strings.Contains(code, `"`+m+`"`) && !underNamespace(code, m) {
			t.Errorf("alerts.yml reads %s, which no gateway, publish or consumer code registers", m)
		}
	}
}

// underNamespace reports whether code names metric m as a namespace const
// and a name under it: how the gateway, consumer and analytics build
// their names.
func underNamespace(code, m string) bool {
	for _, ns := range []string{"edgelimit_gateway", "edgelimit_consumer", "edgelimit_analytics"} {
		if name, ok := strings.CutPrefix(m, ns+"_"); ok && strings.Contains(code, `"`+ns+`"`) && strings.Contains(code, `"`+name+`"`) {
			return true
		}
	}
	return false
}
