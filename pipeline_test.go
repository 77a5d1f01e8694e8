package edgelimit_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestRequestsBecomeRows: N requests through a started gateway on real
// Redis become exactly N rows in a real ClickHouse, through a real Kafka
// broker and the consumer, and the rollups agree with the raw table and
// with what the clients saw.
func TestRequestsBecomeRows(t *testing.T) {
	p := newPipelineRig(t, "pipeline")
	ctx, log, ch := p.ctx, p.log, p.ch
	pub := p.publisher(t, publish.Config{GatewayID: "pipeline-gw"})
	lim, err := limiter.New(p.rdb, limiter.Config{Prefix: "pipe" + p.suffix})
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxyConfig(t, "pipeline-gw")
	cfg.KeyHashSecret = "pipeline-secret"
	cfg.StoreDeadline = time.Second // -race on two cores: keep every answer the store's
	cfg.Plans = map[string]gateway.Plan{
		"anon": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "hour", Limit: 60, Period: time.Hour}}}},
		"paid": {Rules: []gateway.Rule{{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute, Burst: 20}}, {Rule: limiter.Rule{Name: "day", Limit: 1000, Period: 24 * time.Hour}}}},
	}
	cfg.AnonymousPlan = "anon"
	cfg.APIKeys = []gateway.APIKey{{ID: "acme", SHA256: sha256Hex("acme-key"), Plan: "paid"}}
	gw, err := gateway.New(cfg, gateway.Options{Store: lim, Publisher: pub, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, gw.Server())

	p.runConsumer(t)

	const n = 400
	allowed := 0
	for i := range n {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/item", nil)
		if i%2 == 0 {
			req.Header.Set("X-API-Key", "acme-key")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	if allowed == 0 || allowed == n {
		t.Fatalf("allowed %d of %d: the limits did not bite", allowed, n)
	}
	flushCtx, flushCancel := context.WithTimeout(ctx, 30*time.Second)
	defer flushCancel()
	if err := pub.Close(flushCtx); err != nil {
		t.Fatalf("flush events: %v", err)
	}

	// An INSERT makes its raw rows visible before its materialized views
	// have written the rollups, so wait for all of them, then compare.
	var rows, uniq, rawAllowed, keyReq, keyAllowed, gwReq, ipReq uint64
	read := func() {
		t.Helper()
		for _, q := range []struct {
			sql  string
			dest []any
		}{
			{"SELECT count(), uniqExact(event_id), sum(allowed) FROM decisions", []any{&rows, &uniq, &rawAllowed}},
			{"SELECT sum(requests), sum(allowed_requests) FROM decisions_by_key_1m", []any{&keyReq, &keyAllowed}},
			{"SELECT countMerge(requests) FROM decisions_by_gateway_1m WHERE gateway_id = 'pipeline-gw'", []any{&gwReq}},
			{"SELECT countMerge(requests) FROM decisions_by_ip_1m", []any{&ipReq}},
		} {
			if err := ch.QueryRow(ctx, q.sql).Scan(q.dest...); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.WaitFor(t, 60*time.Second, "every row and rollup in ClickHouse", func() bool {
		read()
		return rows >= n && keyReq >= n && gwReq >= n && ipReq >= n
	})
	if rows != n || uniq != n || rawAllowed != uint64(allowed) {
		t.Fatalf("ClickHouse has %d rows, %d unique events, %d allowed; want %d, %d, %d", rows, uniq, rawAllowed, n, n, allowed)
	}
	if keyReq != n || keyAllowed != uint64(allowed) || gwReq != n || ipReq != n {
		t.Errorf("rollups: by key %d requests (%d allowed), by gateway %d, by IP %d; want %d (%d allowed) each", keyReq, keyAllowed, gwReq, ipReq, n, allowed)
	}
	// The API key's name, its configured id, reached analytics; the
	// anonymous half has none. Analytics reads committed batches only,
	// and raw rows and rollups are visible before their batch commits:
	// wait for the key's requests to be read.
	var rep analytics.KeyReport
	testenv.WaitFor(t, 60*time.Second, "the api key's requests committed", func() bool {
		var err error
		rep, err = analytics.NewReader(ch).KeyReport(ctx, analytics.Range{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Minute)}, "acme", "auto", "")
		if err != nil {
			t.Fatal(err)
		}
		return rep.Total.Requests >= n/2
	})
	if len(rep.Keys) != 1 || rep.Keys[0].KeyKind != "api_key" || rep.Keys[0].KeyName != "acme" || rep.Total.Requests != n/2 || rep.Total.RateLimited == 0 {
		t.Errorf("key page of acme = %+v, %+v; want the api key's %d requests, some rate-limited", rep.Keys, rep.Total, n/2)
	}
	var named uint64
	if err := ch.QueryRow(ctx, "SELECT count() FROM decisions WHERE key_name != ''").Scan(&named); err != nil || named != n/2 {
		t.Errorf("%d rows have a key name (%v), want the %d of acme", named, err, n/2)
	}
	p.stopConsumer(t)
}

// pipelineRig is the real pipeline's fixed parts for one test: a topic of
// its own (with its dead-letter topic) on the real broker, a migrated
// ClickHouse database, the real Redis, and the consumer between them.
type pipelineRig struct {
	ctx           context.Context
	cancel        context.CancelFunc
	log           *slog.Logger
	brokers       []string
	suffix, topic string
	ch            driver.Conn
	rdb           *redis.Client
	consDone      chan error
}

func newPipelineRig(t *testing.T, name string) *pipelineRig {
	t.Helper()
	return newPipelineRigOn(t, name, testenv.KafkaBrokers(t))
}

// newPipelineRigOn is newPipelineRig on the Kafka of brokers.
func newPipelineRigOn(t *testing.T, name string, brokers []string) *pipelineRig {
	t.Helper()
	p := &pipelineRig{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), brokers: brokers}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	t.Cleanup(p.cancel)
	p.suffix = fmt.Sprintf("%d_%d", time.Now().UnixNano(), rand.IntN(1000))
	p.topic = name + "-" + p.suffix
	p.ch, _ = testenv.NewDatabase(t, testenv.ClickHouseAddr(t), "edgelimit_"+name)
	if err := consumer.Migrate(p.ctx, p.ch, consumer.Retention{}); err != nil {
		t.Fatal(err)
	}
	// Topics belong to whoever runs Kafka; the gateway does not create them.
	testenv.CreateTopics(t, p.brokers, 4, p.topic, p.topic+"-dlq")
	p.rdb = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { p.rdb.Close() })
	return p
}

// publisher is a gateway's publisher to the rig's topic, cfg's other
// fields as given.
func (p *pipelineRig) publisher(t *testing.T, cfg publish.Config) *publish.Publisher {
	t.Helper()
	cfg.Brokers, cfg.Topic, cfg.Linger = p.brokers, p.topic, 5*time.Millisecond
	pub, err := publish.New(cfg, prometheus.NewRegistry(), p.log)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// runConsumer starts the consumer of the rig's topic into its database.
func (p *pipelineRig) runConsumer(t *testing.T) {
	t.Helper()
	cons, err := consumer.New(consumer.Config{Brokers: p.brokers, Topic: p.topic, Group: p.topic, DeadLetterTopic: p.topic + "-dlq", BatchWait: 200 * time.Millisecond},
		p.ch, prometheus.NewRegistry(), p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.consDone = make(chan error, 1)
	go func() { p.consDone <- cons.Run(p.ctx) }()
}

// stopConsumer stops the consumer and waits for it.
func (p *pipelineRig) stopConsumer(t *testing.T) {
	t.Helper()
	p.cancel()
	if err := <-p.consDone; err != nil && p.ctx.Err() == nil {
		t.Errorf("consumer: %v", err)
	}
}
