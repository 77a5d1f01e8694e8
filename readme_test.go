package edgelimit_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/readme"
)

var envNameRE = regexp.MustCompile(`EDGELIMIT_[A-Z0-9_]*[A-Z0-9]_?`)

// TestREADMEEnvironment keeps README.md's environment variables and the
// code in step both ways, beside the per-process tests in cmd/* (which
// record what each configuration reads): every EDGELIMIT_* name in the
// processes' configuration code is in the table, even one read only
// sometimes, and every EDGELIMIT_* name the README mentions anywhere is
// read by some code or script.
func TestREADMEEnvironment(t *testing.T) {
	vars, err := readme.EnvTable("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	for _, v := range vars {
		if slices.Contains(table, v.Name) {
			t.Errorf("README.md's environment table lists %s twice", v.Name)
		}
		if len(v.Processes) == 0 {
			t.Errorf("README.md's environment table ticks no process for %s", v.Name)
		}
		table = append(table, v.Name)
	}

	// What the processes' configuration code names.
	for _, name := range namesIn(t, []string{"cmd", "internal/boot"}, func(p string) bool {
		return strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go")
	}) {
		// A prefix the code completes: EDGELIMIT_UPSTREAM_ + an upstream's
		// name (listed as EDGELIMIT_UPSTREAM_<NAME>), or a link's prefix
		// (EDGELIMIT_REDIS + _TLS_CA_FILE and the like, listed one by one).
		prefix := name
		if !strings.HasSuffix(prefix, "_") {
			prefix += "_"
		}
		listed := slices.ContainsFunc(table, func(v string) bool { return v == name || strings.HasPrefix(v, prefix) })
		if !listed {
			t.Errorf("the code reads %s, but README.md's environment table does not list it", name)
		}
	}

	// Everything the README mentions exists somewhere: Go code, the
	// scripts, the Makefile, the compose file.
	known := namesIn(t, []string{"."}, func(p string) bool {
		return (strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go")) ||
			strings.HasSuffix(p, ".sh") || p == "Makefile" || p == "docker-compose.yml" || p == "Dockerfile"
	})
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range envNameRE.FindAllString(string(b), -1) {
		// A name the code builds from a link's prefix (EDGELIMIT_REDIS +
		// _TLS_CA_FILE) is in no source as a whole, but in the table,
		// whose every row the cmd/* tests saw a process read.
		base := strings.TrimSuffix(name, "_FILE")
		read := slices.Contains(known, name) || slices.Contains(known, base) ||
			slices.Contains(table, name) || slices.Contains(table, base)
		if !read {
			t.Errorf("README.md mentions %s, which no code or script reads", name)
		}
	}
}

// namesIn lists the EDGELIMIT_* names in the files under roots that keep
// selects (a path relative to the repository's root).
func namesIn(t *testing.T, roots []string, keep func(string) bool) []string {
	t.Helper()
	var out []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != "." || d.Name() == "tools") {
				return filepath.SkipDir
			}
			if d.IsDir() || !keep(filepath.ToSlash(p)) {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, n := range envNameRE.FindAllString(string(b), -1) {
				if !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}
