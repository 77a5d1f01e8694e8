// Package tools holds checks of the repository that need libraries the
// product does not: compose-go pulls in docker/*, logrus and more, so it
// lives in this module of its own, not in edgelimit's go.mod. `make test`
// runs it.
package tools_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
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
	t.Setenv("GRAFANA_ADMIN_PASSWORD", "compose-test-grafana")
	opts, err := cli.NewProjectOptions([]string{"docker-compose.yml"}, cli.WithWorkingDirectory("."), cli.WithName("edgelimit"), cli.WithOsEnv)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml is not valid Compose: %v", err)
	}
	want := []string{"redis", "kafka", "clickhouse", "gateway", "consumer", "analytics", "prometheus", "alertmanager", "grafana"}
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
	checkGrafana(t, p)
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
	var cfg struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "deploy/prometheus/prometheus.yml", &cfg)
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

// checkGrafana: the Grafana service gets its provisioning from
// deploy/grafana/provisioning and its dashboards from
// deploy/grafana/dashboards, its datasource is the compose file's
// Prometheus on the port Prometheus listens on, the dashboard provider
// reads where the dashboards are mounted, the dashboards use the
// provisioned datasource, and the home dashboard exists.
func checkGrafana(t *testing.T, p *types.Project) {
	t.Helper()
	g, ok := p.Services["grafana"]
	if !ok {
		return // reported with the other missing services
	}
	mounts := map[string]string{} // container path -> repository path
	for _, v := range g.Volumes {
		rel, err := filepath.Rel(p.WorkingDir, v.Source)
		if err != nil {
			t.Fatal(err)
		}
		mounts[v.Target] = rel
	}
	prov, dashDir := mounts["/etc/grafana/provisioning"], ""
	if prov != filepath.Join("deploy", "grafana", "provisioning") {
		t.Fatalf("grafana mounts %q on /etc/grafana/provisioning, want deploy/grafana/provisioning", prov)
	}

	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(prov, "datasources", "prometheus.yml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("grafana datasources = %+v, want one prometheus", ds.Datasources)
	}
	uid := ds.Datasources[0].UID
	u, err := url.Parse(ds.Datasources[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	prom, ok := p.Services[u.Hostname()]
	if !ok {
		t.Errorf("grafana's datasource %s names no service of docker-compose.yml", u)
	} else if listen := ":" + u.Port(); !slices.Contains(prom.Command, "--web.listen-address="+listen) {
		t.Errorf("grafana's datasource %s: %s does not listen on %s (command %v)", u, u.Hostname(), listen, prom.Command)
	}

	var dp struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(prov, "dashboards", "edgelimit.yml"), &dp)
	if len(dp.Providers) == 0 {
		t.Fatal("grafana dashboard provisioning has no provider")
	}
	for _, pr := range dp.Providers {
		if dashDir = mounts[pr.Options.Path]; pr.Type != "file" || dashDir == "" {
			t.Errorf("grafana dashboard provider reads %s, where nothing is mounted", pr.Options.Path)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dashDir, "*.json"))
	if len(files) == 0 {
		t.Errorf("no dashboards in %s", dashDir)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Templating struct {
				List []struct {
					Type    string `json:"type"`
					Current struct {
						Value any `json:"value"`
					} `json:"current"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		found := false
		for _, v := range d.Templating.List {
			found = found || v.Type == "datasource" && v.Current.Value == uid
		}
		if !found {
			t.Errorf("%s: no datasource variable defaulting to the provisioned uid %q", f, uid)
		}
	}
	if home := g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != nil {
		dir, file := filepath.Split(*home)
		if rel := mounts[filepath.Clean(dir)]; rel == "" || !fileExists(filepath.Join(rel, file)) {
			t.Errorf("grafana's home dashboard %s is not a mounted file", *home)
		}
	}
}

func readYAML(t *testing.T, path string, dst any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, dst); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
