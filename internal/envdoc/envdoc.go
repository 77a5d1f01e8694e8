// Package envdoc reads what docs/configuration.md promises about the
// code, for the tests that hold the code to it: the environment-variable
// table, which cmd/* tests compare with the variables each process really
// reads.
package envdoc

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Var is one row of the environment table.
type Var struct {
	// Name is the variable, e.g. EDGELIMIT_REDIS_ADDR or
	// EDGELIMIT_UPSTREAM_<NAME>.
	Name string
	// Processes are the columns ticked: gateway, consumer, analytics.
	Processes []string
	// Text is the row's description.
	Text string
}

var rowRE = regexp.MustCompile("^\\| `(EDGELIMIT_[A-Z0-9_<>]+)` \\|")

// Doc is the page that holds the environment table, relative to the
// module's root.
const Doc = "docs/configuration.md"

// headingRE finds the table's heading, at any level.
var headingRE = regexp.MustCompile(`(?m)^#+ Environment variables\n`)

// EnvTable parses the table under the heading "Environment variables" of
// the page at path: a header row naming the processes, then one row a
// variable with ✓ under each process that reads it.
func EnvTable(path string) ([]Var, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	loc := headingRE.FindIndex(b)
	if loc == nil {
		return nil, fmt.Errorf("%s: no \"Environment variables\" section", path)
	}
	after := string(b[loc[1]:])
	var header []string
	var out []Var
	for _, line := range strings.Split(after, "\n") {
		if strings.HasPrefix(line, "#") {
			break // the next section
		}
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case header == nil:
			header = cells
		case strings.HasPrefix(cells[0], "---"):
		default:
			m := rowRE.FindStringSubmatch(line)
			if m == nil || len(cells) != len(header) {
				return nil, fmt.Errorf("%s: bad environment row %q", path, line)
			}
			v := Var{Name: m[1], Text: cells[len(cells)-1]}
			for i := 1; i < len(cells)-1; i++ {
				if cells[i] != "" {
					v.Processes = append(v.Processes, header[i])
				}
			}
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: the environment table has no rows", path)
	}
	return out, nil
}

// For returns the variables the table says process reads, sorted.
func For(vars []Var, process string) []string {
	var out []string
	for _, v := range vars {
		if slices.Contains(v.Processes, process) {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Path is Doc in the module's root, found from the working directory
// up.
func Path() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, filepath.FromSlash(Doc)), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Recorder wraps getenv and remembers every EDGELIMIT_* name asked for.
type Recorder struct {
	getenv func(string) string
	mu     sync.Mutex
	names  map[string]bool
}

// NewRecorder records the names asked of getenv.
func NewRecorder(getenv func(string) string) *Recorder {
	return &Recorder{getenv: getenv, names: map[string]bool{}}
}

// Getenv is the recording getenv.
func (r *Recorder) Getenv(name string) string {
	r.mu.Lock()
	r.names[name] = true
	r.mu.Unlock()
	return r.getenv(name)
}

// Names returns the EDGELIMIT_* names asked for, sorted, with X_FILE
// folded into X when both were asked (a secret read from a file), and
// the secrets so folded.
func (r *Recorder) Names() (names, secrets []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for n := range r.names {
		if !strings.HasPrefix(n, "EDGELIMIT_") {
			continue
		}
		if base, ok := strings.CutSuffix(n, "_FILE"); ok && r.names[base] {
			secrets = append(secrets, base)
			continue
		}
		names = append(names, n)
	}
	slices.Sort(names)
	slices.Sort(secrets)
	return names, secrets
}

// CheckEnv fails t unless the environment table ticks process for
// exactly the variables in names (what the process read, from a
// Recorder), and the row of every secret says it can be read from a file
// (X_FILE).
func CheckEnv(t testing.TB, process string, names, secrets []string) {
	t.Helper()
	path, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	vars, err := EnvTable(path)
	if err != nil {
		t.Fatal(err)
	}
	documented := For(vars, process)
	for _, n := range names {
		if !slices.Contains(documented, n) {
			t.Errorf("%s reads %s, but %s's environment table does not tick %s for it: add it", process, n, Doc, process)
		}
	}
	for _, n := range documented {
		if !slices.Contains(names, n) {
			t.Errorf("%s's environment table says %s reads %s, but it does not", Doc, process, n)
		}
	}
	for _, v := range vars {
		if slices.Contains(secrets, v.Name) && !strings.Contains(v.Text, "_FILE") {
			t.Errorf("%s: %s is a secret (%s_FILE works too), but its row does not say so", Doc, v.Name, v.Name)
		}
	}
	if len(names) < 3 {
		t.Errorf("%s read only %v: the recorder saw too little", process, names)
	}
}
