package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/envdoc"
)

// Seed is a randomized test's seed: the variable name's value when set,
// so that a failing run can be repeated, else a random one (log it).
func Seed(tb testing.TB, name string) uint64 {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return rand.Uint64()
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// Duration is how long a randomized test runs: the variable name's value
// when set (a time.ParseDuration string), else def.
func Duration(tb testing.TB, name string, def time.Duration) time.Duration {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, s, err)
	}
	return d
}

// FreeAddr returns a loopback host:port that was free a moment ago, for a
// process under test that is told where to listen.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// WantOK is a load generator's check of one HTTP call: it drains and
// closes the response's body, so the connection is reused, and returns an
// error unless the call got a 200.
func WantOK(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s", resp.Request.Method, resp.Request.URL.Path, resp.Status)
	}
	return nil
}

// ErrStillRunning is Run's stop when its function has not returned within
// a minute of its context ending: a process that does not stop is a bug.
var ErrStillRunning = errors.New("still running a minute after its context ended")

// Run runs f in a goroutine of its own, as a process under test runs its
// main loop, until stop is called or the test ends. stop cancels f's
// context and returns f's error, or ErrStillRunning; the test's end only
// reports ErrStillRunning, so a test that cares about f's error calls stop.
func Run(tb testing.TB, f func(ctx context.Context) error) (stop func() error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			return ErrStillRunning
		}
	})
	tb.Cleanup(func() {
		if err := stop(); errors.Is(err, ErrStillRunning) {
			tb.Error(err)
		}
	})
	return stop
}

// LogBuffer collects a process's log lines; it is safe for the process's
// logger and the test reading it at once.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (n int, err error) {
	l.mu.Lock()
	n, err = l.b.Write(p)
	l.mu.Unlock()
	return n, err
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Load is a test's steady load: each of n goroutines calls f every
// interval until stop is called or the test ends. stop returns once every
// call has; f's context ends at stop, so a call in flight gives up.
func Load(tb testing.TB, n int, every time.Duration, f func(context.Context)) (stop func()) {
	tb.Helper()
	if n < 1 || every <= 0 {
		tb.Fatalf("testenv.Load(%d goroutines, every %v): want at least one goroutine and a positive interval", n, every)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				f(ctx)
			}
		})
	}
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	tb.Cleanup(stop)
	return stop
}

// ConfigEnv returns the EDGELIMIT_* variables that a process's loadConfig
// asks getenv for when it has no config file, as envdoc.Recorder.Names
// gives them: what the process's test compares with the environment table
// of docs/configuration.md (envdoc.CheckEnv). loadConfig's error is not the
// point: without addresses the configuration is invalid, but the
// environment was read.
func ConfigEnv[C any](getenv func(string) string, loadConfig func(path string, getenv func(string) string) (C, error)) (names, secrets []string) {
	rec := envdoc.NewRecorder(getenv)
	_, _ = loadConfig("", rec.Getenv)
	return rec.Names()
}

// Serve accepts connections on a loopback port until the test ends and
// returns its address. Each connection goes to handle in a goroutine of its
// own; with a nil handle it is held open and never answered (a server that
// hangs). Every connection still open is closed when the test ends.
func Serve(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
		wg     sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed { // accepted as the test ended
				mu.Unlock()
				c.Close()
				return
			}
			conns = append(conns, c)
			if handle != nil {
				wg.Go(func() { handle(c) })
			}
			mu.Unlock()
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
