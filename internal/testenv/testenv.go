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

// RedisAddr is the standalone Redis server's address.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	return Lookup(tb, "EDGELIMIT_REDIS_ADDR", "standalone Redis")
}

// RedisClusterAddrs are the Redis Cluster masters' addresses.
func RedisClusterAddrs(tb testing.TB) []string {
	tb.Helper()
	return strings.Split(Lookup(tb, "EDGELIMIT_REDIS_CLUSTER_ADDRS", "Redis Cluster"), ",")
}

// ClickHouseAddr is the ClickHouse server's native-protocol address.
func ClickHouseAddr(tb testing.TB) string {
	tb.Helper()
	return Lookup(tb, "EDGELIMIT_CLICKHOUSE_ADDR", "ClickHouse")
}

// KafkaBrokers are the Kafka broker addresses.
func KafkaBrokers(tb testing.TB) []string {
	tb.Helper()
	return strings.Split(Lookup(tb, "EDGELIMIT_KAFKA_BROKERS", "Kafka"), ",")
}

// RedisSentinel is the Sentinel watching the standalone Redis: its master
// name and addresses.
func RedisSentinel(tb testing.TB) (master string, addrs []string) {
	tb.Helper()
	addrs = strings.Split(Lookup(tb, "EDGELIMIT_REDIS_SENTINEL_ADDRS", "Redis Sentinel"), ",")
	return Lookup(tb, "EDGELIMIT_REDIS_SENTINEL_MASTER", "Redis Sentinel"), addrs
}
