package analytics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// fleetSecret is the key hash secret of every gateway of a pipelineFleet.
const fleetSecret = "pipeline-test-secret"

// pipelineFleet is the real pipeline the end-to-end tests drive: gateways
// sharing a real Redis and publishing to a topic of their own on a real
// Kafka broker, the consumer writing to a real ClickHouse, and each
// gateway's directive watcher refreshing every second. It stops when the
// test ends.
type pipelineFleet struct {
	ctx        context.Context
	conn       driver.Conn
	store      *limiter.DirectiveStore
	watchers   map[string]*limiter.Watcher     // gateway id → its watcher
	urls       map[string]string               // gateway id → traffic URL
	registries map[string]*prometheus.Registry // gateway id → its metrics
	raw        map[string]string               // key id → raw key
	client     *http.Client
	answered   atomic.Int64 // requests answered: each one decision
}

// startFleet starts the pipeline with gateways gwIDs, plans, and an API key
// for each of keys (key id → plan).
func startFleet(t *testing.T, gwIDs []string, plans map[string]gateway.Plan, keys map[string]string) *pipelineFleet {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	conn := mustDatabase(t)
	rdb, prefix := mustRedis(t)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() }) // runs last: after the gateways closed
	quiet := slog.New(slog.DiscardHandler)

	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	topic, dead := "analytics-decisions-"+suffix, "analytics-dead-"+suffix
	testenv.CreateTopics(t, brokers, 2, topic, dead)

	// Small batches for a quick test.
	cons, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, DeadLetterTopic: dead, Group: "analytics-" + suffix,
		BatchWait: 200 * time.Millisecond,
	}, conn, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); cons.Run(ctx) }()

	f := &pipelineFleet{
		ctx: ctx, conn: conn, store: limiter.NewDirectiveStore(rdb, prefix),
		watchers: map[string]*limiter.Watcher{}, urls: map[string]string{}, registries: map[string]*prometheus.Registry{},
		raw: map[string]string{}, client: &http.Client{Timeout: 5 * time.Second},
	}
	var apiKeys []gateway.APIKey
	for id, plan := range keys {
		r := "raw-" + id + "-" + suffix
		apiKeys = append(apiKeys, apiKey(id, r, plan))
		f.raw[id] = r
	}
	for _, id := range gwIDs {
		w := limiter.NewWatcher(f.store, time.Second)
		f.watchers[id] = w
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(ctx) }()
		f.registries[id] = prometheus.NewRegistry()
		lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := publish.New(publish.Config{Brokers: brokers, Topic: topic, Linger: 10 * time.Millisecond}, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close(context.Background()) })
		f.urls[id] = serveGateway(t, gateway.Config{
			GatewayID:      id,
			Plans:          plans,
			APIKeys:        apiKeys,
			TrustedProxies: []string{"127.0.0.1"},
			KeyHashSecret:  fleetSecret,
			StoreDeadline:  time.Second,
			AnonymousPlan:  anonymousPlan(plans),
		}, gateway.Options{Store: lim, Publisher: pub, Logger: quiet, Directives: w, Registry: f.registries[id]})
	}
	return f
}

// anonymousPlan is "anonymous" when plans has it: requests without a key
// are then limited by their address under it.
func anonymousPlan(plans map[string]gateway.Plan) string {
	if _, ok := plans["anonymous"]; ok {
		return "anonymous"
	}
	return ""
}

// send makes one request as key ("": none) from ip with user agent ua
// through gateway gw and returns its status, 0 when it failed (an error,
// unless the fleet is stopping).
func (f *pipelineFleet) send(t *testing.T, gw, key, ip, ua string) int {
	req, _ := http.NewRequestWithContext(f.ctx, http.MethodGet, f.urls[gw]+"/v1/items", nil)
	if key != "" {
		req.Header.Set("X-API-Key", f.raw[key])
	}
	req.Header.Set("X-Forwarded-For", ip)
	req.Header.Set("User-Agent", ua)
	resp, err := f.client.Do(req)
	if err != nil {
		if f.ctx.Err() == nil {
			t.Errorf("request: %v", err)
		}
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.answered.Add(1)
	return resp.StatusCode
}

// paced sends as key through gw at rate per second from start until ctx
// ends, each request on its own goroutine so that a slow answer under
// -race does not thin the load, and calls answer with each request's send
// time and status. wg counts the goroutines.
func (f *pipelineFleet) paced(ctx context.Context, t *testing.T, wg *sync.WaitGroup, start time.Time, gw, key string, rate float64, answer func(at time.Time, status int)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		every := time.Duration(float64(time.Second) / rate)
		for i := 0; ctx.Err() == nil; i++ {
			time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent := time.Now()
				answer(sent, f.send(t, gw, key, "10.9.9.9", "loadgen"))
			}()
		}
	}()
}

// detect runs the detector on the fleet's ClickHouse every second until ctx
// ends (wg counts it), writing the fleet's directives. A 20s window (10s at
// least) lets a key turn hot, and cool, within a test; nat is the NAT
// detector's settings.
func (f *pipelineFleet) detect(ctx context.Context, t *testing.T, wg *sync.WaitGroup, nat analytics.NATConfig) *analytics.Detector {
	t.Helper()
	det, err := analytics.NewDetector(analytics.Config{
		Interval: time.Second,
		Hot:      analytics.HotConfig{Window: 20 * time.Second, MinSpan: 10 * time.Second, MinRate: 8, MinShare: -1},
		NAT:      nat,
	}, analytics.Deps{Reader: analytics.NewReader(f.conn), Directives: f.store, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); det.Run(ctx) }()
	return det
}

// waitSplit waits until every gateway's watcher holds key's split.
func (f *pipelineFleet) waitSplit(t *testing.T, key string) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, "every gateway's watcher to load the split of "+key, func() bool {
		for _, w := range f.watchers {
			if _, ok := w.Current().Splits[key]; !ok {
				return false
			}
		}
		return true
	})
}

// answer is one paced request: when it left, through which gateway, and
// its status.
type answer struct {
	at     time.Time
	gw     string
	status int
}

// answers collects the answers of paced load.
type answers struct {
	mu  sync.Mutex
	all []answer
}

// record returns paced's callback for gw. A status other than 200 or 429
// fails the test.
func (as *answers) record(t *testing.T, gw string) func(time.Time, int) {
	return func(at time.Time, status int) {
		if status != 0 && status != http.StatusOK && status != http.StatusTooManyRequests {
			t.Errorf("request on %s: %d", gw, status)
		}
		as.mu.Lock()
		as.all = append(as.all, answer{at, gw, status})
		as.mu.Unlock()
	}
}

// count returns, per gateway, the requests sent in [from, to) and how many
// of them were admitted.
func (as *answers) count(from, to time.Time) (sent, admitted map[string]int) {
	as.mu.Lock()
	defer as.mu.Unlock()
	sent, admitted = map[string]int{}, map[string]int{}
	for _, a := range as.all {
		if !a.at.Before(from) && a.at.Before(to) {
			sent[a.gw]++
			if a.status == http.StatusOK {
				admitted[a.gw]++
			}
		}
	}
	return sent, admitted
}
