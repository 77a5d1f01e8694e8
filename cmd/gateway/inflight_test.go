package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// childEnv marks this test binary, run again, as a gateway process.
const childEnv = "EDGELIMIT_TEST_GATEWAY_PROCESS"

// TestMain runs the gateway itself when asked (a child process that a
// test can kill), the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		err := run(context.Background(), os.Args[1:], os.Getenv, os.Stderr)
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

const inFlightTmpl = `
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
plans:
  free:
    rules:
      - {name: minute, limit: 1000000, period: 1m}
      - {name: concurrent, in_flight: 3, lease: %s}
anonymous_plan: free
store_deadline: 1s
redis: {prefix: %s}
upstreams:
  app: {url: %s}
routes:
  - {name: all, path_prefix: /, upstream: app}
kafka:
  disabled: true
`

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestInFlightSlotsOfAKilledGateway: a gateway process holding every slot
// of an in-flight rule on answers that last longer than the lease keeps
// them (it renews the leases) until it is killed (SIGKILL: no release);
// another gateway then gets the slots back once the leases lapse, within
// the lease time of the kill.
func TestInFlightSlotsOfAKilledGateway(t *testing.T) {
	const lease = 2 * time.Second
	release := make(chan struct{})
	var holding atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			return
		}
		holding.Add(1)
		defer holding.Add(-1)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	prefix := fmt.Sprintf("inflight%d", time.Now().UnixNano())
	if err := os.WriteFile(path, fmt.Appendf(nil, inFlightTmpl, lease, prefix, up.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	redisAddr := testenv.RedisAddr(t)

	// The gateway to kill, a process of its own.
	listen, admin := freeAddr(t), freeAddr(t)
	child := exec.Command(os.Args[0], "-config", path)
	// Only these: the test stack's environment names other servers.
	child.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), childEnv + "=1",
		"EDGELIMIT_REDIS_ADDR=" + redisAddr, "EDGELIMIT_LISTEN=" + listen, "EDGELIMIT_ADMIN_LISTEN=" + admin}
	logs := &logBuffer{}
	child.Stdout, child.Stderr = logs, logs
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	var other *running
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the child gateway's log:\n%s", logs)
			t.Logf("the other gateway's log:\n%s", other.logs)
		}
	})
	testenv.WaitFor(t, 60*time.Second, "the child gateway to be ready", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	other = start(t, []string{"-config", path}, env(map[string]string{"EDGELIMIT_REDIS_ADDR": redisAddr}))

	// Three slow answers through the child: every slot.
	for range 3 {
		go func() {
			resp, err := http.Get("http://" + listen + "/slow")
			if err == nil {
				if resp.StatusCode != http.StatusOK {
					t.Errorf("a slow request through the child: %d", resp.StatusCode)
				}
				_, _ = io.Copy(io.Discard, resp.Body) // until the kill
				resp.Body.Close()
			}
		}()
	}
	testenv.WaitFor(t, 30*time.Second, "three answers in flight", func() bool { return holding.Load() == 3 })
	status := func() int {
		st, _, _ := httpGet(t, other.addr+"/fast")
		return st
	}
	// Held past 2.5 leases: renewed, never reclaimed.
	for held := time.Now(); time.Since(held) < 5*lease/2; time.Sleep(lease / 4) {
		if st := status(); st != http.StatusTooManyRequests {
			t.Fatalf("while every slot is held (renewed): another gateway's request got %d, want 429\n%s", st, logs.String())
		}
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	killed := time.Now()
	testenv.WaitFor(t, lease+30*time.Second, "the killed gateway's slots to come back", func() bool {
		return status() == http.StatusOK
	})
	back := time.Since(killed)
	t.Logf("slots back %v after the kill (lease %v)", back.Round(time.Millisecond), lease)
	if back > lease+5*time.Second {
		t.Errorf("slots back %v after the kill, want within the lease (%v) and a few seconds", back, lease)
	}
}
