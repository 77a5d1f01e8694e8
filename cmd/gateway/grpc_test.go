package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestEnvoyRateLimitService runs the gateway with grpc.listen set on real
// Redis: Envoy's ShouldRateLimit answers from envoyproxy/ratelimit's
// files, its decisions reach the gateway's metrics, and SIGHUP or a change
// of the files reloads them.
func TestEnvoyRateLimitService(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules")
	if err := os.Mkdir(rules, 0o755); err != nil {
		t.Fatal(err)
	}
	writeRules := func(n int) {
		body := fmt.Sprintf("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", n)
		if err := os.WriteFile(filepath.Join(rules, "edge.yaml.tmp"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(rules, "edge.yaml.tmp"), filepath.Join(rules, "edge.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	writeRules(1)
	path := filepath.Join(dir, "gw.yaml")
	cfg := fmt.Sprintf(configTmpl, 10, up.URL, true) + fmt.Sprintf("grpc:\n  listen: 127.0.0.1:0\n  config_dir: %s\n", rules)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := start(t, []string{"-config", path}, env(map[string]string{"EDGELIMIT_REDIS_ADDR": testenv.RedisAddr(t), "EDGELIMIT_REDIS_PREFIX": "grpcmain" + fmt.Sprint(time.Now().UnixNano())}))
	var line map[string]any
	testenv.WaitFor(t, 20*time.Second, "the grpc listener", func() bool { line = r.logs.find("envoy rate limit service listening"); return line != nil })
	conn, err := grpc.NewClient(line["grpc_addr"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.7"}}},
		}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	if got := ask().GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first: %v", got)
	}
	if got := ask().GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second at 1/min: %v, want OVER_LIMIT", got)
	}
	if got := metric(t, r.admin, `edgelimit_gateway_decisions_total{mode="enforced",result="denied",rule="edge.remote_address"}`); got != "1" {
		t.Errorf("denied decisions of edge.remote_address = %q, want 1", got)
	}

	writeRules(5)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the rules to reload", func() bool { return r.logs.find("envoy ratelimit config reloaded") != nil })
	if st := ask().GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 5 || st.GetCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("after reload to 5/min: %v", st)
	}

	// Without a signal: the directory is watched like the file (-watch).
	writeRules(7)
	testenv.WaitFor(t, 20*time.Second, "the changed rules to be picked up", func() bool {
		return ask().GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 7
	})
}

// TestAdminCLIDoorBucket: on-call reaches a bucket of the Envoy door by
// its domain and descriptor entries, through the same CLI and admin API
// as keys: show reads it, reset refills it (audited in the log), and the
// next ShouldRateLimit is admitted again.
func TestAdminCLIDoorBucket(t *testing.T) {
	const token = "cli-admin-token-0123456789"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules")
	if err := os.Mkdir(rules, 0o755); err != nil {
		t.Fatal(err)
	}
	body := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(rules, "edge.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gw.yaml")
	cfg := fmt.Sprintf(configTmpl, 10, up.URL, true) + fmt.Sprintf("grpc:\n  listen: 127.0.0.1:0\n  config_dir: %s\n", rules)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	getenv := env(map[string]string{"EDGELIMIT_REDIS_ADDR": testenv.RedisAddr(t), "EDGELIMIT_ADMIN_TOKEN": token,
		"EDGELIMIT_REDIS_PREFIX": "grpcadmin" + fmt.Sprint(time.Now().UnixNano())})
	r := start(t, []string{"-config", path}, getenv)
	var line map[string]any
	testenv.WaitFor(t, 20*time.Second, "the grpc listener", func() bool { line = r.logs.find("envoy rate limit service listening"); return line != nil })
	conn, err := grpc.NewClient(line["grpc_addr"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ask := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.7"}}},
		}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp.GetOverallCode()
	}
	ask()
	if got := ask(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second at 1/min: %v, want OVER_LIMIT", got)
	}
	cli := func(args ...string) map[string]any {
		t.Helper()
		var out strings.Builder
		args = append([]string{"admin", "key"}, append(args, "-admin", r.admin, "-domain", "edge", "-entry", "remote_address=192.0.2.7")...)
		if err := run(context.Background(), args, getenv, &out); err != nil {
			t.Fatalf("gateway %v: %v", args, err)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
			t.Fatalf("gateway %v printed %q: %v", args, out.String(), err)
		}
		return v
	}
	remaining := func(v map[string]any) any {
		return v["buckets"].([]any)[0].(map[string]any)["rules"].([]any)[0].(map[string]any)["remaining"]
	}
	if v := cli("show"); remaining(v) != 0.0 || v["domain"] != "edge" {
		t.Errorf("show after 1 of 1: %v, want domain edge, remaining 0", v)
	}
	if v := cli("reset"); remaining(v) != 1.0 || v["action"] != "reset" {
		t.Errorf("reset: %v, want remaining 1", v)
	}
	if got := ask(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("after reset: %v, want OK", got)
	}
	audit := r.logs.find("admin descriptor reset")
	if audit == nil || audit["actor"] != "env" || audit["domain"] != "edge" || audit["key_id"] == "" {
		t.Errorf("audit log line %v, want actor env, domain edge, a key id", audit)
	}
	if strings.Contains(r.logs.String(), "192.0.2.7") {
		t.Error("the log holds the descriptor's value")
	}
	var out strings.Builder
	err = run(context.Background(), []string{"admin", "key", "show", "-admin", r.admin, "-domain", "edge", "-entry", "other=x"}, getenv, &out)
	if err == nil || !strings.Contains(err.Error(), "No bucket") {
		t.Errorf("show of entries no descriptor limits: %v, want a 404 saying no bucket", err)
	}
}
