package boot

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// These tests check each link against the test stack's servers that
// require TLS and credentials (deploy/local/tls.sh and the secure parts of
// redis.sh, kafka.sh, clickhouse.sh): the right settings connect, and each
// wrong one fails at the check with a message naming the link and the
// cause.

var quiet = slog.New(slog.DiscardHandler)

// wantLinkError fails unless err is a LinkError of kind whose message
// holds every want.
func wantLinkError(t *testing.T, what string, err error, kind error, want ...string) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	var le *LinkError
	if !errors.As(err, &le) || !errors.Is(err, kind) {
		t.Errorf("%s: err = %v, want a LinkError of kind %q", what, err, kind)
		return
	}
	if !Fatal(err) {
		t.Errorf("%s: Fatal(%v) = false, want true", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: err = %q, want it to contain %q", what, err, w)
		}
	}
	if strings.Count(err.Error(), "\n") > 0 {
		t.Errorf("%s: err = %q, want one line", what, err)
	}
}

func TestRedisLink(t *testing.T) {
	t.Parallel()
	certs, srv := testenv.TLSCerts(t), testenv.SecureRedis(t)
	addr := srv.Addrs[0]
	good := Redis{Addr: addr, Username: srv.User, Password: Secret(srv.Password), TLS: TLS{CAFile: certs.CA}}
	ping := func(r Redis) error {
		t.Helper()
		if err := r.Validate(); err != nil {
			t.Fatalf("Validate(%+v) = %v", r, err)
		}
		rdb, err := NewRedis(r, RedisTuning{Timeout: 2 * time.Second, MaxRetries: -1}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		return PingRedis(context.Background(), rdb, r)
	}

	if err := ping(good); err != nil {
		t.Errorf("PingRedis(TLS + ACL user) = %v, want nil", err)
	}
	withCert := good
	withCert.TLS.CertFile, withCert.TLS.KeyFile, withCert.TLS.MinVersion = certs.Client, certs.ClientKey, "1.3"
	if err := ping(withCert); err != nil {
		t.Errorf("PingRedis(TLS 1.3 + client certificate) = %v, want nil", err)
	}

	wrong := good
	wrong.Password = "not-the-password"
	err := ping(wrong)
	wantLinkError(t, "wrong password", err, ErrAuth, "redis ("+addr+", tls): authentication failed: WRONGPASS")
	if strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("the error shows the password: %v", err)
	}

	anon := good
	anon.Username, anon.Password = "", ""
	wantLinkError(t, "no credentials", ping(anon), ErrAuth, "authentication failed: NOAUTH")

	untrusted := good
	untrusted.TLS.CAFile = certs.UntrustedCA
	wantLinkError(t, "untrusted CA", ping(untrusted), ErrTLS, "redis ("+addr+", tls): TLS handshake: x509: certificate signed by unknown authority")

	wrongName := good
	wrongName.TLS.ServerName = "redis.example.com"
	wantLinkError(t, "wrong server name", ping(wrongName), ErrTLS, "TLS handshake: x509: certificate is valid for localhost, not redis.example.com")

	plain := good
	plain.TLS = TLS{}
	wantLinkError(t, "no TLS", ping(plain), ErrProtocol, "redis ("+addr+"): the server dropped the connection (does it require TLS")

	// Through a Sentinel that has credentials of its own, over TLS.
	master, sent := testenv.SecureRedisSentinel(t)
	viaSentinel := good
	viaSentinel.Addr, viaSentinel.SentinelAddrs, viaSentinel.SentinelMaster = "", sent.Addrs, master
	viaSentinel.SentinelUsername, viaSentinel.SentinelPassword = sent.User, Secret(sent.Password)
	if err := ping(viaSentinel); err != nil {
		t.Errorf("PingRedis(Sentinel over TLS with its own ACL user) = %v, want nil", err)
	}
	sentinelLink := "redis (sentinel " + master + " " + sent.Addrs[0] + ", tls)"
	wrongSentinel := viaSentinel
	wrongSentinel.SentinelPassword = "not-the-password"
	wantLinkError(t, "wrong Sentinel password", ping(wrongSentinel), ErrAuth, sentinelLink+": authentication failed: sentinel: WRONGPASS")
	noSentinelAuth := viaSentinel
	noSentinelAuth.SentinelUsername, noSentinelAuth.SentinelPassword = "", ""
	wantLinkError(t, "no Sentinel credentials", ping(noSentinelAuth), ErrAuth, sentinelLink+": authentication failed: sentinel: NOAUTH")
	wrongMaster := viaSentinel
	wrongMaster.Password = "not-the-password"
	wantLinkError(t, "wrong master password via Sentinel", ping(wrongMaster), ErrAuth, sentinelLink+": authentication failed: WRONGPASS")
	untrustedSentinel := viaSentinel
	untrustedSentinel.TLS.CAFile = certs.UntrustedCA
	wantLinkError(t, "untrusted CA via Sentinel", ping(untrustedSentinel), ErrTLS, sentinelLink+": TLS handshake: x509: certificate signed by unknown authority")

	// A Redis that is down is not a configuration problem: the gateway
	// starts and its failure policy covers.
	down := Redis{Addr: testenv.FreeAddr(t)}
	if err := ping(down); !errors.Is(err, ErrUnavailable) || Fatal(err) {
		t.Errorf("PingRedis(nothing listening) = %v, want ErrUnavailable, not fatal", err)
	}
}

func TestKafkaLink(t *testing.T) {
	t.Parallel()
	certs, srv := testenv.TLSCerts(t), testenv.SecureKafka(t)
	brokers := strings.Join(srv.Addrs, ",")
	link := func(mech string) Kafka {
		return Kafka{Brokers: srv.Addrs, TLS: TLS{CAFile: certs.CA}, SASL: SASL{Mechanism: mech, Username: srv.User, Password: Secret(srv.Password)}}
	}
	check := func(k Kafka) error {
		t.Helper()
		if err := k.Validate(); err != nil {
			t.Fatalf("Validate(%+v) = %v", k, err)
		}
		return k.Check(context.Background(), quiet)
	}

	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "scram-sha-512"} {
		if err := check(link(mech)); err != nil {
			t.Errorf("Check(SASL_SSL %s) = %v, want nil", mech, err)
		}
	}

	for _, mech := range []string{"PLAIN", "SCRAM-SHA-512"} {
		wrong := link(mech)
		wrong.SASL.Password = "not-the-password"
		err := check(wrong)
		wantLinkError(t, "wrong password "+mech, err, ErrAuth, "kafka ("+brokers+", tls, sasl "+mech+"): authentication failed: ")
		if strings.Contains(err.Error(), "not-the-password") {
			t.Errorf("the error shows the password: %v", err)
		}
	}

	unknownUser := link("SCRAM-SHA-256")
	unknownUser.SASL.Username = "mallory"
	wantLinkError(t, "unknown user", check(unknownUser), ErrAuth, "authentication failed")

	untrusted := link("SCRAM-SHA-512")
	untrusted.TLS.CAFile = certs.UntrustedCA
	wantLinkError(t, "untrusted CA", check(untrusted), ErrTLS, "kafka ("+brokers+", tls, sasl SCRAM-SHA-512): TLS handshake: x509: certificate signed by unknown authority")

	noSASL := link("")
	noSASL.SASL = SASL{}
	wantLinkError(t, "no SASL", check(noSASL), ErrProtocol, "kafka ("+brokers+", tls): the server dropped the connection (does it require TLS, or SASL?)")

	noTLS := link("SCRAM-SHA-512")
	noTLS.TLS = TLS{}
	wantLinkError(t, "no TLS", check(noTLS), ErrProtocol, "kafka ("+brokers+", sasl SCRAM-SHA-512): the server dropped the connection")

	// The plain listener of the same broker still answers plain clients.
	if err := check(Kafka{Brokers: testenv.KafkaBrokers(t)}); err != nil {
		t.Errorf("Check(plain listener) = %v, want nil", err)
	}
}

func TestClickHouseLink(t *testing.T) {
	t.Parallel()
	certs, srv := testenv.TLSCerts(t), testenv.SecureClickHouse(t)
	addr := srv.Addrs[0]
	good := ClickHouse{Addr: addr, Username: srv.User, Password: Secret(srv.Password), TLS: TLS{CAFile: certs.CA}}
	ping := func(c ClickHouse) error {
		t.Helper()
		if err := c.Validate(); err != nil {
			t.Fatalf("Validate(%+v) = %v", c, err)
		}
		conn, err := OpenClickHouse(c, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return PingClickHouse(context.Background(), conn, c)
	}

	if err := ping(good); err != nil {
		t.Errorf("PingClickHouse(TLS + password) = %v, want nil", err)
	}

	wrong := good
	wrong.Password = "not-the-password"
	err := ping(wrong)
	wantLinkError(t, "wrong password", err, ErrAuth, "clickhouse ("+addr+", tls): authentication failed: ")
	if strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("the error shows the password: %v", err)
	}

	noPassword := good
	noPassword.Password = ""
	wantLinkError(t, "no password", ping(noPassword), ErrAuth, "authentication failed")

	untrusted := good
	untrusted.TLS.CAFile = certs.UntrustedCA
	wantLinkError(t, "untrusted CA", ping(untrusted), ErrTLS, "clickhouse ("+addr+", tls): TLS handshake: x509: certificate signed by unknown authority")

	plain := good
	plain.TLS = TLS{}
	wantLinkError(t, "no TLS", ping(plain), ErrProtocol, "clickhouse ("+addr+"): the server dropped the connection")
}

// TestHTTPLink: the alert destinations' link, against real HTTPS servers
// with the stack's certificate: each gets its own credentials, an
// untrusted certificate or a refused credential fails the check.
func TestHTTPLink(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCerts(t)
	cert, err := tls.LoadX509KeyPair(strings.TrimSuffix(certs.CA, "ca.pem")+"server.pem", strings.TrimSuffix(certs.CA, "ca.pem")+"server-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 10)
	serve := func(want string) *httptest.Server {
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen <- r.Header.Get("Authorization")
			if r.Header.Get("Authorization") != want {
				http.Error(w, "no", http.StatusUnauthorized)
			}
		}))
		s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		s.StartTLS()
		t.Cleanup(s.Close)
		return s
	}
	am := serve("Basic YWxpY2U6czNjcmV0") // alice:s3cret
	hook := serve("Bearer t0ken")

	links := map[string]HTTP{
		am.URL:   {TLS: TLS{CAFile: certs.CA}, Username: "alice", Password: "s3cret"},
		hook.URL: {TLS: TLS{CAFile: certs.CA}, BearerToken: "t0ken"},
	}
	for name, h := range links {
		if err := h.Validate(name); err != nil {
			t.Fatal(err)
		}
	}
	client, err := NewHTTPClient(5*time.Second, links)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := CheckHTTP(ctx, client, "alertmanager", http.MethodGet, am.URL+"/api/v2/status"); err != nil {
		t.Errorf("CheckHTTP(alertmanager, basic auth) = %v", err)
	}
	if err := CheckHTTP(ctx, client, "alert webhook", http.MethodHead, hook.URL+"/hook/secret-path"); err != nil {
		t.Errorf("CheckHTTP(webhook, bearer) = %v", err)
	}
	if got := []string{<-seen, <-seen}; got[0] == got[1] {
		t.Errorf("both destinations saw %q, want each its own credentials", got[0])
	}

	wrong, _ := NewHTTPClient(5*time.Second, map[string]HTTP{am.URL: {TLS: TLS{CAFile: certs.CA}, Username: "alice", Password: "nope"}})
	wantLinkError(t, "wrong password", CheckHTTP(ctx, wrong, "alertmanager", http.MethodGet, am.URL+"/api/v2/status"), ErrAuth,
		"alertmanager ("+am.URL+"): authentication failed: 401 Unauthorized")
	<-seen

	untrusted, _ := NewHTTPClient(5*time.Second, map[string]HTTP{hook.URL: {TLS: TLS{CAFile: certs.UntrustedCA}, BearerToken: "t0ken"}})
	err = CheckHTTP(ctx, untrusted, "alert webhook", http.MethodHead, hook.URL+"/hook/secret-path")
	wantLinkError(t, "untrusted CA", err, ErrTLS, "alert webhook ("+hook.URL+"): TLS handshake: x509: certificate signed by unknown authority")
	if strings.Contains(err.Error(), "secret-path") {
		t.Errorf("the error shows the webhook's path: %v", err)
	}

	if err := (HTTP{Username: "a", Password: "b", BearerToken: "c"}).Validate("alerts.webhook_client"); err == nil {
		t.Error("Validate(basic and bearer) = nil, want an error")
	}
}

func TestTLSValidate(t *testing.T) {
	for _, tt := range []struct {
		give TLS
		want string
	}{
		{TLS{CAFile: "/nonexistent/ca.pem"}, "ca_file"},
		{TLS{Enabled: true, CertFile: "/x.pem"}, "cert_file and key_file go together"},
		{TLS{Enabled: true, MinVersion: "1.1"}, `min_version "1.1"`},
	} {
		if err := tt.give.validate("redis.tls"); err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "redis.tls") {
			t.Errorf("%+v.validate() = %v, want redis.tls and %q", tt.give, err, tt.want)
		}
	}
	if c, err := (TLS{}).Config(); c != nil || err != nil {
		t.Errorf("TLS{}.Config() = %v, %v; want nil, nil (plain TCP)", c, err)
	}
	if err := (Kafka{SASL: SASL{Mechanism: "GSSAPI", Username: "a", Password: "b"}}).Validate(); err == nil || !strings.Contains(err.Error(), "GSSAPI") {
		t.Errorf("Validate(GSSAPI) = %v, want it refused by name", err)
	}
	if err := (Kafka{SASL: SASL{Mechanism: "PLAIN", Username: "a"}}).Validate(); err == nil || !strings.Contains(err.Error(), "password") {
		t.Errorf("Validate(PLAIN without password) = %v, want an error", err)
	}
}

// TestRedisClusterLink: a Redis Cluster that speaks TLS only and has an
// ACL user (a private one: the shared stack's Cluster is plain). Every
// master answers over TLS as the user; wrong settings fail named.
func TestRedisClusterLink(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCerts(t)
	s := testenv.Private(t, "redis-cluster-tls")
	addrs := strings.Split(s.Get(t, "EDGELIMIT_TEST_REDIS_TLS_CLUSTER_ADDRS"), ",")
	good := Redis{ClusterAddrs: addrs[:1], Username: s.Get(t, "EDGELIMIT_TEST_REDIS_USER"),
		Password: Secret(s.Get(t, "EDGELIMIT_TEST_REDIS_PASSWORD")), TLS: TLS{CAFile: certs.CA}}
	open := func(r Redis) (redis.UniversalClient, error) {
		t.Helper()
		if err := r.Validate(); err != nil {
			t.Fatalf("Validate(%+v) = %v", r, err)
		}
		rdb, err := NewRedis(r, RedisTuning{Timeout: 2 * time.Second, MaxRetries: -1}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.Close() })
		return rdb, PingRedis(context.Background(), rdb, r)
	}

	// One seed: the client learns the other masters from it, at their TLS
	// ports, and reaches each as the ACL user.
	rdb, err := open(good)
	if err != nil {
		t.Fatalf("PingRedis(TLS cluster) = %v, want nil", err)
	}
	var masters atomic.Int32 // ForEachMaster calls in parallel
	err = rdb.(*redis.ClusterClient).ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		masters.Add(1)
		return c.Ping(ctx).Err()
	})
	if n := int(masters.Load()); err != nil || n != len(addrs) {
		t.Errorf("ForEachMaster ping = %v over %d masters, want nil over %d", err, n, len(addrs))
	}

	link := "redis (cluster " + addrs[0] + ", tls)"
	wrong := good
	wrong.Password = "not-the-password"
	_, err = open(wrong)
	wantLinkError(t, "cluster wrong password", err, ErrAuth, link+": authentication failed: WRONGPASS")
	untrusted := good
	untrusted.TLS.CAFile = certs.UntrustedCA
	_, err = open(untrusted)
	wantLinkError(t, "cluster untrusted CA", err, ErrTLS, link+": TLS handshake: x509: certificate signed by unknown authority")
}
