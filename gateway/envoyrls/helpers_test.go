package envoyrls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// rls is a started gateway with its gRPC service on loopback and a real
// client of it.
type rls struct {
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	svc    *Service
	gw     *gateway.Gateway
	reg    *prometheus.Registry
	events *events
	dir    string
}

type events struct {
	mu  sync.Mutex
	all []event.Decision
	// discard keeps no events, for benchmarks: they would grow without
	// bound over b.N calls.
	discard bool
}

func (e *events) Publish(d event.Decision) {
	if e.discard {
		return
	}
	e.mu.Lock()
	e.all = append(e.all, d)
	e.mu.Unlock()
}

func (e *events) list() []event.Decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]event.Decision(nil), e.all...)
}

// gatewayConfig is the least gateway configuration: the gRPC door uses
// only its store settings and defaults.
func gatewayConfig() gateway.Config {
	return gateway.Config{
		Plans:     map[string]gateway.Plan{"free": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "minute", Limit: 5, Period: time.Minute}}}}},
		Upstreams: map[string]gateway.Upstream{"app": {URL: "http://127.0.0.1:1"}},
		Routes:    []gateway.Route{{Name: "all", PathPrefix: "/", Upstream: "app"}},
		// Generous: under -race on two busy cores a 25ms store call can
		// miss and fail open; the failure tests stop Redis instead.
		StoreDeadline: time.Second,
		KeyHashSecret: "test-secret",
	}
}

// redisStore is a limiter on addr, its keys under a prefix of its own.
func redisStore(t testing.TB, addr string) *limiter.Redis {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, limiter.Config{Prefix: "rlstest" + randHex(6)})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startRLS writes files into a config dir and serves them on the shared
// test Redis (or redisAddr when given).
func startRLS(t testing.TB, files map[string]string, cfg Config, gcfg gateway.Config, redisAddr string) *rls {
	t.Helper()
	if redisAddr == "" {
		redisAddr = testenv.RedisAddr(t)
	}
	var store *limiter.Redis
	if redisAddr != "memory" { // "memory": the gateway's in-memory store
		store = redisStore(t, redisAddr)
	}
	return startRLSOn(t, files, cfg, gcfg, store)
}

// startRLSOn is startRLS on store (nil: the gateway's in-memory store).
func startRLSOn(t testing.TB, files map[string]string, cfg Config, gcfg gateway.Config, store *limiter.Redis) *rls {
	t.Helper()
	return startRLSWith(t, files, cfg, gcfg, gatewayOptions(store))
}

// startRLSWith is startRLS with the gateway's options (its publisher is
// the test's).
func startRLSWith(t testing.TB, files map[string]string, cfg Config, gcfg gateway.Config, opts gateway.Options) *rls {
	t.Helper()
	_, bench := t.(*testing.B)
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ev := &events{discard: bench}
	opts.Publisher = ev
	gw, err := gateway.New(gcfg, opts)
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	cfg.Listen, cfg.ConfigDir = "127.0.0.1:0", dir
	svc, err := New(cfg, gw, Options{Registry: opts.Registry, Logger: opts.Logger})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	addr := serve(t, svc)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &rls{client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, svc: svc, gw: gw, reg: opts.Registry, events: ev, dir: dir}
}

// gatewayOptions are a test gateway's options on store (nil: the
// gateway's in-memory store): a registry of its own, so that tests do
// not share counters, and a logger that writes nowhere.
func gatewayOptions(store *limiter.Redis) gateway.Options {
	opts := gateway.Options{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	if store != nil { // a nil *limiter.Redis in the interface is not "no store"
		opts.Store = store
	}
	return opts
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// ask sends one ShouldRateLimit request and fails the test on an error.
func (r *rls) ask(t testing.TB, domain string, hits uint32, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := r.try(domain, hits, ds...)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s, %v): %v", domain, ds, err)
	}
	if len(resp.GetStatuses()) != len(ds) {
		t.Fatalf("ShouldRateLimit(%s): %d statuses for %d descriptors", domain, len(resp.GetStatuses()), len(ds))
	}
	return resp
}

func (r *rls) try(domain string, hits uint32, ds ...*commonv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
}

// header returns the value of the response header name, "" if absent.
func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == name {
			return h.GetValue()
		}
	}
	return ""
}

func wrap(n uint64) *wrapperspb.UInt64Value { return wrapperspb.UInt64(n) }

func writeFile(t testing.TB, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func descs(ds ...*commonv3.RateLimitDescriptor) []*commonv3.RateLimitDescriptor { return ds }

// serve runs svc's gRPC server on a loopback port until the test ends and
// returns its address.
func serve(t testing.TB, svc *Service) string {
	t.Helper()
	srv, err := svc.Server()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(svc.Listener(ln)) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}
