// Package boot is what edgelimit's three processes (cmd/gateway,
// cmd/consumer, cmd/analytics) share to start and stop: strict YAML with
// environment overrides and redacted secrets, the logger, the Redis, Kafka
// and ClickHouse clients, the admin HTTP server, the build's version and
// one ordered shutdown. Each link to a server (Redis, Kafka, ClickHouse) is
// configured by one struct here, so TLS and authentication are added in one
// place for every process.
//
// It is internal: only cmd/* imports it, and it imports no edgelimit
// package, so the one-way data flow that deps_test.go pins is untouched.
package boot

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Version and Revision are stamped at build time:
//
//	go build -ldflags "-X github.com/edgelimit/edgelimit/internal/boot.Version=v1.2.3 -X github.com/edgelimit/edgelimit/internal/boot.Revision=abc123"
//
// An unstamped build is "dev"; its revision comes from the Go build
// information when the toolchain recorded one.
var (
	Version  = "dev"
	Revision = ""
)

// revision is Revision, or the VCS revision Go recorded, or "unknown".
func revision() string {
	if Revision != "" {
		return Revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// VersionLine is what -version prints: the command, its version, revision
// and Go version.
func VersionLine(command string) string {
	return fmt.Sprintf("%s %s (revision %s, %s)", command, Version, revision(), runtime.Version())
}

// NewRegistry returns a process's Prometheus registry with the Go runtime,
// process and edgelimit_build_info collectors registered.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "edgelimit_build_info",
		Help:        "Always 1; its labels say which build is running.",
		ConstLabels: prometheus.Labels{"version": Version, "revision": revision(), "goversion": runtime.Version()},
	})
	info.Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), info)
	return reg
}
