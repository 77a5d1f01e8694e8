package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/envdoc"
)

// TestEnvDocumented: docs/configuration.md's environment table lists
// exactly the variables the gateway reads.
func TestEnvDocumented(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	writeConfig(t, path, 1, "http://127.0.0.1:1", true) // one upstream, "app"
	rec := envdoc.NewRecorder(env(nil))
	if _, err := loadConfig(path, rec.Getenv); err != nil {
		t.Fatal(err)
	}
	names, secrets := rec.Names()
	for i, n := range names {
		if n == "EDGELIMIT_UPSTREAM_"+envName("app") {
			names[i] = "EDGELIMIT_UPSTREAM_<NAME>"
		}
	}
	if !strings.Contains(fmt.Sprint(names), "EDGELIMIT_UPSTREAM_<NAME>") {
		t.Fatalf("the gateway did not read EDGELIMIT_UPSTREAM_APP for upstream app: %v", names)
	}
	envdoc.CheckEnv(t, "gateway", names, secrets)
}
