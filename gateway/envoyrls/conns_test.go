package envoyrls

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestConnectionCap: connections over grpc.max_connections are closed on
// accept and counted, and one that never finishes its handshake is closed
// after grpc.handshake_timeout, handing its slot back: idle connections
// cannot take every file descriptor of the gateway (grpc-go keeps them
// 120s and takes any number).
func TestConnectionCap(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{MaxConnections: 2, HandshakeTimeout: 2 * time.Second}, gatewayConfig(), "")
	r.ask(t, "test", 0, desc("generic_key", "three")) // the client's connection: slot 1
	addr := r.conn.Target()

	// closedBy reads conn until the server closes it (io.EOF or a reset),
	// failing on the test's own deadline instead.
	closedBy := func(conn net.Conn) bool {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadAll(conn)
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}
	// Idle connections, never a byte, until one is over the cap: dialled
	// until then, in case an earlier one already timed out.
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	testenv.WaitFor(t, 10*time.Second, "a connection over the cap to be refused", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		idle = append(idle, c)
		return testutil.ToFloat64(r.svc.refused) >= 1
	})
	if !closedBy(idle[len(idle)-1]) {
		t.Fatal("the connection over the cap is still open")
	}
	if !closedBy(idle[0]) {
		t.Fatal("a connection that never sent the HTTP/2 preface is still open 10s on (handshake_timeout 2s)")
	}
	// Its slot is free again: a new client is served.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	r2 := *r
	r2.client = rlsv3.NewRateLimitServiceClient(cc)
	testenv.WaitFor(t, 10*time.Second, "a new client to be served", func() bool {
		_, err := r2.try("test", 0, desc("generic_key", "three"))
		return err == nil
	})
}
