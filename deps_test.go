package edgelimit_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestImportGraph pins the one-way data flow (gateway → Kafka →
// consumer → ClickHouse → analytics → Redis → gateway) as a statement of
// policy: packages import only what the table allows, and only cmd/*
// imports everything.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/edgelimit/edgelimit/"
	allowed := map[string][]string{
		"limiter": {},
		// The decision event's wire contract: the gateway writes it, the
		// consumer and analytics read it.
		"internal/event":  {},
		"gateway/publish": {"internal/event"},
		// What a configuration says about limits, for the gateway and
		// for the what-if and usage statements alike.
		"gateway/plans": {"limiter"},
		// How the frameworks behind the gateway read a request's fields,
		// in its query and its body.
		"gateway/bodyscan": {},
		"gateway":          {"limiter", "internal/event", "gateway/publish", "gateway/plans", "gateway/bodyscan"},
		// The Envoy rate limit door: a thin gRPC adapter on the gateway's
		// exported enforcement step (gateway.Enforce).
		"gateway/envoyrls": {"gateway", "limiter"},
		"consumer":         {"internal/event"},
		"analytics":        {"limiter"},
		// Synthetic traffic for analytics' tests is made of decision
		// events, written as the consumer writes them.
		"analytics/analyticstest": {"limiter", "internal/event"},
	}
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkg := strings.TrimPrefix(p.ImportPath, mod)
		if _, contract := allowed[pkg]; !contract && (strings.HasPrefix(pkg, "cmd/") || strings.HasPrefix(pkg, "internal/")) || pkg == p.ImportPath {
			continue
		}
		may, ok := allowed[topLevel(pkg, allowed)]
		if !ok {
			t.Errorf("package %s is not in the import policy; add it to TestImportGraph", pkg)
			continue
		}
		seen++
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			if topLevel(dep, allowed) == topLevel(pkg, allowed) {
				continue // a package's own subpackages
			}
			if !slices.Contains(may, topLevel(dep, allowed)) {
				t.Errorf("%s imports %s; the policy allows only %v", pkg, dep, may)
			}
		}
	}
	if seen < 3 {
		t.Errorf("checked only %d packages; go list found too few", seen)
	}
}

// topLevel maps a package to its policy entry: the longest listed prefix.
func topLevel(pkg string, allowed map[string][]string) string {
	best := ""
	for p := range allowed {
		if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > len(best) {
			best = p
		}
	}
	if best == "" {
		return pkg
	}
	return best
}

// TestThirdPartyImports pins which outside modules each product package
// may use (tests aside): limiter stays a small library on go-redis, the
// event contract depends on protobuf's wire format at most, and only the
// packages that own a server's protocol import its client.
func TestThirdPartyImports(t *testing.T) {
	const mod = "github.com/edgelimit/edgelimit/"
	allowed := map[string][]string{
		"limiter":         {"github.com/redis/go-redis/v9"},
		"internal/event":  {"google.golang.org/protobuf/encoding/protowire"},
		"gateway/plans":   {},
		"gateway/publish": {"github.com/twmb/franz-go/", "github.com/prometheus/client_golang/"},
		// brotli and zstd: the body scanner decodes the request bodies it
		// reads for _method and API keys as upstreams inflate them.
		"gateway/bodyscan": {"github.com/andybalholm/brotli", "github.com/klauspost/compress/zstd"},
		"gateway":          {"github.com/labstack/echo/v4", "github.com/prometheus/client_golang/"},
		// gRPC and Envoy's API types live in their own subpackage, so the
		// HTTP gateway (and everything that imports it) does not carry them.
		"gateway/envoyrls": {"google.golang.org/grpc", "github.com/envoyproxy/go-control-plane/envoy", "google.golang.org/protobuf/", "github.com/prometheus/client_golang/", "go.yaml.in/yaml/v3"},
		"consumer":         {"github.com/twmb/franz-go/", "github.com/ClickHouse/clickhouse-go/v2", "github.com/prometheus/client_golang/"},
		"analytics":        {"github.com/ClickHouse/clickhouse-go/v2", "github.com/prometheus/client_golang/", "github.com/redis/go-redis/v9"},
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		may, ok := allowed[pkg]
		if !ok {
			continue // cmd/*, internal/* and test helpers may import anything
		}
		for _, imp := range f[1:] {
			first, _, _ := strings.Cut(imp, "/")
			if !strings.Contains(first, ".") || strings.HasPrefix(imp, mod) {
				continue // the standard library, or this module
			}
			ok := false
			for _, prefix := range may {
				ok = ok || imp == prefix || strings.HasPrefix(imp, strings.TrimSuffix(prefix, "/")+"/")
			}
			if !ok {
				t.Errorf("%s imports %s; the policy allows only %v", pkg, imp, may)
			}
		}
	}
}

// TestReadersLinkNoGateway: the consumer and analytics read the gateway's
// contracts (the event, the plans), never its HTTP server.
func TestReadersLinkNoGateway(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./cmd/analytics", "./cmd/consumer").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "labstack") || dep == "github.com/edgelimit/edgelimit/gateway" {
			t.Errorf("cmd/analytics or cmd/consumer links %s", dep)
		}
	}
}

// TestRoomsStaySmall: no source file of the gateway, the consumer or
// analytics grows past 600 lines; one that does holds more than one
// concern and is split by it.
func TestRoomsStaySmall(t *testing.T) {
	for _, dir := range []string{"gateway", "consumer", "analytics"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if n := bytes.Count(b, []byte("\n")); n > 600 {
				t.Errorf("%s has %d lines, over 600", path, n)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
