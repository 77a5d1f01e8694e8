package envoyrls

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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

// TestStalledCallIsCut: a call that never sends the whole of its request
// (a message header promising 1000 bytes, 3 of them sent, no deadline of
// its own, every keepalive ping answered) is ended by the server after
// grpc.call_timeout: otherwise its goroutine and what it sent are held
// until the connection dies, which a client answering pings never lets
// happen, and 1024 such streams per connection hold a GiB.
func TestStalledCallIsCut(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{CallTimeout: time.Second}, gatewayConfig(), "")
	conn, err := net.Dial("tcp", r.conn.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "rls"},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for _, err := range []error{
		fr.WriteSettings(),
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr.Bytes(), EndHeaders: true}),
		fr.WriteData(1, false, []byte{0, 0, 0, 0x03, 0xe8, 0x0a, 0x01, 't'}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the stalled call was not ended 30s on (call_timeout 1s): %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			if f.StreamID == 1 && f.StreamEnded() {
				return
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return
			}
		}
	}
}
