package main

import (
	"testing"

	"github.com/edgelimit/edgelimit/internal/readme"
)

// TestEnvDocumented: README.md's environment table lists exactly the
// variables the analytics reads (serve and the analyst commands alike).
func TestEnvDocumented(t *testing.T) {
	rec := readme.NewRecorder(env(nil))
	_, _ = loadConfig("", rec.Getenv) // invalid without addresses; the environment was read
	names, secrets := rec.Names()
	readme.CheckEnv(t, "analytics", names, secrets)
}
