// Command testreport reads `go test -json` on stdin and writes what a
// plain `go test` writes (each package's result, and the output of every
// test that failed), then the ten slowest tests, so the next slow one is
// seen where it lands. It exits 1 when a package or a test failed or a
// package did not build, so `make test` can pipe through it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"
)

// event is one line of test2json's output.
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Elapsed    float64
	Output     string
}

// timing is how long one top-level test took.
type timing struct {
	pkg, test string
	elapsed   time.Duration
}

func main() {
	failed, err := report(os.Stdin, os.Stdout, 10)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// report copies the results read from r to w, then the slowest tests,
// and says whether anything failed.
func report(r io.Reader, w io.Writer, slowest int) (failed bool, err error) {
	held := map[string][]string{} // package + test → output held until its end
	var times []timing
	var first, last time.Time // of the events: the first test binary's start, the last result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line) // not an event: a build error, a server's line
			continue
		}
		if !e.Time.IsZero() {
			if first.IsZero() {
				first = e.Time
			}
			last = e.Time
		}
		id := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Action == "build-fail":
			failed = true
		case e.Test == "":
			// The package's own lines: its result, output outside tests.
			if o := strings.TrimSpace(e.Output); e.Action == "output" && o != "PASS" && o != "FAIL" {
				fmt.Fprint(w, e.Output)
			}
			failed = failed || e.Action == "fail"
		case e.Action == "output":
			held[id] = append(held[id], e.Output)
		case e.Action == "fail":
			failed = true
			fmt.Fprint(w, strings.Join(held[id], ""))
			delete(held, id)
		case e.Action == "pass" || e.Action == "skip":
			delete(held, id)
			if !strings.Contains(e.Test, "/") {
				times = append(times, timing{e.Package, e.Test, time.Duration(e.Elapsed * float64(time.Second))})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	// A test still holding output never ended: its package panicked or
	// timed out, and what it wrote says where.
	for _, id := range slices.Sorted(maps.Keys(held)) {
		failed = true
		fmt.Fprintf(w, "--- %s did not finish:\n%s", id, strings.Join(held[id], ""))
	}
	slices.SortFunc(times, func(a, b timing) int { return int(b.elapsed - a.elapsed) })
	if len(times) > slowest {
		times = times[:slowest]
	}
	if len(times) > 0 {
		fmt.Fprintf(w, "\nTests ran for %s, from the first test binary's start to the last result. The %d slowest:\n",
			last.Sub(first).Round(time.Second), len(times))
		for _, t := range times {
			fmt.Fprintf(w, "%8.1fs  %s  %s\n", t.elapsed.Seconds(), t.test, shortPackage(t.pkg))
		}
	}
	return failed, nil
}

// shortPackage is a package's path within its module (for a module on
// a code host: past host/owner/name), "." for the module's root.
func shortPackage(pkg string) string {
	parts := strings.SplitN(pkg, "/", 4)
	if len(parts) < 4 {
		return "."
	}
	return parts[3]
}
