package boot

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestTLSVerifiedOnEveryLink: each link's client refuses, at the start
// check and as a TLS failure (fatal, not "unavailable"), a server whose
// certificate has expired, one that speaks only TLS 1.0/1.1, and one whose
// certificate names another host; and a server that accepts the connection
// but never finishes the handshake is "unavailable", within the check's
// deadline. The servers are crypto/tls listeners: what is checked is the
// client's side of the handshake, the same for every server behind it.
func TestTLSVerifiedOnEveryLink(t *testing.T) {
	t.Parallel()
	now := time.Now()
	valid, validCA := selfSigned(t, "127.0.0.1", now.Add(-time.Hour), now.Add(time.Hour))
	expired, expiredCA := selfSigned(t, "127.0.0.1", now.Add(-2*time.Hour), now.Add(-time.Hour))
	other, otherCA := selfSigned(t, "10.9.8.7", now.Add(-time.Hour), now.Add(time.Hour))
	servers := []struct {
		name string
		cfg  *tls.Config
		ca   string
		kind error
		want string
	}{
		{"expired certificate", &tls.Config{Certificates: []tls.Certificate{expired}}, expiredCA, ErrTLS, "x509: certificate has expired"},
		{"TLS 1.1 at most", &tls.Config{Certificates: []tls.Certificate{valid}, MaxVersion: tls.VersionTLS11}, validCA, ErrTLS, "protocol version not supported"},
		{"certificate for another host", &tls.Config{Certificates: []tls.Certificate{other}}, otherCA, ErrTLS, "x509: certificate is valid for 10.9.8.7, not 127.0.0.1"},
		{"handshake never finishes", nil, validCA, ErrUnavailable, "context deadline exceeded"},
	}
	for _, s := range servers {
		addr := serveTLS(t, s.cfg)
		tc := TLS{CAFile: s.ca}
		checks := map[string]func() error{
			"redis": func() error {
				r := Redis{Addr: addr, TLS: tc}
				rdb, err := NewRedis(r, RedisTuning{Timeout: time.Second, MaxRetries: -1}, quiet)
				if err != nil {
					return err
				}
				defer rdb.Close()
				return PingRedis(context.Background(), rdb, r)
			},
			"kafka": func() error { return Kafka{Brokers: []string{addr}, TLS: tc}.Check(context.Background(), quiet) },
			"clickhouse": func() error {
				c := ClickHouse{Addr: addr, TLS: tc}
				conn, err := OpenClickHouse(c, time.Second)
				if err != nil {
					return err
				}
				defer conn.Close()
				return PingClickHouse(context.Background(), conn, c)
			},
			"alertmanager": func() error {
				c, err := NewHTTPClient(10*time.Second, map[string]HTTP{"https://" + addr: {TLS: tc}})
				if err != nil {
					return err
				}
				return CheckHTTP(context.Background(), c, "alertmanager", http.MethodGet, "https://"+addr+"/api/v2/status")
			},
		}
		for link, check := range checks {
			t.Run(s.name+"/"+link, func(t *testing.T) {
				t.Parallel()
				err := check()
				var le *LinkError
				if !errors.As(err, &le) || !errors.Is(err, s.kind) || Fatal(err) != (s.kind != ErrUnavailable) {
					t.Fatalf("check = %v, want a LinkError of kind %q", err, s.kind)
				}
				if !strings.Contains(err.Error(), s.want) {
					t.Errorf("check = %q, want it to say %q", err, s.want)
				}
			})
		}
	}
}

// selfSigned is a certificate for ip valid from nb to na, signed by
// itself, and the PEM file that trusts it.
func selfSigned(t *testing.T, ip string, nb, na time.Time) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgelimit test"}, NotBefore: nb, NotAfter: na,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP(ip)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, p
}

// serveTLS accepts connections on a loopback port until the test ends:
// with cfg, it handshakes and closes each; with nil, it holds each open
// and never says a word.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	if cfg == nil {
		return testenv.Serve(t, nil)
	}
	return testenv.Serve(t, func(c net.Conn) {
		tc := tls.Server(c, cfg)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		_ = tc.Handshake()
		tc.Close()
	})
}
