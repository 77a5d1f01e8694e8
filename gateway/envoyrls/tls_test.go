package envoyrls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgelimit/edgelimit/gateway"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgelimit-rls-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "rls.crt"), filepath.Join(dir, "rls.key")
	writeFile(t, dir, "rls.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, dir, "rls.key", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	rules := t.TempDir()
	writeFile(t, rules, "test.yaml", features)
	gw, err := gateway.New(gatewayConfig(), gateway.Options{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Listen: "127.0.0.1:0", ConfigDir: rules, TLS: TLS{CertFile: certFile, KeyFile: keyFile}}, gw, Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, svc)

	call := func(creds credentials.TransportCredentials) error {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: descs(desc("generic_key", "three"))})
		return err
	}
	if err := call(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	if err := call(insecure.NewCredentials()); err == nil {
		t.Fatal("plaintext to a TLS listener succeeded")
	}
	if _, err := New(Config{Listen: "127.0.0.1:0", ConfigDir: rules, TLS: TLS{CertFile: certFile}}, gw, Options{}); err == nil {
		t.Error("a cert without a key was accepted")
	}
}
