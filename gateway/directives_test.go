package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestDirectivesApplied: a split directive makes each gateway check a hot
// key against its own share, in a bucket of its own; removing it returns
// the key to the shared bucket. A NAT directive raises an IP's limit.
func TestDirectivesApplied(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "dirtest" + randHex(6)
	up := newTestUpstream(t)
	const secret = "directive-test-secret"
	dstore := limiter.NewDirectiveStore(rdb, prefix)
	watcher := limiter.NewWatcher(dstore, time.Hour) // refreshed by hand below

	start := func(id string) *testGateway {
		cfg := testConfig(up.URL)
		cfg.GatewayID = id
		cfg.KeyHashSecret = secret
		cfg.Plans["paid"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "hour", Limit: 20, Period: time.Hour}}}}
		cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("acme-raw-key"), Plan: "paid"}}
		lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return startGateway(t, cfg, Options{Store: lim, Directives: watcher})
	}
	a, b := start("gw-a"), start("gw-b")

	// The directive key: "<kind>:<key id>", the key id being the events'
	// HMAC of the limiter key.
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("k:acme"))
	keyID := hex.EncodeToString(mac.Sum(nil)[:16])
	exp := time.Now().Add(time.Minute)
	if err := dstore.WriteSplits(ctx, []limiter.SplitDirective{{Key: "api_key:" + keyID, Shares: map[string]float64{"gw-a": 0.75, "gw-b": 0.25}, Expires: exp}}); err != nil {
		t.Fatal(err)
	}
	if err := dstore.WriteNATs(ctx, []limiter.NATDirective{{Key: "ip:127.0.0.1", Factor: 3, Clients: 6, Expires: exp}}); err != nil {
		t.Fatal(err)
	}
	watcher.Refresh(ctx)

	allowed := func(g *testGateway, n int, hdr ...string) int {
		ok := 0
		for range n {
			r := get(t, g.URL+"/x", hdr...)
			if r.status == http.StatusOK {
				ok++
			} else if r.status != http.StatusTooManyRequests {
				t.Fatalf("GET = %d, want 200 or 429", r.status)
			}
		}
		return ok
	}
	key := []string{"X-API-Key", "acme-raw-key"}
	if got := allowed(a, 20, key...); got != 15 {
		t.Errorf("gw-a with a 0.75 split admitted %d of 20, want 15", got)
	}
	if got := allowed(b, 20, key...); got != 5 {
		t.Errorf("gw-b with a 0.25 split admitted %d of 20, want 5", got)
	}
	// Anonymous: 5/min raised threefold for 127.0.0.1 by the NAT directive.
	if got := allowed(a, 20); got != 15 {
		t.Errorf("NAT-raised IP admitted %d of 20, want 15", got)
	}
	if n := counter(t, a.directivesApplied.WithLabelValues("split")); n != 20 {
		t.Errorf("directives_applied_total{kind=split} = %v, want 20", n)
	}

	// The split lifted: the shared bucket, untouched so far, serves again.
	if err := dstore.WriteSplits(ctx, nil); err != nil {
		t.Fatal(err)
	}
	watcher.Refresh(ctx)
	if got := allowed(a, 25, key...); got != 20 {
		t.Errorf("after the split was removed, gw-a admitted %d of 25, want the shared 20", got)
	}
}
