package testenv

import (
	"path/filepath"
	"strings"
	"testing"
)

// Certs are the test stack's certificates (deploy/local/tls.sh), PEM files.
type Certs struct {
	// CA signed every secure test server's certificate and Client.
	CA string
	// Client and ClientKey are a client certificate signed by CA.
	Client, ClientKey string
	// UntrustedCA signed nothing the servers use: a client trusting it
	// alone must refuse every secure test server.
	UntrustedCA string
}

// TLSCerts are the certificates of the secure test servers.
func TLSCerts(tb testing.TB) Certs {
	tb.Helper()
	dir := Lookup(tb, "EDGELIMIT_TEST_TLS_DIR", "test certificates")
	return Certs{
		CA:          filepath.Join(dir, "ca.pem"),
		Client:      filepath.Join(dir, "client.pem"),
		ClientKey:   filepath.Join(dir, "client-key.pem"),
		UntrustedCA: filepath.Join(dir, "untrusted-ca.pem"),
	}
}

// Secure is a server that requires TLS (certificates from TLSCerts) and
// credentials.
type Secure struct {
	// Addrs are the server's addresses, host:port (Kafka: seed brokers).
	Addrs    []string
	User     string
	Password string
}

// SecureRedis is a standalone Redis that speaks TLS only and has the
// default user off: User is an ACL user with every permission.
func SecureRedis(tb testing.TB) Secure {
	tb.Helper()
	return Secure{
		Addrs:    []string{Lookup(tb, "EDGELIMIT_TEST_REDIS_TLS_ADDR", "TLS Redis")},
		User:     Lookup(tb, "EDGELIMIT_TEST_REDIS_USER", "TLS Redis"),
		Password: Lookup(tb, "EDGELIMIT_TEST_REDIS_PASSWORD", "TLS Redis"),
	}
}

// SecureKafka is the SASL_SSL listener of the test broker (the same broker
// as KafkaBrokers): User exists for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
// with Password.
func SecureKafka(tb testing.TB) Secure {
	tb.Helper()
	return Secure{
		Addrs:    strings.Split(Lookup(tb, "EDGELIMIT_TEST_KAFKA_SASL_BROKERS", "SASL_SSL Kafka"), ","),
		User:     Lookup(tb, "EDGELIMIT_TEST_KAFKA_USER", "SASL_SSL Kafka"),
		Password: Lookup(tb, "EDGELIMIT_TEST_KAFKA_PASSWORD", "SASL_SSL Kafka"),
	}
}

// SecureClickHouse is the native TLS port (tcp_port_secure) of the test
// ClickHouse (the same server as ClickHouseAddr) and a user with a
// password there.
func SecureClickHouse(tb testing.TB) Secure {
	tb.Helper()
	return Secure{
		Addrs:    []string{Lookup(tb, "EDGELIMIT_TEST_CLICKHOUSE_TLS_ADDR", "TLS ClickHouse")},
		User:     Lookup(tb, "EDGELIMIT_TEST_CLICKHOUSE_USER", "TLS ClickHouse"),
		Password: Lookup(tb, "EDGELIMIT_TEST_CLICKHOUSE_PASSWORD", "TLS ClickHouse"),
	}
}

// SecureRedisSentinel is a Sentinel watching SecureRedis (its master
// name), TLS only, with an ACL user of its own: User and Password are the
// Sentinel's, not the master's.
func SecureRedisSentinel(tb testing.TB) (master string, s Secure) {
	tb.Helper()
	return Lookup(tb, "EDGELIMIT_TEST_REDIS_TLS_SENTINEL_MASTER", "TLS Redis Sentinel"), Secure{
		Addrs:    strings.Split(Lookup(tb, "EDGELIMIT_TEST_REDIS_TLS_SENTINEL_ADDRS", "TLS Redis Sentinel"), ","),
		User:     Lookup(tb, "EDGELIMIT_TEST_REDIS_SENTINEL_USER", "TLS Redis Sentinel"),
		Password: Lookup(tb, "EDGELIMIT_TEST_REDIS_SENTINEL_PASSWORD", "TLS Redis Sentinel"),
	}
}
