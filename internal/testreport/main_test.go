package main

import (
	"strings"
	"testing"
)

// TestReport: a passing test's output is dropped and a failing one's
// kept, package results pass through, the slowest tests come last, slowest
// first, and a failure anywhere makes the report fail.
func TestReport(t *testing.T) {
	in := strings.Join([]string{
		`{"Time":"2026-12-05T07:00:00Z","Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestFast"}`,
		`{"Action":"output","Package":"p","Test":"TestFast","Output":"fast log\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestFast","Elapsed":0.5}`,
		`{"Action":"output","Package":"example.com/o/m/p","Test":"TestSlow","Output":"slow log\n"}`,
		`{"Action":"pass","Package":"example.com/o/m/p","Test":"TestSlow","Elapsed":7}`,
		`{"Action":"output","Package":"p","Test":"TestSlow/sub","Output":"sub log\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestSlow/sub","Elapsed":9}`,
		`{"Action":"output","Package":"p","Output":"PASS\n"}`,
		`{"Action":"output","Package":"p","Output":"ok  \tp\t7.5s\n"}`,
		`{"Time":"2026-12-05T07:04:10Z","Action":"pass","Package":"p","Elapsed":7.5}`,
		`not json: a server's line`,
	}, "\n")
	var out strings.Builder
	failed, err := report(strings.NewReader(in), &out, 1)
	if err != nil || failed {
		t.Fatalf("report = %v, %v; want a pass", failed, err)
	}
	got := out.String()
	for _, want := range []string{"ok  \tp\t7.5s\n", "not json: a server's line\n", "Tests ran for 4m10s, from the first test binary's start to the last result. The 1 slowest:\n     7.0s  TestSlow  p\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"fast log", "slow log", "PASS", "TestFast  p"} {
		if strings.Contains(got, not) {
			t.Errorf("report has %q:\n%s", not, got)
		}
	}

	in = strings.Join([]string{
		`{"Action":"output","Package":"q","Test":"TestBad","Output":"--- FAIL: TestBad\n"}`,
		`{"Action":"fail","Package":"q","Test":"TestBad","Elapsed":1}`,
		`{"Action":"output","Package":"q","Test":"TestHung","Output":"panic: stuck\n"}`,
		`{"Action":"output","Package":"q","Output":"FAIL\tq\t1.0s\n"}`,
		`{"Action":"fail","Package":"q","Elapsed":1}`,
	}, "\n")
	out.Reset()
	if failed, err := report(strings.NewReader(in), &out, 10); err != nil || !failed {
		t.Fatalf("report of a failure = %v, %v; want failed", failed, err)
	}
	for _, want := range []string{"--- FAIL: TestBad\n", "FAIL\tq\t1.0s\n", "q TestHung did not finish:\npanic: stuck\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
