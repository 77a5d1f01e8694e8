package analytics_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// eventKeyID is the event key id the gateways give a limiter key: the hex
// of the first 16 bytes of HMAC-SHA256(key hash secret, key), as
// gateway/events.go computes it. The test needs it to name the truth.
func eventKeyID(secret, key string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// TestPipelineDetection sends synthetic traffic through the real pipeline
// — three gateways on a shared Redis, publishing to a real Kafka broker,
// the consumer writing to a real ClickHouse — with a planted hot key (3:1
// across two gateways) and planted NAT addresses among ordinary clients.
// The detector, running on its schedule, must flag exactly those (it
// reports precision and recall), and every gateway's directive watcher
// must load the split; it reports how long that took from the key turning
// hot.
func TestPipelineDetection(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	conn := mustDatabase(t)
	rdb, prefix := mustRedis(t)
	t.Parallel()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	quiet := slog.New(slog.DiscardHandler)

	// Topics of the test's own.
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	topic, dead := "analytics-decisions-"+suffix, "analytics-dead-"+suffix
	kcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := kadm.NewClient(kcl).CreateTopics(ctx, 2, 1, nil, topic, dead)
	kcl.Close()
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}

	// The consumer: Kafka → ClickHouse, small batches for a quick test.
	cons, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, DeadLetterTopic: dead, Group: "analytics-" + suffix,
		BatchWait: 200 * time.Millisecond,
	}, conn, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Add(1)
	go func() { defer wg.Done(); cons.Run(ctx) }()

	// Three gateways sharing Redis and a key hash secret, publishing to Kafka.
	const secret = "pipeline-test-secret"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	var keys []gateway.APIKey
	raw := map[string]string{} // key id → raw key
	addKey := func(id string) {
		r := "raw-" + id + "-" + suffix
		sum := sha256.Sum256([]byte(r))
		keys = append(keys, gateway.APIKey{ID: id, SHA256: hex.EncodeToString(sum[:]), Plan: "free"})
		raw[id] = r
	}
	for i := range 60 {
		addKey(fmt.Sprintf("ord-%d", i))
	}
	natIPs := []string{"198.51.100.7", "198.51.100.8", "203.0.113.9"}
	for j := range natIPs {
		for c := range 12 {
			addKey(fmt.Sprintf("nat-%d-%d", j, c))
		}
	}
	addKey("hot")
	gateways := map[string]string{} // id → traffic URL
	for _, id := range []string{"gw-a", "gw-b", "gw-c"} {
		lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := publish.New(publish.Config{Brokers: brokers, Topic: topic, Linger: 10 * time.Millisecond}, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close(context.Background())
		gw, err := gateway.New(gateway.Config{
			GatewayID:      id,
			Plans:          map[string]gateway.Plan{"free": {Rules: []gateway.Rule{{Name: "minute", Limit: 100000, Period: time.Minute}}}},
			APIKeys:        keys,
			Upstreams:      map[string]gateway.Upstream{"app": {URL: up.URL}},
			Routes:         []gateway.Route{{Name: "api", PathPrefix: "/", Upstream: "app"}},
			TrustedProxies: []string{"127.0.0.1"},
			KeyHashSecret:  secret,
			StoreDeadline:  time.Second,
			Listen:         "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		}, gateway.Options{Store: lim, Publisher: pub, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer gw.Close()
		s := httptest.NewServer(gw.Handler())
		defer s.Close()
		gateways[id] = s.URL
	}
	client := &http.Client{Timeout: 5 * time.Second}
	send := func(gw, key, ip, ua string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gateways[gw]+"/v1/items", nil)
		req.Header.Set("X-API-Key", raw[key])
		req.Header.Set("X-Forwarded-For", ip)
		req.Header.Set("User-Agent", ua)
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("request: %v", err)
			}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request as %s on %s: %d", key, gw, resp.StatusCode)
		}
	}
	gwIDs := []string{"gw-a", "gw-b", "gw-c"}

	// Ordinary traffic and the NAT addresses first: 60 keys, each from an
	// address of its own (every third shared by two keys), 6 requests each;
	// 12 keys with their own user agents behind each NAT address.
	var load sync.WaitGroup
	for i := range 60 {
		load.Add(1)
		go func() {
			defer load.Done()
			for r := range 6 {
				send(gwIDs[(i+r)%3], fmt.Sprintf("ord-%d", i), fmt.Sprintf("10.1.0.%d", i-i%3/2), "app/"+fmt.Sprint(i))
			}
		}()
	}
	for j, ip := range natIPs {
		for c := range 12 {
			load.Add(1)
			go func() {
				defer load.Done()
				for r := range 8 {
					send(gwIDs[(c+r)%3], fmt.Sprintf("nat-%d-%d", j, c), ip, fmt.Sprintf("phone-%d-%d", j, c))
				}
			}()
		}
	}
	load.Wait()

	// The detector, on its schedule, and a directive watcher per gateway.
	store := limiter.NewDirectiveStore(rdb, prefix)
	det, err := analytics.NewDetector(analytics.Config{
		Interval: time.Second,
		Hot:      analytics.HotConfig{MinRate: 8, MinShare: -1},
		NAT:      analytics.NATConfig{MinDistinctKeys: 10, MinDistinctUserAgents: 10, MinRequests: 50},
	}, analytics.Deps{Reader: analytics.NewReader(conn), Directives: store, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); det.Run(ctx) }()
	watchers := map[string]*limiter.Watcher{}
	for _, id := range gwIDs {
		w := limiter.NewWatcher(store, time.Second)
		watchers[id] = w
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(ctx) }()
	}

	// The key turns hot: 3:1 across gw-a and gw-b, 40 requests a second.
	hotKey := analytics.DirectiveKey("api_key", eventKeyID(secret, "k:hot"))
	hotAt := time.Now()
	hotCtx, hotStop := context.WithCancel(ctx)
	defer hotStop()
	var hotWG sync.WaitGroup
	for g, every := range map[string]time.Duration{"gw-a": 33 * time.Millisecond, "gw-b": 100 * time.Millisecond} {
		hotWG.Add(1)
		go func() {
			defer hotWG.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-hotCtx.Done():
					return
				case <-tick.C:
					send(g, "hot", "10.9.9.9", "loadgen")
				}
			}
		}()
	}
	waitFor(t, 60*time.Second, "every gateway's watcher to load the hot key's split", func() bool {
		for _, w := range watchers {
			if _, ok := w.Current().Splits[hotKey]; !ok {
				return false
			}
		}
		return true
	})
	t.Logf("key turned hot → split loaded by all 3 gateways' watchers: %.1fs", time.Since(hotAt).Seconds())
	hotStop()
	hotWG.Wait()

	s := watchers["gw-a"].Current().Splits[hotKey]
	if a, b := s.Shares["gw-a"], s.Shares["gw-b"]; a < 0.6 || a > 0.9 || b < 0.1 || b > 0.4 {
		t.Errorf("split shares = %v, want about gw-a 0.75, gw-b 0.25 (observed 3:1)", s.Shares)
	}

	// Precision and recall over the whole run's findings.
	var wantNAT []string
	for _, ip := range natIPs {
		wantNAT = append(wantNAT, "ip:"+ip)
	}
	waitFor(t, 30*time.Second, "the NAT addresses to be flagged", func() bool {
		return len(det.Last().NATIPs) >= len(wantNAT)
	})
	rep := det.Last()
	var gotHot, gotNAT []string
	for _, h := range rep.HotKeys {
		gotHot = append(gotHot, analytics.DirectiveKey(h.KeyKind, h.KeyID))
	}
	for _, n := range rep.NATIPs {
		gotNAT = append(gotNAT, n.Key)
	}
	sort.Strings(gotNAT)
	p, r := precisionRecall(gotHot, []string{hotKey})
	t.Logf("pipeline hot keys: precision %.2f recall %.2f (%d flagged)", p, r, len(gotHot))
	if p < 1 || r < 1 {
		t.Errorf("hot keys = %v, want exactly [%s]", gotHot, hotKey)
	}
	p, r = precisionRecall(gotNAT, wantNAT)
	t.Logf("pipeline NAT IPs: precision %.2f recall %.2f (%v)", p, r, gotNAT)
	if p < 1 || r < 1 {
		t.Errorf("NAT IPs = %v, want exactly %v", gotNAT, wantNAT)
	}
	d := watchers["gw-c"].Current()
	for _, k := range wantNAT {
		if _, ok := d.NATs[k]; !ok {
			t.Errorf("gw-c's watcher lacks the NAT directive for %s (has %v)", k, slices.Sorted(maps.Keys(d.NATs)))
		}
	}
}
