package edgelimit_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestUsageEqualsTheLimitersCount: two gateways on one Redis publish
// through a real Kafka broker to the consumer and a real ClickHouse;
// three API keys spend a daily calendar quota on routes of cost 1 and 5
// until it refuses them. For each key the usage statement of the quota's
// window says requests = allowed + denied = what its client saw, and its
// allowed cost is the limiter's own count in the window, to the unit.
func TestUsageEqualsTheLimitersCount(t *testing.T) {
	p := newPipelineRig(t, "usage")
	ctx := p.ctx
	prefix := "usage" + p.suffix

	// A day that starts twelve hours from now: the test never waits for,
	// nor meets, the window's end.
	day := limiter.MustCalendar(limiter.Day, "UTC", time.Now().UTC().Add(12*time.Hour).Format("15:04"))
	rules := []limiter.Rule{{Name: "minute", Limit: 10000, Period: time.Minute}, {Name: "day", Limit: 60, Calendar: day}}
	keys := []string{"acme", "globex", "initech"}
	var pubs []*publish.Publisher
	var addrs []string
	for _, id := range []string{"gw-a", "gw-b"} {
		pub := p.publisher(t)
		lim, err := limiter.New(p.rdb, limiter.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		cfg := proxyConfig(t, id)
		cfg.KeyHashSecret = "usage-secret"
		cfg.StoreDeadline = time.Second // -race on two cores: keep every answer the store's
		cfg.Routes = append([]gateway.Route{{Name: "dear", PathPrefix: "/dear", Upstream: "app", Cost: 5}}, cfg.Routes...)
		var gr []gateway.Rule
		for _, r := range rules {
			gr = append(gr, gateway.Rule{Rule: r})
		}
		cfg.Plans = map[string]gateway.Plan{"pro": {Rules: gr}}
		for _, k := range keys {
			cfg.APIKeys = append(cfg.APIKeys, gateway.APIKey{ID: k, SHA256: sha256Hex(k + "-key"), Plan: "pro"})
		}
		gw, err := gateway.New(cfg, gateway.Options{Store: lim, Publisher: pub, Logger: p.log})
		if err != nil {
			t.Fatal(err)
		}
		pubs, addrs = append(pubs, pub), append(addrs, serveOn(t, gw.Server()))
	}
	p.runConsumer(t)

	type seen struct{ requests, allowed, denied int64 }
	clients := map[string]*seen{}
	for i, k := range keys {
		clients[k] = &seen{}
		// Each key its own mix: 60 units of quota, 30 to 45 requests.
		for j := range 30 + 5*i {
			path := "/cheap"
			if (j+i)%3 == 0 {
				path = "/dear"
			}
			req, _ := http.NewRequest(http.MethodGet, "http://"+addrs[j%2]+path, nil)
			req.Header.Set("X-API-Key", k+"-key")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			c := clients[k]
			c.requests++
			switch resp.StatusCode {
			case http.StatusOK:
				c.allowed++
			case http.StatusTooManyRequests:
				c.denied++
			default:
				t.Fatalf("%s %s: status %d", k, path, resp.StatusCode)
			}
		}
		if clients[k].denied == 0 {
			t.Fatalf("%s was never refused: the quota did not bite", k)
		}
	}
	for _, pub := range pubs {
		fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
		if err := pub.Close(fctx); err != nil {
			t.Fatalf("flush events: %v", err)
		}
		fcancel()
	}

	lim, err := limiter.New(p.rdb, limiter.Config{Prefix: prefix, DenyCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	r := analytics.NewReader(p.ch)
	for _, k := range keys {
		ks, err := lim.Inspect(ctx, limiter.APIKeyKey(k), rules)
		if err != nil {
			t.Fatal(err)
		}
		start, _ := day.Bounds(ks.Time)
		var st analytics.UsageStatement
		testenv.WaitFor(t, 60*time.Second, k+"'s decisions committed", func() bool {
			st, err = r.Usage(ctx, analytics.UsageQuery{From: start, To: ks.Time.Add(time.Minute), Keys: []string{k}, By: []string{analytics.UsageByKey}})
			if errors.Is(err, analytics.ErrBadQuery) {
				return false // no decision of the key committed yet
			}
			if err != nil {
				t.Fatal(err)
			}
			return st.Total.Requests >= clients[k].requests
		})
		c, got, count := clients[k], st.Total, ks.Rules[1].Count
		if got.Requests != c.requests || got.Allowed != c.allowed || got.Denied != c.denied || got.Requests != got.Allowed+got.Denied {
			t.Errorf("%s: statement %d = %d allowed + %d denied; the client saw %d = %d + %d", k, got.Requests, got.Allowed, got.Denied, c.requests, c.allowed, c.denied)
		}
		if got.AllowedCost != count || count == 0 {
			t.Errorf("%s: the statement's allowed cost %d, the limiter's count in the window %d: want them equal", k, got.AllowedCost, count)
		}
	}
	p.stopConsumer(t)
}
