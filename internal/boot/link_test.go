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

// wrongPassword is the password the tests give where the server expects
// another; wantLinkError checks that no error shows it.
const wrongPassword = "not-the-password"

// wantLinkError fails unless err is a LinkError of kind whose message
// holds every want, on one line, without the wrong password.
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
	if strings.Contains(err.Error(), wrongPassword) {
		t.Errorf("%s: the error shows the password: %v", what, err)
	}
}

// openRedis validates r, opens a client that tries once and is closed with
// the test, and checks the link as the gateway does at start.
func openRedis(t *testing.T, r Redis) (redis.UniversalClient, error) {
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

func TestRedisLink(t *testing.T) {
	t.Parallel()
	certs, srv := testenv.TLSCerts(t), testenv.SecureRedis(t)
	master, sent := testenv.SecureRedisSentinel(t)
	addr := srv.Addrs[0]
	good := Redis{Addr: addr, Username: srv.User, Password: Secret(srv.Password), TLS: TLS{CAFile: certs.CA}}
	ping := func(r Redis) error {
		t.Helper()
		_, err := openRedis(t, r)
		return err
	}
	// Through a Sentinel that has credentials of its own, over TLS.
	viaSentinel := func(r *Redis) {
		r.Addr, r.SentinelAddrs, r.SentinelMaster = "", sent.Addrs, master
		r.SentinelUsername, r.SentinelPassword = sent.User, Secret(sent.Password)
	}
	sentinelLink := "redis (sentinel " + master + " " + sent.Addrs[0] + ", tls)"

	for _, tt := range []struct {
		name string
		give func(*Redis)
		kind error // nil: the link connects
		want string
	}{
		{name: "TLS + ACL user", give: func(*Redis) {}},
		{name: "TLS 1.3 + client certificate", give: func(r *Redis) {
			r.TLS.CertFile, r.TLS.KeyFile, r.TLS.MinVersion = certs.Client, certs.ClientKey, "1.3"
		}},
		{"wrong password", func(r *Redis) { r.Password = wrongPassword }, ErrAuth, "redis (" + addr + ", tls): authentication failed: WRONGPASS"},
		{"no credentials", func(r *Redis) { r.Username, r.Password = "", "" }, ErrAuth, "authentication failed: NOAUTH"},
		{"untrusted CA", func(r *Redis) { r.TLS.CAFile = certs.UntrustedCA }, ErrTLS, "redis (" + addr + ", tls): TLS handshake: x509: certificate signed by unknown authority"},
		{"wrong server name", func(r *Redis) { r.TLS.ServerName = "redis.example.com" }, ErrTLS, "TLS handshake: x509: certificate is valid for localhost, not redis.example.com"},
		{"no TLS", func(r *Redis) { r.TLS = TLS{} }, ErrProtocol, "redis (" + addr + "): the server dropped the connection (does it require TLS"},

		{name: "Sentinel over TLS with its own ACL user", give: viaSentinel},
		{"wrong Sentinel password", func(r *Redis) { viaSentinel(r); r.SentinelPassword = wrongPassword }, ErrAuth, sentinelLink + ": authentication failed: sentinel: WRONGPASS"},
		{"no Sentinel credentials", func(r *Redis) { viaSentinel(r); r.SentinelUsername, r.SentinelPassword = "", "" }, ErrAuth, sentinelLink + ": authentication failed: sentinel: NOAUTH"},
		{"wrong master password via Sentinel", func(r *Redis) { viaSentinel(r); r.Password = wrongPassword }, ErrAuth, sentinelLink + ": authentication failed: WRONGPASS"},
		{"untrusted CA via Sentinel", func(r *Redis) { viaSentinel(r); r.TLS.CAFile = certs.UntrustedCA }, ErrTLS, sentinelLink + ": TLS handshake: x509: certificate signed by unknown authority"},
	} {
		r := good
		tt.give(&r)
		err := ping(r)
		if tt.kind == nil {
			if err != nil {
				t.Errorf("PingRedis(%s) = %v, want nil", tt.name, err)
			}
			continue
		}
		wantLinkError(t, tt.name, err, tt.kind, tt.want)
	}

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
		wrong.SASL.Password = wrongPassword
		wantLinkError(t, "wrong password "+mech, check(wrong), ErrAuth, "kafka ("+brokers+", tls, sasl "+mech+"): authentication failed: ")
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
	for _, tt := range []struct {
		name string
		give func(*ClickHouse)
		kind error
		want string
	}{
		{"wrong password", func(c *ClickHouse) { c.Password = wrongPassword }, ErrAuth, "clickhouse (" + addr + ", tls): authentication failed: "},
		{"no password", func(c *ClickHouse) { c.Password = "" }, ErrAuth, "authentication failed"},
		{"untrusted CA", func(c *ClickHouse) { c.TLS.CAFile = certs.UntrustedCA }, ErrTLS, "clickhouse (" + addr + ", tls): TLS handshake: x509: certificate signed by unknown authority"},
		{"no TLS", func(c *ClickHouse) { c.TLS = TLS{} }, ErrProtocol, "clickhouse (" + addr + "): the server dropped the connection"},
	} {
		c := good
		tt.give(&c)
		wantLinkError(t, tt.name, ping(c), tt.kind, tt.want)
	}
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

	// An https URL whose server speaks plain HTTP: a TLS problem, which
	// stops the start, not a server that is down.
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer plain.Close()
	plainTLS := "https://" + strings.TrimPrefix(plain.URL, "http://")
	pc, err := NewHTTPClient(5*time.Second, map[string]HTTP{plainTLS: {TLS: TLS{CAFile: certs.CA}}})
	if err != nil {
		t.Fatal(err)
	}
	wantLinkError(t, "https to plain HTTP", CheckHTTP(ctx, pc, "alertmanager", http.MethodGet, plainTLS+"/api/v2/status"), ErrTLS,
		"alertmanager ("+plainTLS+"): TLS handshake: http: server gave HTTP response to HTTPS client")

	// Alertmanager and a webhook behind one server (one proxy), each with
	// its own token: each path gets its own, however the links' map is
	// ordered (a client per try).
	shared := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := map[bool]string{true: "Bearer am-token", false: "Bearer hook-token"}[strings.HasPrefix(r.URL.Path, "/alertmanager/")]
		if r.Header.Get("Authorization") != want {
			http.Error(w, "no", http.StatusUnauthorized)
		}
	}))
	shared.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	shared.StartTLS()
	defer shared.Close()
	for range 10 {
		both, err := NewHTTPClient(5*time.Second, map[string]HTTP{
			shared.URL + "/alertmanager/":  {TLS: TLS{CAFile: certs.CA}, BearerToken: "am-token"},
			shared.URL + "/hooks/team-a-x": {TLS: TLS{CAFile: certs.CA}, BearerToken: "hook-token"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckHTTP(ctx, both, "alertmanager", http.MethodGet, shared.URL+"/alertmanager/api/v2/status"); err != nil {
			t.Errorf("CheckHTTP(alertmanager beside a webhook on one host) = %v, want nil", err)
		}
		if err := CheckHTTP(ctx, both, "alert webhook", http.MethodHead, shared.URL+"/hooks/team-a-x"); err != nil {
			t.Errorf("CheckHTTP(webhook beside alertmanager on one host) = %v, want nil", err)
		}
	}

	// A destination that redirects (to another server here; as well to
	// plain http): not followed. Go's client would post the alerts again
	// as a GET, and its 200 would count as delivered.
	moved := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, hook.URL+"/hook/elsewhere?token=t0ken", http.StatusFound)
	}))
	moved.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	moved.StartTLS()
	defer moved.Close()
	mc, err := NewHTTPClient(5*time.Second, map[string]HTTP{moved.URL: {TLS: TLS{CAFile: certs.CA}, BearerToken: "t0ken"}})
	if err != nil {
		t.Fatal(err)
	}
	err = CheckHTTP(ctx, mc, "alertmanager", http.MethodGet, moved.URL+"/api/v2/status")
	wantLinkError(t, "redirect", err, ErrRedirect, "alertmanager ("+moved.URL+"): redirected (not followed", "302 Found to "+hook.URL)
	if err != nil && strings.Contains(err.Error(), "t0ken") {
		t.Errorf("the error shows the redirect's query: %v", err)
	}
	resp, err := mc.Post(moved.URL+"/api/v2/alerts", "application/json", strings.NewReader("[]"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Errorf("POST to a redirect = %s, want the 302 itself, not followed", resp.Status)
	}
	select {
	case got := <-seen:
		t.Errorf("the redirect's target got a request (Authorization %q), want none", got)
	default:
	}

	if _, err := NewHTTPClient(time.Second, map[string]HTTP{"https://hooks.example/T0KEN-in-path\x7f": {}}); err == nil || strings.Contains(err.Error(), "T0KEN") {
		t.Errorf("NewHTTPClient(an unparsable URL) = %v, want an error that does not show the URL", err)
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
	// PLAIN over plain TCP would show the password to the network.
	for _, mech := range []string{"PLAIN", "plain"} {
		k := Kafka{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: mech, Username: "a", Password: "b"}}
		if err := k.Validate(); err == nil || !strings.Contains(err.Error(), "kafka.tls") {
			t.Errorf("Validate(SASL %s without TLS) = %v, want it refused, naming kafka.tls", mech, err)
		}
		k.TLS.Enabled = true
		if err := k.Validate(); err != nil {
			t.Errorf("Validate(SASL %s over TLS) = %v, want nil", mech, err)
		}
	}
	if err := (Kafka{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "SCRAM-SHA-512", Username: "a", Password: "b"}}).Validate(); err != nil {
		t.Errorf("Validate(SCRAM without TLS) = %v, want nil: SCRAM never sends the password", err)
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

	// One seed: the client learns the other masters from it, at their TLS
	// ports, and reaches each as the ACL user.
	rdb, err := openRedis(t, good)
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
	wrong.Password = wrongPassword
	_, err = openRedis(t, wrong)
	wantLinkError(t, "cluster wrong password", err, ErrAuth, link+": authentication failed: WRONGPASS")
	untrusted := good
	untrusted.TLS.CAFile = certs.UntrustedCA
	_, err = openRedis(t, untrusted)
	wantLinkError(t, "cluster untrusted CA", err, ErrTLS, link+": TLS handshake: x509: certificate signed by unknown authority")
}
