package analytics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestUsageStatementCountsSettledTokens: through the real pipeline (a
// gateway on Redis publishing to Kafka, the consumer writing ClickHouse),
// a key's usage statement on a token route counts the tokens the upstream
// reported for its admitted requests, JSON and streamed answers alike,
// whatever each reserved; its denied requests' reservations are denied
// cost, never used.
func TestUsageStatementCountsSettledTokens(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	conn := mustDatabase(t)
	rdb, prefix := mustRedis(t)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	quiet := slog.New(slog.DiscardHandler)
	suffix := fmt.Sprint(time.Now().UnixNano())
	topic, dead := "tokens-"+suffix, "tokens-dead-"+suffix
	testenv.CreateTopics(t, brokers, 2, topic, dead)
	cons, err := consumer.New(consumer.Config{Brokers: brokers, Topic: topic, DeadLetterTopic: dead, Group: "tokens-" + suffix,
		BatchWait: 200 * time.Millisecond}, conn, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); cons.Run(ctx) }()

	// The upstream: an answer uses 10 + seed%max_tokens tokens, reported
	// in its usage object (JSON) or its last event (streamed).
	var reported atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int64 `json:"max_tokens"`
			Seed      int64 `json:"seed"`
			Stream    bool  `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		total := 10 + req.Seed%req.MaxTokens
		reported.Add(total)
		usage := fmt.Sprintf(`{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}`, total-10, total)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[{"message":{"content":"hi"}}],"usage":%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
	}))
	t.Cleanup(up.Close)

	lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(publish.Config{Brokers: brokers, Topic: topic, Linger: 10 * time.Millisecond}, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	raw := "raw-acme-" + suffix
	gw, err := gateway.New(gateway.Config{
		GatewayID: "gw-t",
		Plans: map[string]gateway.Plan{"llm": {Rules: []gateway.Rule{
			{Rule: limiter.Rule{Name: "requests", Limit: 1000, Period: time.Minute}},
			{Rule: limiter.Rule{Name: "tokens", Limit: 4000, Period: time.Hour}, Unit: plans.UnitTokens},
		}}},
		APIKeys:       []gateway.APIKey{apiKey("acme", raw, "llm")},
		KeyHashSecret: fleetSecret,
		StoreDeadline: time.Second,
		Upstreams:     map[string]gateway.Upstream{"llm": {URL: up.URL}},
		Routes: []gateway.Route{{Name: "chat", PathPrefix: "/v1/chat/completions", Upstream: "llm",
			Tokens: &plans.Tokens{Reserve: plans.Reserve{BodyField: "max_tokens", Max: 1000}}}},
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
	}, gateway.Options{Store: lim, Publisher: pub, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)

	began := time.Now().UTC()
	var admitted, denied atomic.Int64
	var sent sync.WaitGroup
	for c := range 8 {
		sent.Add(1)
		go func() {
			defer sent.Done()
			for i := range 6 {
				body := fmt.Sprintf(`{"max_tokens":%d,"seed":%d,"stream":%t}`, 100+100*(i%5), 37*c+i, (c+i)%2 == 0)
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("X-API-Key", raw)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		}()
	}
	sent.Wait()
	if admitted.Load() == 0 || denied.Load() == 0 {
		t.Fatalf("%d admitted, %d denied: the budget should admit some and deny others", admitted.Load(), denied.Load())
	}

	r := analytics.NewReader(conn)
	q := analytics.UsageQuery{From: began.Truncate(time.Minute), To: time.Now().UTC().Truncate(time.Minute).Add(2 * time.Minute), Keys: []string{"acme"}}
	var st analytics.UsageStatement
	testenv.WaitFor(t, 60*time.Second, "the statement to count every request", func() bool {
		// (an error until the key's first decision is stored)
		st, err = r.Usage(ctx, q)
		return err == nil && st.Total.Requests == admitted.Load()+denied.Load() && st.Total.AllowedCost == reported.Load()
	})
	t.Logf("%d admitted, %d denied; statement: %d tokens used, %d denied (reserved); the upstream reported %d",
		admitted.Load(), denied.Load(), st.Total.AllowedCost, st.Total.DeniedCost, reported.Load())
	if st.Total.Allowed != admitted.Load() || st.Total.Denied != denied.Load() {
		t.Errorf("statement %+v, want %d allowed and %d denied requests", st.Total, admitted.Load(), denied.Load())
	}
}
