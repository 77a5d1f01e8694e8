package main

import (
	"testing"

	"github.com/edgelimit/edgelimit/internal/chart"
)

// TestChartConfigLoads: the analytics's file the Helm chart renders, mounted
// and with the environment as its Deployment gives them (TLS CAs and
// values from Secrets as stand-ins), is one the analytics's own parser loads
// and validates, for every value set the chart is checked with.
func TestChartConfigLoads(t *testing.T) {
	chart.CheckConfig(t, "analytics", "/etc/edgelimit/analytics/analytics.yaml", func(path string, getenv func(string) string) error {
		_, err := loadConfig(path, getenv)
		return err
	})
}
