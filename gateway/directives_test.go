package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// acmeSecret is the key hash secret of acmeConfig's gateways.
const acmeSecret = "directive-test-secret"

// acmeConfig is testConfig as gateway id of a fleet, with the API key
// "acme-raw-key" (ID acme) on a paid plan of 20 an hour.
func acmeConfig(upstreamURL, id string) Config {
	cfg := testConfig(upstreamURL)
	cfg.GatewayID = id
	cfg.KeyHashSecret = acmeSecret
	cfg.Plans["paid"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "hour", Limit: 20, Period: time.Hour}}}}
	cfg.APIKeys = []APIKey{{ID: "acme", SHA256: sha("acme-raw-key"), Plan: "paid"}}
	return cfg
}

// acmeKeyID is the key ID directives name acme's limiter key by: the
// events' HMAC of it, as directive keys are "<kind>:<key id>".
func acmeKeyID() string {
	mac := hmac.New(sha256.New, []byte(acmeSecret))
	mac.Write([]byte("k:acme"))
	return hex.EncodeToString(mac.Sum(nil)[:16])
}

// TestDirectivesApplied: a split directive makes each gateway check a hot
// key against its own share, in a bucket of its own; removing it returns
// the key to the shared bucket. A NAT directive raises an IP's limit.
func TestDirectivesApplied(t *testing.T) {
	ctx := context.Background()
	rig := newDirectiveRig(t)
	up := newTestUpstream(t)
	start := func(id string) *testGateway {
		cfg := acmeConfig(up.URL, id)
		// Split the hourly rule too: this test is about the mechanics,
		// TestSplitKeepsLongQuotas about the default.
		cfg.SplitMaxPeriod = time.Hour
		return rig.start(t, cfg)
	}
	a, b := start("gw-a"), start("gw-b")

	exp := time.Now().Add(time.Minute)
	if err := rig.store.WriteSplits(ctx, []limiter.SplitDirective{{Key: "api_key:" + acmeKeyID(), Shares: map[string]float64{"gw-a": 0.75, "gw-b": 0.25}, Expires: exp}}); err != nil {
		t.Fatal(err)
	}
	if err := rig.store.WriteNATs(ctx, []limiter.NATDirective{{Key: "ip:127.0.0.1", Factor: 3, Clients: 6, Expires: exp}}); err != nil {
		t.Fatal(err)
	}
	rig.watcher.Refresh(ctx)

	key := []string{"X-API-Key", "acme-raw-key"}
	if got := admitted(t, a.URL+"/x", 20, key...); got != 15 {
		t.Errorf("gw-a with a 0.75 split admitted %d of 20, want 15", got)
	}
	if got := admitted(t, b.URL+"/x", 20, key...); got != 5 {
		t.Errorf("gw-b with a 0.25 split admitted %d of 20, want 5", got)
	}
	// Anonymous: 5/min raised threefold for 127.0.0.1 by the NAT directive.
	if got := admitted(t, a.URL+"/x", 20); got != 15 {
		t.Errorf("NAT-raised IP admitted %d of 20, want 15", got)
	}
	if n := counter(t, a.directivesApplied.WithLabelValues("split")); n != 20 {
		t.Errorf("directives_applied_total{kind=split} = %v, want 20", n)
	}

	// The split lifted: the shared bucket, untouched so far, serves again.
	// This is the one capacity a switch can mint, which is why rules longer
	// than split_max_period (default 1m) are never split.
	if err := rig.store.WriteSplits(ctx, nil); err != nil {
		t.Fatal(err)
	}
	rig.watcher.Refresh(ctx)
	if got := admitted(t, a.URL+"/x", 25, key...); got != 20 {
		t.Errorf("after the split was removed, gw-a admitted %d of 25, want the shared 20", got)
	}
}

// TestSplitKeepsLongQuotas: a split never hands out a long quota afresh.
// A key that used its hourly quota in the shared bucket gets nothing more
// when a split arrives (issue 14 row 2: 20 shared + 15 + 5 split = 40 in
// 18 ms for a rule of 20/hour).
func TestSplitKeepsLongQuotas(t *testing.T) {
	ctx := context.Background()
	rig := newDirectiveRig(t)
	up := newTestUpstream(t)
	var gws []*testGateway
	for _, id := range []string{"gw-a", "gw-b"} {
		gws = append(gws, rig.start(t, acmeConfig(up.URL, id)))
	}
	key := []string{"X-API-Key", "acme-raw-key"}
	n := admitted(t, gws[0].URL+"/x", 25, key...)
	split := limiter.SplitDirective{Key: limiter.DirectiveKey("api_key", acmeKeyID()), Shares: map[string]float64{"gw-a": 0.75, "gw-b": 0.25}, Expires: time.Now().Add(time.Minute)}
	if err := rig.store.WriteSplits(ctx, []limiter.SplitDirective{split}); err != nil {
		t.Fatal(err)
	}
	rig.watcher.Refresh(ctx)
	n += admitted(t, gws[0].URL+"/x", 20, key...)
	n += admitted(t, gws[1].URL+"/x", 20, key...)
	if n != 20 {
		t.Errorf("a 20/hour key admitted %d across a split switch, want 20", n)
	}
}
