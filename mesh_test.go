package edgelimit_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/edgelimit/edgelimit/gateway/envoyrls"
	"github.com/edgelimit/edgelimit/internal/chart"
)

// TestMeshExamples checks docs/envoy.md's Kubernetes examples offline:
// the chart renders with the page's values (the door on), the door's
// descriptor config loads in the door's own parser, and the Istio and
// Envoy Gateway objects parse, ask for the domain that config defines,
// and point at the Service and port the chart renders for the door.
func TestMeshExamples(t *testing.T) {
	page, err := os.ReadFile("docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(page), "## On Kubernetes: Istio and Envoy Gateway")
	if !ok {
		t.Fatal(`docs/envoy.md has no "On Kubernetes: Istio and Envoy Gateway" section`)
	}
	var values []byte
	var objects [][]byte
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1) {
		if strings.HasPrefix(m[1], "# values-door.yaml") {
			values = []byte(m[1])
			continue
		}
		for _, doc := range bytes.Split([]byte(m[1]), []byte("\n---\n")) {
			objects = append(objects, doc)
		}
	}
	if values == nil || len(objects) != 3 {
		t.Fatalf("found values %v and %d mesh objects, want the chart's values and 3 objects (2 Istio, 1 Envoy Gateway)", values != nil, len(objects))
	}
	valuesFile := filepath.Join(t.TempDir(), "values-door.yaml")
	if err := os.WriteFile(valuesFile, values, 0o600); err != nil {
		t.Fatal(err)
	}
	objs := chart.Render(t, valuesFile)

	var v struct {
		Gateway struct {
			Door struct {
				Port    int               `json:"port"`
				Domains map[string]string `json:"domains"`
			} `json:"door"`
		} `json:"gateway"`
	}
	if err := yaml.Unmarshal(values, &v); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for name, text := range v.Gateway.Door.Domains {
		files[name] = []byte(text)
	}
	if _, err := envoyrls.Parse(files); err != nil {
		t.Fatalf("the page's descriptor config does not load in the door: %v", err)
	}
	var domain struct {
		Domain string `json:"domain"`
	}
	for _, text := range v.Gateway.Door.Domains {
		if err := yaml.Unmarshal([]byte(text), &domain); err != nil {
			t.Fatal(err)
		}
	}
	svc := chart.Find(t, objs, "Service", "edge-edgelimit-gateway").Value.(*corev1.Service)
	host := svc.Name + "." + "edge.svc.cluster.local"
	door := false
	for _, p := range svc.Spec.Ports {
		door = door || p.Name == "grpc" && int(p.Port) == v.Gateway.Door.Port
	}
	if !door {
		t.Fatalf("the chart's Service %s has no grpc port %d: %+v", svc.Name, v.Gateway.Door.Port, svc.Spec.Ports)
	}

	kinds := map[string]int{}
	for _, doc := range objects {
		var o struct {
			APIVersion string         `json:"apiVersion"`
			Kind       string         `json:"kind"`
			Metadata   map[string]any `json:"metadata"`
			Spec       map[string]any `json:"spec"`
		}
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			t.Fatalf("an example does not parse: %v\n%s", err, doc)
		}
		kinds[o.APIVersion+" "+o.Kind]++
		text := string(doc)
		if strings.Contains(text, "envoy.filters.http.ratelimit") {
			if !strings.Contains(text, "domain: "+domain.Domain+"\n") {
				t.Errorf("%s: its rate limit filter does not ask for domain %q, the one the door's config defines", o.Kind, domain.Domain)
			}
			port := strconv.Itoa(v.Gateway.Door.Port)
			if !strings.Contains(text, host) || !strings.Contains(text, "|"+port+"|") && !strings.Contains(text, "port_value: "+port+"}") {
				t.Errorf("%s: does not point at the door, %s port %d", o.Kind, host, v.Gateway.Door.Port)
			}
		}
		if !strings.Contains(text, "actions:") && !strings.Contains(text, "envoy.filters.http.ratelimit") {
			t.Errorf("%s: neither adds the filter nor says which descriptors a request sends", o.Kind)
		}
	}
	want := map[string]int{"networking.istio.io/v1alpha3 EnvoyFilter": 2, "gateway.envoyproxy.io/v1alpha1 EnvoyPatchPolicy": 1}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("%d %s objects, want %d (all: %v)", kinds[k], k, n, kinds)
		}
	}
}
