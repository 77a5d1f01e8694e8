// Package chart renders the Helm chart (deploy/helm/edgelimit) for tests:
// with the real helm CLI, built from the Go module proxy at a pinned
// version, and each rendered object decoded strictly into its Kubernetes
// API type, so a field the API does not know fails the test instead of
// being dropped by a cluster. The binaries' tests load the configuration
// the chart renders with their own parsers.
package chart

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// The helm CLIs the chart is checked with, built from the Go module
// proxy: Helm 4 renders every test; Helm 3 must lint it and render the
// same objects (the chart is apiVersion v2, which both read).
const (
	Helm4 = "helm.sh/helm/v4/cmd/helm@v4.3.2"
	Helm3 = "helm.sh/helm/v3/cmd/helm@v3.21.4"
)

// Dir is the chart's directory.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy", "helm", "edgelimit")
}

// ValueSets are the value files the chart is checked with, by name:
// "default" is the chart's own values.yaml alone.
func ValueSets() map[string]string {
	return map[string]string{
		"default":      "",
		"sentinel-tls": filepath.Join(Dir(), "ci", "sentinel-tls-values.yaml"),
		"cluster-door": filepath.Join(Dir(), "ci", "cluster-door-values.yaml"),
	}
}

// PrometheusOperatorAPIs are the API versions rendering assumes a cluster
// with prometheus-operator serves, so its objects render too.
var PrometheusOperatorAPIs = []string{"monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/ServiceMonitor"}

// builds are the helm binaries by module, each built once per test
// process (*build).
var builds sync.Map

type build struct {
	once sync.Once
	path string
	err  error
}

// Helm returns the path of Helm 4's binary (see HelmOf).
func Helm(t testing.TB) string { return HelmOf(t, Helm4) }

// HelmOf returns the path of module's helm binary, built once per machine
// into the user cache (go install; the first build takes a minute or two,
// later runs reuse it). It fails the test if it cannot.
func HelmOf(t testing.TB, module string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(module, &build{})
	b := v.(*build)
	b.once.Do(func() { b.path, b.err = install(module) })
	if b.err != nil {
		t.Fatalf("the helm CLI: %v", b.err)
	}
	return b.path
}

func install(module string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	version := module[strings.LastIndexByte(module, '@')+1:]
	dir := filepath.Join(cache, "edgelimit", "helm-"+version)
	path := filepath.Join(dir, "helm")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	// Built aside and renamed into place: packages tested at once may
	// build it at once.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", module)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %v\n%s", module, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return path, os.Rename(filepath.Join(tmp, "helm"), path)
}

// Run runs Helm 4 with args and returns its standard output; a failure
// fails the test with its standard error.
func Run(t testing.TB, args ...string) []byte {
	t.Helper()
	return RunWith(t, Helm(t), args...)
}

// RunWith is Run with the helm binary at helm.
func RunWith(t testing.TB, helm string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helm, args...)
	// Helm's own state (repositories, cache) stays in the test's dirs.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// Object is one rendered object: its kind and name, its YAML, and, for
// the kinds the chart renders from the core APIs, the decoded value.
type Object struct {
	Kind, Name string
	YAML       []byte
	Value      any
}

// Render renders the chart with Helm 4, the value file (empty: its
// defaults) and extra helm arguments, and decodes every object strictly.
func Render(t testing.TB, values string, extra ...string) []Object {
	t.Helper()
	return RenderWith(t, Helm(t), values, extra...)
}

// RenderWith is Render with the helm binary at helm.
func RenderWith(t testing.TB, helm, values string, extra ...string) []Object {
	t.Helper()
	// Helm 3's template assumes Kubernetes 1.20 unless told; the chart
	// needs 1.30 (its pre-stop sleep).
	args := []string{"template", "edge", Dir(), "--namespace", "edge", "--kube-version", "v1.30.0"}
	if values != "" {
		args = append(args, "-f", values)
	}
	for _, api := range PrometheusOperatorAPIs {
		args = append(args, "--api-versions", api)
	}
	out := RunWith(t, helm, append(args, extra...)...)
	var objs []Object
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		doc = bytes.TrimSpace(doc)
		if len(bytes.Trim(doc, "- \n")) == 0 {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("rendered object is not YAML: %v\n%s", err, doc)
		}
		o := Object{Kind: meta.Kind, Name: meta.Metadata.Name, YAML: doc}
		v, err := decodeStrict(meta.APIVersion, meta.Kind, doc)
		if err != nil {
			t.Fatalf("%s %s: %v", meta.Kind, o.Name, err)
		}
		o.Value = v
		objs = append(objs, o)
	}
	return objs
}

// decodeStrict decodes doc into the API type of its kind, refusing any
// field the type does not have.
func decodeStrict(apiVersion, kind string, doc []byte) (any, error) {
	var v any
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		v = &corev1.ConfigMap{}
	case "v1/Service":
		v = &corev1.Service{}
	case "apps/v1/Deployment":
		v = &appsv1.Deployment{}
	case "policy/v1/PodDisruptionBudget":
		v = &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		v = &autoscalingv2.HorizontalPodAutoscaler{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		v = &PrometheusRule{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		v = &ServiceMonitor{}
	default:
		return nil, fmt.Errorf("apiVersion %s kind %s: no type to check it against", apiVersion, kind)
	}
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("strict decode as %s: %w", kind, err)
	}
	return v, nil
}

// PrometheusRule is prometheus-operator's object, as far as the chart
// writes it (the operator's Go types would bring its whole module).
type PrometheusRule struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Metadata   objectMeta    `json:"metadata"`
	Spec       RuleGroupList `json:"spec"`
}

// RuleGroupList is a Prometheus rules file: its groups.
type RuleGroupList struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of rules.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert         string            `json:"alert,omitempty"`
	Record        string            `json:"record,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// ServiceMonitor is prometheus-operator's object, as far as the chart
// writes it.
type ServiceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type objectMeta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

// Find returns the object of kind and name, failing the test without it.
func Find(t testing.TB, objs []Object, kind, name string) Object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return Object{}
}

// Getenv is the environment a component's container gets, as its own
// lookup: literal values as they are, a value from a Secret as
// "secret:NAME/KEY" (the binaries read it like any value).
func Getenv(c corev1.Container) func(string) string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "field-" + strings.ReplaceAll(e.ValueFrom.FieldRef.FieldPath, ".", "-")
		default:
			env[e.Name] = e.Value
		}
	}
	return func(k string) string { return env[k] }
}

// Mount lays out a component's volumes as its container would see them,
// under a temporary root: each ConfigMap's files as rendered, each
// Secret's as a CA certificate (ca.crt; the chart mounts Secrets for TLS
// CAs only). It returns the path of file (a path the container reads,
// e.g. /etc/edgelimit/gateway/gateway.yaml) under the root, with every
// /etc/edgelimit/ path in it moved under the root too.
func Mount(t testing.TB, objs []Object, dep *appsv1.Deployment, file string) string {
	t.Helper()
	root := t.TempDir()
	const etc = "/etc/edgelimit/"
	move := func(text string) string { return strings.ReplaceAll(text, etc, filepath.Join(root, etc)+"/") }
	c := dep.Spec.Template.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(dep.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("%s: volume mount %s has no volume", dep.Name, m.Name)
		}
		v := dep.Spec.Template.Spec.Volumes[i]
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case v.ConfigMap != nil:
			cm := Find(t, objs, "ConfigMap", v.ConfigMap.Name).Value.(*corev1.ConfigMap)
			for name, text := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(move(text)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		case v.Secret != nil:
			if err := os.WriteFile(filepath.Join(dir, "ca.crt"), testCA(t), 0o600); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: volume %s is neither a ConfigMap nor a Secret", dep.Name, v.Name)
		}
	}
	path := filepath.Join(root, file)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s: %s is not mounted: %v", dep.Name, file, err)
	}
	return path
}

// testCA is a self-signed CA certificate in PEM, as a TLS CA Secret holds.
func testCA(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "chart test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// Component finds a component's Deployment ("gateway", "consumer",
// "analytics"); nil when the value set runs none.
func Component(objs []Object, component string) *appsv1.Deployment {
	for _, o := range objs {
		if d, ok := o.Value.(*appsv1.Deployment); ok && d.Spec.Template.Labels["app.kubernetes.io/component"] == component {
			return d
		}
	}
	return nil
}

// CheckConfig renders every value set and loads component's file (the
// path its container reads) with load, its binary's own parser, mounted
// as its Deployment mounts it and with the environment the Deployment
// gives; a value set that runs no such component is passed over.
func CheckConfig(t *testing.T, component, file string, load func(path string, getenv func(string) string) error) {
	for name, values := range ValueSets() {
		t.Run(name, func(t *testing.T) {
			objs := Render(t, values)
			dep := Component(objs, component)
			if dep == nil {
				t.Logf("value set %s runs no %s", name, component)
				return
			}
			path := Mount(t, objs, dep, file)
			if err := load(path, Getenv(dep.Spec.Template.Spec.Containers[0])); err != nil {
				t.Errorf("the chart's %s file does not load: %v", component, err)
			}
		})
	}
}
