package gateway

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// seen is what the test upstream reports about a request it received.
type seen struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	XFF    string `json:"xff"`
	User   string `json:"user"`
	Body   int    `json:"body"`
}

// newTestUpstream is a real HTTP service: it reads the whole body and
// answers with what it saw; /hang waits until the caller gives up.
func newTestUpstream(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hang") {
			<-r.Context().Done()
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		// An upstream that sets its own rate-limit headers must not leak them.
		w.Header().Set("X-RateLimit-Limit", "999999")
		_ = json.NewEncoder(w).Encode(seen{Method: r.Method, Path: r.URL.Path, XFF: r.Header.Get("X-Forwarded-For"), User: r.Header.Get("X-User-ID"), Body: int(n)})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// testConfig limits anonymous callers to 5 per minute and proxies
// everything to upstreamURL.
func testConfig(upstreamURL string) Config {
	return Config{
		Plans: map[string]Plan{
			"free": {Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 5, Period: time.Minute}}}},
		},
		AnonymousPlan: "free",
		Upstreams:     map[string]Upstream{"app": {URL: upstreamURL}},
		Routes:        []Route{{Name: "all", PathPrefix: "/", Upstream: "app"}},
		AdminListen:   "127.0.0.1:0",
		Listen:        "127.0.0.1:0",
		// Generous: under -race on two busy cores a 25ms store call can
		// miss and fail open, and most tests read the store's answers.
		// Tests of the deadline set their own.
		StoreDeadline: time.Second,
	}
}

type testGateway struct {
	*Gateway
	URL string
	reg *prometheus.Registry
}

// startGateway runs g's traffic server on a loopback port until the test ends.
func startGateway(t testing.TB, cfg Config, opts Options) *testGateway {
	t.Helper()
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	}
	g, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := g.Server()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(g.Listener(ln)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		g.Close()
	})
	return &testGateway{Gateway: g, URL: "http://" + ln.Addr().String(), reg: opts.Registry}
}

// redisGateway starts a gateway on a limiter of its own on the shared
// test Redis, with testConfig to a newTestUpstream changed by edit.
func redisGateway(t testing.TB, edit func(*Config)) *testGateway {
	t.Helper()
	lim, _ := redisStore(t)
	cfg := testConfig(newTestUpstream(t).URL)
	edit(&cfg)
	return startGateway(t, cfg, Options{Store: lim})
}

// redisStore returns a limiter on the shared test Redis, its keys under a
// prefix of its own so concurrent tests never share buckets.
func redisStore(t testing.TB) (*limiter.Redis, *redis.Client) {
	t.Helper()
	rdb := newRedisClient(testenv.RedisAddr(t))
	return storeOn(t, rdb, "gwtest"+randHex(6)), rdb
}

// storeOn is a limiter on rdb with its keys under prefix; rdb is closed
// when the test ends.
func storeOn(t testing.TB, rdb redis.UniversalClient, prefix string) *limiter.Redis {
	t.Helper()
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// clusterStore returns a limiter on the shared test Redis Cluster, its
// keys under a prefix of its own.
func clusterStore(t testing.TB) *limiter.Redis {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t), ContextTimeoutEnabled: true})
	return storeOn(t, rdb, "gwcluster"+randHex(6))
}

// newRedisClient is a client of the Redis at addr with go-redis's default
// timeouts: ContextTimeoutEnabled makes the gateway's store deadline bound
// the wait, not the client's.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sha(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// client never reuses a connection across tests and never follows redirects.
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r reply) retryAfter(t testing.TB) int64 {
	t.Helper()
	n, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
	if err != nil {
		t.Fatalf("Retry-After %q: %v", r.header.Get("Retry-After"), err)
	}
	return n
}

// do sends one request; hdr holds header name/value pairs.
func do(t testing.TB, method, url string, body io.Reader, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func get(t testing.TB, url string, hdr ...string) reply {
	t.Helper()
	return do(t, http.MethodGet, url, nil, hdr...)
}

// rawConn opens a connection to the gateway at gwURL, closed when the
// test ends, and writes req on it as it stands: the bytes no client
// library would send. Reads from the returned reader fail after 10s.
func rawConn(t testing.TB, gwURL, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// rawDo writes req (a request line and headers, "\r\n" separated) on a
// new connection and reads the response: nothing on the way rewrites
// the path.
func rawDo(t testing.TB, gwURL, req string) reply {
	t.Helper()
	_, br := rawConn(t, gwURL, req)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", req, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// admitted sends n GETs to url and counts those admitted; any answer but
// 200 or 429 fails the test.
func admitted(t testing.TB, url string, n int, hdr ...string) int {
	t.Helper()
	ok := 0
	for range n {
		r := get(t, url, hdr...)
		if r.status == http.StatusOK {
			ok++
		} else if r.status != http.StatusTooManyRequests {
			t.Fatalf("GET %s = %d %s, want 200 or 429", url, r.status, r.body)
		}
	}
	return ok
}

// scrape reads gw's metrics as a scraper does: GET /metrics on boot.Admin.
func scrape(t testing.TB, gw *testGateway) string {
	t.Helper()
	rec := httptest.NewRecorder()
	boot.Admin{Registry: gw.reg}.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	return rec.Body.String()
}

// counter reads one counter series from g's registry.
func counter(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// directiveRig is a directive store and its watcher on the shared test
// Redis, under a prefix of its own; its limiters share that prefix, so
// gateways started on it share buckets as a fleet does.
type directiveRig struct {
	rdb     *redis.Client
	prefix  string
	store   *limiter.DirectiveStore
	watcher *limiter.Watcher // refreshed by hand: its interval is an hour
}

func newDirectiveRig(t testing.TB) directiveRig {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "dirtest" + randHex(6)
	store := limiter.NewDirectiveStore(rdb, prefix)
	return directiveRig{rdb: rdb, prefix: prefix, store: store, watcher: limiter.NewWatcher(store, time.Hour)}
}

// start runs a gateway with cfg whose store and directives are the rig's.
func (d directiveRig) start(t testing.TB, cfg Config) *testGateway {
	t.Helper()
	return startGateway(t, cfg, Options{Store: d.newStore(t), Directives: d.watcher})
}

// newStore is a limiter on the rig's Redis under the rig's prefix.
func (d directiveRig) newStore(t testing.TB) *limiter.Redis {
	t.Helper()
	lim, err := limiter.New(d.rdb, limiter.Config{Prefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
