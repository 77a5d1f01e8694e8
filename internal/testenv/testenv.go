// Package testenv tells tests where the real servers started by
// deploy/local/testenv.sh listen. A test whose server is missing skips when
// run by hand and fails when EDGELIMIT_REQUIRE_SERVERS is set (make test and
// CI set it), so a green CI run means the real-server tier ran.
package testenv

import (
	"os"
	"strings"
	"testing"
)

// Lookup returns the environment variable name, or handles its absence.
func Lookup(tb testing.TB, name, what string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	if os.Getenv("EDGELIMIT_REQUIRE_SERVERS") != "" || os.Getenv("CI") != "" {
		tb.Fatalf("%s: %s is not set; make test starts it (deploy/local/testenv.sh)", what, name)
	}
	tb.Skipf("%s: %s not set; run make test to start real servers", what, name)
	return ""
}

// The shared servers' addresses. Each is a Lookup of its variable: the test
// skips or fails, as Lookup says, when the server is missing.
var (
	// RedisAddr is the standalone Redis server's address.
	RedisAddr = lookup("EDGELIMIT_REDIS_ADDR", "standalone Redis")
	// RedisClusterAddrs are the Redis Cluster masters' addresses.
	RedisClusterAddrs = lookupList("EDGELIMIT_REDIS_CLUSTER_ADDRS", "Redis Cluster")
	// ClickHouseAddr is the ClickHouse server's native-protocol address.
	ClickHouseAddr = lookup("EDGELIMIT_CLICKHOUSE_ADDR", "ClickHouse")
	// ClickHouseHTTPAddr is the ClickHouse server's HTTP address
	// (host:port). clickhouse-go's HTTP protocol does not work with
	// ClickHouse 18.16; this is for plain HTTP queries.
	ClickHouseHTTPAddr = lookup("EDGELIMIT_CLICKHOUSE_HTTP", "ClickHouse HTTP")
	// KafkaBrokers are the Kafka broker addresses.
	KafkaBrokers = lookupList("EDGELIMIT_KAFKA_BROKERS", "Kafka")
	// PrometheusURL is the Prometheus server's base URL, such as
	// http://127.0.0.1:9090. It accepts POST /-/reload.
	PrometheusURL = lookup("EDGELIMIT_PROMETHEUS_URL", "Prometheus")
	// AlertmanagerURL is the base URL of the Alertmanager that
	// PrometheusURL's server sends its alerts to.
	AlertmanagerURL = lookup("EDGELIMIT_ALERTMANAGER_URL", "Alertmanager")
	// PrometheusDir is the folder the Prometheus server reads: rule files
	// go to rules/NAME.yml (loaded on POST /-/reload) and file_sd target
	// groups to targets/NAME.yml (picked up within a second or two, job
	// "edgelimit"). The server is shared by every package under test, so
	// name files after the test.
	PrometheusDir = lookup("EDGELIMIT_PROMETHEUS_DIR", "Prometheus")
	// Chromium is the path of the Chromium binary for browser tests. Run it
	// with --headless --no-sandbox (tests run as root).
	Chromium = lookup("EDGELIMIT_CHROMIUM", "Chromium")
)

// lookup is the Lookup of the variable name; what names the server.
func lookup(name, what string) func(testing.TB) string {
	return func(tb testing.TB) string {
		tb.Helper()
		return Lookup(tb, name, what)
	}
}

// lookupList is lookup for a comma-separated list of addresses.
func lookupList(name, what string) func(testing.TB) []string {
	return func(tb testing.TB) []string {
		tb.Helper()
		return strings.Split(Lookup(tb, name, what), ",")
	}
}

// RedisSentinel is the Sentinel watching the standalone Redis: its master
// name and addresses.
func RedisSentinel(tb testing.TB) (master string, addrs []string) {
	tb.Helper()
	addrs = strings.Split(Lookup(tb, "EDGELIMIT_REDIS_SENTINEL_ADDRS", "Redis Sentinel"), ",")
	return Lookup(tb, "EDGELIMIT_REDIS_SENTINEL_MASTER", "Redis Sentinel"), addrs
}
