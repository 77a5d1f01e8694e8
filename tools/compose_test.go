// Package tools holds checks of the repository that need libraries the
// product does not: compose-go pulls in docker/*, logrus and more, so it
// lives in this module of its own, not in edgelimit's go.mod. `make test`
// runs it.
package tools_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"go.yaml.in/yaml/v3"
)

// TestComposeFile validates docker-compose.yml against the Compose
// specification (no Docker engine runs here) and checks what users rely
// on: every service, a healthcheck each so `up --wait` works, ports on
// loopback only, and config files that exist in the repository.
func TestComposeFile(t *testing.T) {
	t.Chdir("..") // the repository's root, where docker-compose.yml and deploy/ are
	// The secrets have no default in the file; a user sets them in .env.
	t.Setenv("EDGELIMIT_KEY_HASH_SECRET", "compose-test-secret")
	t.Setenv("EDGELIMIT_ANALYTICS_TOKEN", "compose-test-token-0123")
	opts, err := cli.NewProjectOptions([]string{"docker-compose.yml"}, cli.WithWorkingDirectory("."), cli.WithName("edgelimit"), cli.WithOsEnv)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml is not valid Compose: %v", err)
	}
	want := []string{"redis", "kafka", "clickhouse", "gateway", "consumer", "analytics", "prometheus", "alertmanager"}
	for _, name := range want {
		s, ok := p.Services[name]
		if !ok {
			t.Errorf("service %q missing", name)
			continue
		}
		if s.HealthCheck == nil || len(s.HealthCheck.Test) == 0 {
			t.Errorf("service %q has no healthcheck; docker compose up --wait needs one", name)
		}
	}
	for name, s := range p.Services {
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("service %q publishes %s on %q, want 127.0.0.1", name, port.Published, port.HostIP)
			}
		}
		// Config files named on the command line come from deploy/, which
		// the image copies to /etc/edgelimit.
		for _, arg := range s.Command {
			if rel, ok := strings.CutPrefix(arg, "/etc/edgelimit/"); ok {
				if _, err := os.Stat(filepath.Join("deploy", rel)); err != nil {
					t.Errorf("service %q uses %s, but deploy/%s does not exist", name, arg, rel)
				}
			}
		}
		for _, v := range s.Volumes {
			if v.Type == "bind" && strings.HasSuffix(v.Source, "deploy/prometheus") {
				checkScrapeTargets(t, p.ServiceNames())
			}
			if v.Type == "bind" {
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("service %q mounts %s, which does not exist", name, v.Source)
				}
			}
		}
	}
}

// checkScrapeTargets: the Prometheus config the compose file mounts scrapes
// services that exist in it, so the alerts have data.
func checkScrapeTargets(t *testing.T, services []string) {
	t.Helper()
	b, err := os.ReadFile("deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				n++
				host, _, _ := strings.Cut(target, ":")
				if !slices.Contains(services, host) {
					t.Errorf("prometheus.yml scrapes %s, but docker-compose.yml has no service %q", target, host)
				}
			}
		}
	}
	if n == 0 {
		t.Error("prometheus.yml scrapes nothing")
	}
}
