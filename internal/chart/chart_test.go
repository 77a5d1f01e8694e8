package chart_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/edgelimit/edgelimit/internal/chart"
)

// TestChartLints: helm lint passes for every value set.
func TestChartLints(t *testing.T) {
	for name, values := range chart.ValueSets() {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chart.Dir()}
			if values != "" {
				args = append(args, "-f", values)
			}
			out := chart.Run(t, args...)
			if !strings.Contains(string(out), "0 chart(s) failed") {
				t.Errorf("helm lint:\n%s", out)
			}
		})
	}
}

// TestChartRenders: every value set renders objects that decode strictly
// into their API types, with the promises the chart makes: probes on the
// admin listener, a pre-stop drain, no Secret of its own, the door as a
// Service port, expected_gateways in step with the replicas, one
// analytics writer.
func TestChartRenders(t *testing.T) {
	for name, values := range chart.ValueSets() {
		t.Run(name, func(t *testing.T) {
			objs := chart.Render(t, values)
			for _, o := range objs {
				if o.Kind == "Secret" {
					t.Errorf("the chart renders a Secret (%s): secrets are the user's, never the chart's", o.Name)
				}
			}
			dep := chart.Find(t, objs, "Deployment", "edge-edgelimit-gateway").Value.(*appsv1.Deployment)
			c := dep.Spec.Template.Spec.Containers[0]
			for probe, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "admin" {
					t.Errorf("gateway %s probe %+v, want an HTTP GET on the admin port", probe, p)
				}
			}
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
				t.Error("gateway: no pre-stop drain")
			}
			cm := chart.Find(t, objs, "ConfigMap", "edge-edgelimit-gateway").Value.(*corev1.ConfigMap)
			var gw struct {
				ExpectedGateways int `json:"expected_gateways"`
				GRPC             struct {
					Listen string `json:"listen"`
				} `json:"grpc"`
			}
			if err := yaml.Unmarshal([]byte(cm.Data["gateway.yaml"]), &gw); err != nil {
				t.Fatal(err)
			}
			replicas := 0
			if dep.Spec.Replicas != nil {
				replicas = int(*dep.Spec.Replicas)
			}
			for _, o := range objs {
				if h, ok := o.Value.(*autoscalingv2.HorizontalPodAutoscaler); ok {
					replicas = int(h.Spec.MaxReplicas)
				}
			}
			if gw.ExpectedGateways != replicas || replicas == 0 {
				t.Errorf("expected_gateways %d, want the most gateways that run, %d", gw.ExpectedGateways, replicas)
			}
			svc := chart.Find(t, objs, "Service", "edge-edgelimit-gateway").Value.(*corev1.Service)
			door := slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "grpc" })
			if door != (gw.GRPC.Listen != "") {
				t.Errorf("door: Service port %v, grpc.listen %q; want both or neither", door, gw.GRPC.Listen)
			}
			for _, o := range objs {
				if d, ok := o.Value.(*appsv1.Deployment); ok && strings.HasSuffix(d.Name, "-analytics") {
					if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
						t.Errorf("analytics: %d replicas, strategy %s; want one writer, replaced by Recreate", *d.Spec.Replicas, d.Spec.Strategy.Type)
					}
				}
			}
		})
	}
}

// TestChartAlertsAreTheRepositorys: the PrometheusRule holds exactly
// deploy/prometheus/alerts.yml (the chart's copy cannot drift).
func TestChartAlertsAreTheRepositorys(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(chart.Dir(), "..", "..", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	copyOf, err := os.ReadFile(filepath.Join(chart.Dir(), "files", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(copyOf) != string(want) {
		t.Errorf("deploy/helm/edgelimit/files/alerts.yml differs from deploy/prometheus/alerts.yml: copy it over")
	}
	var file chart.RuleGroupList
	if err := yaml.UnmarshalStrict(want, &file); err != nil {
		t.Fatal(err)
	}
	objs := chart.Render(t, "")
	rule := chart.Find(t, objs, "PrometheusRule", "edge-edgelimit").Value.(*chart.PrometheusRule)
	if diff := cmp.Diff(file, rule.Spec); diff != "" {
		t.Errorf("PrometheusRule spec differs from alerts.yml (-file +chart):\n%s", diff)
	}
	if len(file.Groups) == 0 || len(file.Groups[0].Rules) == 0 {
		t.Error("alerts.yml has no rules")
	}
	// Without prometheus-operator's CRD, no PrometheusRule.
	out := chart.Run(t, "template", "edge", chart.Dir())
	if strings.Contains(string(out), "kind: PrometheusRule") {
		t.Error("a PrometheusRule rendered for a cluster without its CRD")
	}
}

// TestChartRefusesBadValues: values that cannot work, or that name no
// setting (values.schema.json), fail the render with what to fix.
func TestChartRefusesBadValues(t *testing.T) {
	helm := chart.Helm(t)
	for _, tt := range []struct {
		name string
		set  []string
		want string
	}{
		{"consumers past the partitions", []string{"consumer.replicas=7", "kafka.partitions=6"}, "consumer.replicas 7 is more than kafka.partitions 6"},
		{"sentinel without sentinels", []string{"redis.mode=sentinel", "redis.sentinelMaster=m"}, "redis.sentinelAddrs is required"},
		{"unknown redis mode", []string{"redis.mode=ring"}, "at '/redis/mode': value must be one of"},
		{"misspelt value", []string{"gateway.replica=3"}, "additional properties 'replica' not allowed"},
		{"secret without its key", []string{"redis.password.secret=s", "redis.password.key="}, "/redis/password/key"},
		{"no key hash secret", []string{"keyHashSecret.name="}, "keyHashSecret.name is required"},
		{"door without domains", []string{"gateway.door.enabled=true"}, "gateway.door.domains"},
		{"autoscaler upside down", []string{"gateway.hpa.enabled=true", "gateway.hpa.minReplicas=5", "gateway.hpa.maxReplicas=2"}, "minReplicas is above maxReplicas"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"template", "edge", chart.Dir()}
			for _, s := range tt.set {
				args = append(args, "--set", s)
			}
			out, err := runHelm(helm, args...)
			if err == nil || !strings.Contains(out, tt.want) {
				t.Errorf("helm template --set %v: %v\n%s\nwant an error saying %q", tt.set, err, out, tt.want)
			}
		})
	}
}

// runHelm runs helm and returns its output, standard error included.
func runHelm(helm string, args ...string) (string, error) {
	cmd := exec.Command(helm, args...)
	home, err := os.MkdirTemp("", "helm-home-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestChartVersionIsSemver: helm needs it; a packaging step would too.
func TestChartVersionIsSemver(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chart.Dir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		APIVersion string `json:"apiVersion"`
		Version    string `json:"version"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(c.Version, ".")
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err != nil || len(parts) != 3 {
			t.Fatalf("Chart.yaml version %q, want MAJOR.MINOR.PATCH", c.Version)
		}
	}
	if c.APIVersion != "v2" {
		t.Errorf("Chart.yaml apiVersion %q, want v2 (Helm 3 and 4)", c.APIVersion)
	}
}

// TestChartHelm3: Helm 3 lints the chart and renders, for every value set,
// the very objects Helm 4 does.
func TestChartHelm3(t *testing.T) {
	helm3 := chart.HelmOf(t, chart.Helm3)
	for name, values := range chart.ValueSets() {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chart.Dir()}
			if values != "" {
				args = append(args, "-f", values)
			}
			if out := chart.RunWith(t, helm3, args...); !strings.Contains(string(out), "0 chart(s) failed") {
				t.Errorf("helm 3 lint:\n%s", out)
			}
			v3, v4 := chart.RenderWith(t, helm3, values), chart.Render(t, values)
			type named struct {
				Kind, Name string
				Value      any
			}
			flat := func(objs []chart.Object) []named {
				var out []named
				for _, o := range objs {
					out = append(out, named{o.Kind, o.Name, o.Value})
				}
				return out
			}
			if diff := cmp.Diff(flat(v4), flat(v3)); diff != "" {
				t.Errorf("Helm 3 renders other objects than Helm 4 (-4 +3):\n%s", diff)
			}
		})
	}
}
