package edgelimit_test

import (
	"bufio"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/envdoc"
)

var envNameRE = regexp.MustCompile(`EDGELIMIT_[A-Z0-9_]*[A-Z0-9]_?`)

// docPages are the prose a reader follows: the README and docs/*.md.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 8 {
		t.Fatalf("docs/ holds %v, want a page per reader", pages)
	}
	return append([]string{"README.md"}, pages...)
}

// TestREADMEFrontDoor: the README stays a front door: short, with the two
// commands, a first request and a link to every page of docs/.
func TestREADMEFrontDoor(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if n := strings.Count(s, "\n"); n > 300 {
		t.Errorf("README.md has %d lines, want at most 300: the manual lives in docs/", n)
	}
	for _, want := range []string{"make run", "make test", "curl -si -H 'X-API-Key: demo-key-1'", "429 Too Many Requests", "DEMO_TRAFFIC=1 make run"} {
		if !strings.Contains(s, want) {
			t.Errorf("README.md lacks %q", want)
		}
	}
	for _, p := range docPages(t)[1:] {
		if !strings.Contains(s, "]("+filepath.ToSlash(p)) {
			t.Errorf("README.md does not link %s", p)
		}
	}
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks: every relative link of the README and docs/ lands on a
// file of the repository, and a link with a #fragment on a heading of the
// page it names.
func TestDocLinks(t *testing.T) {
	anchors := map[string]map[string]bool{}
	headingsOf := func(p string) map[string]bool {
		if a, ok := anchors[p]; ok {
			return a
		}
		a := map[string]bool{}
		for _, h := range headings(t, p) {
			a[anchor(h)] = true
		}
		anchors[p] = a
		return a
	}
	links := 0
	for _, page := range docPages(t) {
		for _, line := range proseLines(t, page) {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, frag, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = path.Join(path.Dir(page), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s links to %s, which does not exist", page, target)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s links to %s: a fragment of a file that is not Markdown", page, target)
					continue
				}
				if !headingsOf(dest)[frag] {
					t.Errorf("%s links to %s, but %s has no heading #%s", page, target, dest, frag)
				}
			}
		}
	}
	if links < 30 {
		t.Errorf("found %d relative links, want the pages linked to each other", links)
	}
}

// proseLines returns the lines of a Markdown page outside fenced code.
func proseLines(t *testing.T, p string) []string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	fence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// headings returns the text of a page's headings, outside fenced code.
func headings(t *testing.T, p string) []string {
	t.Helper()
	var out []string
	for _, line := range proseLines(t, p) {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			out = append(out, h)
		}
	}
	return out
}

// TestDocsEnvironment keeps the environment table of docs/configuration.md
// and the code in step both ways, beside the per-process tests in cmd/*
// (which record what each configuration reads): every EDGELIMIT_* name in
// the processes' configuration code is in the table, even one read only
// sometimes, and every EDGELIMIT_* name the README or a page of docs/
// mentions is read by some code or script.
func TestDocsEnvironment(t *testing.T) {
	vars, err := envdoc.EnvTable(envdoc.Doc)
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	for _, v := range vars {
		if slices.Contains(table, v.Name) {
			t.Errorf("%s's environment table lists %s twice", envdoc.Doc, v.Name)
		}
		if len(v.Processes) == 0 {
			t.Errorf("%s's environment table ticks no process for %s", envdoc.Doc, v.Name)
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
			t.Errorf("the code reads %s, but %s's environment table does not list it", name, envdoc.Doc)
		}
	}

	// Everything the prose mentions exists somewhere: Go code, the
	// scripts, the Makefile, the compose file.
	known := namesIn(t, []string{"."}, func(p string) bool {
		return (strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go")) ||
			strings.HasSuffix(p, ".sh") || p == "Makefile" || p == "docker-compose.yml" || p == "Dockerfile"
	})
	for _, page := range docPages(t) {
		b, err := os.ReadFile(page)
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
			// A family (EDGELIMIT_REDIS_*) is read when the table lists
			// members of it.
			if strings.HasSuffix(name, "_") {
				read = read || slices.ContainsFunc(table, func(v string) bool { return strings.HasPrefix(v, name) })
			}
			if !read {
				t.Errorf("%s mentions %s, which no code or script reads", page, name)
			}
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
