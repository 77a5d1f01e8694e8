package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenBudgetDocExample: the LLM plan and route of
// docs/configuration.md's "Token budgets and requests in flight" load as
// the gateway loads its file (with an upstream and an anonymous plan to
// make it whole).
func TestTokenBudgetDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Token budgets and requests in flight\n")
	if !ok {
		t.Fatal(`docs/configuration.md has no "## Token budgets and requests in flight" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("the section has no yaml block")
	}
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	file := block + "upstreams: {llm: {url: \"http://127.0.0.1:1\"}}\nanonymous_plan: llm-pro\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := loadConfig(path, func(string) string { return "" })
	if err != nil {
		t.Fatalf("the documented token budget does not load: %v", err)
	}
	if rt := fc.Routes[0]; rt.Tokens == nil || rt.Tokens.Reserve.Max != 16384 {
		t.Fatalf("route %+v: its tokens setting was not read", rt)
	}
	if rules := fc.Plans["llm-pro"].Rules; len(rules) != 4 || rules[3].InFlight != 8 {
		t.Fatalf("plan %+v: its in-flight rule was not read", rules)
	}
}
