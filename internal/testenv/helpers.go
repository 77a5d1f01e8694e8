package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

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
