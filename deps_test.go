package edgelimit_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestImportGraph pins the data flow of DESIGN.md as a statement of
// policy: packages import only what the table allows, and only cmd/*
// imports everything.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/edgelimit/edgelimit/"
	allowed := map[string][]string{
		"limiter":         {},
		"gateway/event":   {},
		"gateway/publish": {"gateway/event"},
		"gateway":         {"limiter", "gateway/event", "gateway/publish"},
		"consumer":        {"gateway/event"},
		"analytics":       {"limiter"},
	}
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkg := strings.TrimPrefix(p.ImportPath, mod)
		if strings.HasPrefix(pkg, "cmd/") || strings.HasPrefix(pkg, "internal/") || pkg == p.ImportPath {
			continue
		}
		may, ok := allowed[topLevel(pkg, allowed)]
		if !ok {
			t.Errorf("package %s is not in the import policy; add it to TestImportGraph", pkg)
			continue
		}
		seen++
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			if topLevel(dep, allowed) == topLevel(pkg, allowed) {
				continue // a package's own subpackages
			}
			if !contains(may, topLevel(dep, allowed)) {
				t.Errorf("%s imports %s; the policy allows only %v", pkg, dep, may)
			}
		}
	}
	if seen < 3 {
		t.Errorf("checked only %d packages; go list found too few", seen)
	}
}

// topLevel maps a package to its policy entry: the longest listed prefix.
func topLevel(pkg string, allowed map[string][]string) string {
	best := ""
	for p := range allowed {
		if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > len(best) {
			best = p
		}
	}
	if best == "" {
		return pkg
	}
	return best
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
