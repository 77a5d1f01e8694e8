package envoyrls

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/tap"
)

// Server returns a gRPC server for the service, with health checking and
// reflection, message size, stream and keepalive limits, and TLS when
// configured.
func (s *Service) Server() (*grpc.Server, error) {
	c := s.boot
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.MaxReceiveBytes),
		grpc.MaxConcurrentStreams(c.MaxConcurrentStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: c.Keepalive.Time, Timeout: c.Keepalive.Timeout, MaxConnectionIdle: c.Keepalive.MaxConnectionIdle,
		}),
		// Envoy pings idle connections too; allow it, at a bounded rate.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.Keepalive.MinTime, PermitWithoutStream: true}),
		// Strings that are not UTF-8 are read, not refused (see codec).
		grpc.ForceServerCodec(codec{}),
		// A connection that never finishes its handshake gives its slot
		// (see Listener) back soon. (Experimental in grpc-go, but there
		// since 1.15.)
		grpc.ConnectionTimeout(c.HandshakeTimeout),
		// Calls run on long-lived workers, whose stacks have grown to a
		// call's depth, rather than each on a new goroutine that grows its
		// stack again (7% of the door's CPU under load); a call finding
		// every worker busy still gets a goroutine of its own.
		grpc.NumStreamWorkers(streamWorkers),
		// No call outlives CallTimeout, whatever deadline its client set
		// (or none): one whose request never arrives whole is ended.
		grpc.InTapHandle(func(ctx context.Context, _ *tap.Info) (context.Context, error) {
			ctx, cancel := context.WithTimeout(ctx, c.CallTimeout)
			// ctx's parent is canceled when the stream ends, which ends
			// ctx and its timer too; cancel is for vet.
			context.AfterFunc(ctx, cancel)
			return ctx, nil
		}),
	}
	if c.TLS.CertFile != "" {
		creds, err := credentials.NewServerTLSFromFile(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("grpc tls: %w", err)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	// grpc-go refuses a message over its receive limit with
	// RESOURCE_EXHAUSTED before any handler runs, which Envoy lets
	// through; so the transport takes up to MaxReceiveBytes and this
	// handler decides one over MaxMessageBytes, without decoding it.
	desc := rlsv3.RateLimitService_ServiceDesc
	desc.Methods = []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: s.handle}}
	srv.RegisterService(&desc, s)
	healthpb.RegisterHealthServer(srv, s.health)
	reflection.Register(srv)
	return srv, nil
}

// Listener caps ln at MaxConnections open connections: one accepted over
// the cap is closed at once, before a byte of it is read, and counted.
// Serve the Server through it: srv.Serve(s.Listener(ln)).
func (s *Service) Listener(ln net.Listener) net.Listener {
	return &capListener{Listener: ln, max: int64(s.boot.MaxConnections), refused: s.refused}
}

type capListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused prometheus.Counter
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Inc()
			_ = c.Close()
			continue
		}
		return &capConn{Conn: c, l: l}, nil
	}
}

// capConn hands its slot back when closed, once however often Close is
// called.
type capConn struct {
	net.Conn
	l      *capListener
	closed atomic.Bool
}

func (c *capConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// streamWorkers is how many goroutines serve calls: about the calls a
// busy door has waiting on Redis at once.
const streamWorkers = 128
