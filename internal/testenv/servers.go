package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scriptTimeout bounds one run of a server script: a cold Kafka start
// downloads its jars first.
const scriptTimeout = 5 * time.Minute

// Server is a private instance of a real server, started for one test by
// Private: stopping it disturbs no other test.
type Server struct {
	// Name is the server script's name: redis, clickhouse, kafka, prometheus.
	Name string
	// Dir is the state folder holding the server's config, data and logs.
	Dir string
	// Env holds the variables the script wrote, such as
	// EDGELIMIT_KAFKA_BROKERS; the same names as the shared servers'.
	Env map[string]string

	script string
}

// Private starts a private instance of server (the name of a script in
// deploy/local) in a temporary folder and stops it when the test ends. A
// private Redis is the standalone server only. Without EDGELIMIT_TESTENV_DIR
// (set by deploy/local/testenv.sh) the test skips, or fails where servers
// are required.
func Private(tb testing.TB, server string) *Server {
	tb.Helper()
	dir := Lookup(tb, "EDGELIMIT_TESTENV_DIR", "private "+server)
	s := &Server{
		Name:   server,
		Dir:    tb.TempDir(),
		script: filepath.Join(dir, server+".sh"),
	}
	if _, err := os.Stat(s.script); err != nil {
		tb.Fatalf("private %s: %v", server, err)
	}
	// Registered after TempDir's own cleanup, so it runs before the
	// folder is removed.
	tb.Cleanup(func() {
		if err := s.run("stop"); err != nil {
			tb.Errorf("private %s: %v", server, err)
		}
	})
	if err := s.run("start"); err != nil {
		tb.Fatalf("private %s: %v", server, err)
	}
	env, err := ReadEnv(filepath.Join(s.Dir, server+".env"))
	if err != nil {
		tb.Fatalf("private %s: %v", server, err)
	}
	s.Env = env
	return s
}

// Get returns the value of the variable name that the server's script
// wrote, and fails the test if there is none.
func (s *Server) Get(tb testing.TB, name string) string {
	tb.Helper()
	v, ok := s.Env[name]
	if !ok {
		tb.Fatalf("private %s: %s.env has no %s", s.Name, s.Name, name)
	}
	return v
}

// Brokers returns a private Kafka's broker addresses, the list its script
// wrote as EDGELIMIT_KAFKA_BROKERS (KafkaBrokers reads the shared one).
func (s *Server) Brokers(tb testing.TB) []string {
	tb.Helper()
	return strings.Split(s.Get(tb, "EDGELIMIT_KAFKA_BROKERS"), ",")
}

// Halt stops the server's process but keeps its port and data, as a crash
// or a restart would leave them. A private Redis halts its standalone server
// and comes back empty.
func (s *Server) Halt(tb testing.TB) {
	tb.Helper()
	if err := s.run("halt"); err != nil {
		tb.Fatalf("private %s: %v", s.Name, err)
	}
}

// Resume starts a halted server again on the same port with the same data,
// and returns once it serves.
func (s *Server) Resume(tb testing.TB) {
	tb.Helper()
	if err := s.run("resume"); err != nil {
		tb.Fatalf("private %s: %v", s.Name, err)
	}
}

// run runs the server's script with verb. EDGELIMIT_OWNER_PID makes the
// servers stop themselves should this test binary die before its cleanups
// run (a -timeout panic, a kill).
func (s *Server) run(verb string) error {
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.script, verb, s.Dir)
	cmd.Env = append(os.Environ(),
		"EDGELIMIT_OWNER_PID="+strconv.Itoa(os.Getpid()),
		"EDGELIMIT_PRIVATE=1",
	)
	// The scripts leave their servers' output in files, so the output
	// pipe closes when the script itself exits.
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(s.script), verb, err, bytes.TrimSpace(out))
	}
	return nil
}

// ReadEnv parses the "export NAME=value" lines of an env file, as the server
// scripts and deploy/local/run.sh write them.
func ReadEnv(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read env file: %w", err)
	}
	env := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			return nil, fmt.Errorf("read env file %s: bad line %q", path, line)
		}
		env[name] = value
	}
	return env, nil
}
