package edgelimit_test

import (
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
)

// TestRunbookLinks: every alert rule links to its own section of
// docs/runbook.md (runbook_url, the Prometheus convention), that section
// exists and says what the alert means, what to check first and how to
// fix it, and every link inside the runbook lands on a heading.
func TestRunbookLinks(t *testing.T) {
	b, err := os.ReadFile("deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	sections := runbookSections(t, "docs/runbook.md")
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue // a recording rule
			}
			n++
			raw := r.Annotations["runbook_url"]
			u, err := url.Parse(raw)
			if err != nil || u.Scheme != "https" || !strings.HasSuffix(u.Path, "/docs/runbook.md") || u.Fragment == "" {
				t.Errorf("%s: runbook_url %q, want https://…/docs/runbook.md#<section>", r.Alert, raw)
				continue
			}
			body, ok := sections[u.Fragment]
			if !ok {
				t.Errorf("%s: runbook_url anchor #%s is no heading of docs/runbook.md", r.Alert, u.Fragment)
				continue
			}
			if u.Fragment != anchor(r.Alert) {
				t.Errorf("%s: runbook_url points at #%s, want its own section #%s", r.Alert, u.Fragment, anchor(r.Alert))
			}
			for _, want := range []string{"**Meaning.**", "**First checks.**", "**Fixes.**"} {
				if !strings.Contains(body, want) {
					t.Errorf("docs/runbook.md#%s lacks %s", u.Fragment, want)
				}
			}
		}
	}
	if n < 9 {
		t.Errorf("found %d alerts in alerts.yml, want at least 9", n)
	}

	// The fleet alerts analytics posts to Alertmanager link the same way.
	for _, name := range []string{analytics.AlertStoreUnavailable, analytics.AlertFailOpen, analytics.AlertFailClosed} {
		u, err := url.Parse(analytics.RunbookURL(name))
		if err != nil {
			t.Fatal(err)
		}
		if body, ok := sections[u.Fragment]; !ok || !strings.Contains(body, "**Meaning.**") {
			t.Errorf("%s: runbook_url %s has no section with its meaning in docs/runbook.md", name, u)
		}
	}

	doc, _ := os.ReadFile("docs/runbook.md")
	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(string(doc), -1) {
		if _, ok := sections[m[1]]; !ok {
			t.Errorf("docs/runbook.md links to #%s, which is no heading", m[1])
		}
	}
}

// runbookSections maps each heading's anchor (as GitHub renders it) to
// the text under it, up to the next heading.
func runbookSections(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			cur = anchor(h)
			if _, dup := out[cur]; dup {
				t.Errorf("%s: two headings with anchor #%s", path, cur)
			}
			out[cur] = ""
			continue
		}
		out[cur] += line + "\n"
	}
	return out
}

// anchor is GitHub's anchor for a heading: lower case, punctuation
// dropped, spaces as dashes.
func anchor(heading string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			sb.WriteRune(r)
		case r == ' ':
			sb.WriteRune('-')
		}
	}
	return sb.String()
}
