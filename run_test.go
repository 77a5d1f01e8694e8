package edgelimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestMakeRunSmoke runs the `make run` path without a terminal: start the
// whole pipeline, send a request, read its headers, find its event in
// ClickHouse, stop, and check that no process is left behind.
func TestMakeRunSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	// make run installs what it needs; it must have what it needs here.
	testenv.ClickHouseAddr(t)
	state := t.TempDir()
	base := freePortBase(t)
	env := append(os.Environ(), "EDGELIMIT_RUN_DIR="+state, fmt.Sprintf("EDGELIMIT_PORT_BASE=%d", base))
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("deploy/local/run.sh", args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("run.sh %v: %v\n%s", args, err, out)
		}
		t.Logf("run.sh %v:\n%s", args, out)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd := exec.Command("deploy/local/run.sh", "stop")
			cmd.Env = env
			cmd.Run()
		}
	})
	run("start")
	vars, err := testenv.ReadEnv(filepath.Join(state, "run.env"))
	if err != nil {
		t.Fatal(err)
	}

	req, _ := http.NewRequest(http.MethodGet, vars["EDGELIMIT_GATEWAY_URL"]+"/api/smoke", nil)
	req.Header.Set("X-API-Key", "demo-key-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/smoke = %s, want 200", resp.Status)
	}
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("response lacks %s; headers: %v", h, resp.Header)
		}
	}

	conn := testenv.OpenClickHouse(t, vars["EDGELIMIT_CLICKHOUSE_ADDR"], "default")
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n uint64
		err := conn.QueryRow(context.Background(), "SELECT count() FROM decisions WHERE route = 'api' AND gateway_id = 'demo-gateway-1'").Scan(&n)
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision event in ClickHouse after 60s (count %d, err %v)", n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	run("stop")
	stopped = true
	pids, _ := filepath.Glob(filepath.Join(state, "pids", "*.pid"))
	if len(pids) != 0 {
		t.Errorf("pid files left after stop: %v", pids)
	}
	if left := processesMentioning(t, state); len(left) > 0 {
		t.Errorf("processes left after stop:\n%s", strings.Join(left, "\n"))
	}
}

// freePortBase finds a base whose ports run.sh uses are all free.
func freePortBase(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(20000)
		ok := true
		for _, off := range []int{80, 81, 82, 84, 85, 90, 91, 92, 93, 300} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range for run.sh")
	return 0
}

// processesMentioning lists live processes whose command line names dir,
// waiting a little for ones already exiting.
func processesMentioning(t *testing.T, dir string) []string {
	t.Helper()
	var left []string
	for range 50 {
		left = left[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || !strings.Contains(string(cmdline), dir) {
				continue
			}
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if f := strings.Fields(string(stat)); len(f) > 2 && (f[2] == "Z" || f[2] == "X") {
				continue // exited, waiting for init to reap it
			}
			left = append(left, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return left
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
