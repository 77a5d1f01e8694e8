package envoyrls

import (
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// staticDirectives is a directive source whose set the test swaps.
type staticDirectives struct {
	d atomic.Pointer[limiter.Directives]
}

func (s *staticDirectives) Current() *limiter.Directives { return s.d.Load() }

// TestSplitNeverForksADescriptorsBucket: a descriptor's bucket is shared
// by every request that carries it, whatever the other descriptors of the
// request, while analytics names a hot caller by the whole request. A
// split of one request's caller moved that caller's checks into buckets
// of their own, so the descriptor was admitted its limit there and its
// limit again through the requests of every other shape: here 10 of a
// limit of 5 a minute.
func TestSplitNeverForksADescriptorsBucket(t *testing.T) {
	const cfgFile = `
domain: split
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 1000}
`
	dirs := &staticDirectives{}
	dirs.d.Store(&limiter.Directives{})
	gcfg := gatewayConfig()
	gcfg.GatewayID = "gw-1"
	opts := gatewayOptions(redisStore(t, testenv.RedisAddr(t)))
	opts.Directives = dirs
	r := startRLSWith(t, map[string]string{"split.yaml": cfgFile}, Config{}, gcfg, opts)

	began := time.Now()
	alone := descs(desc("user", "alice"))
	withRoute := descs(desc("user", "alice"), desc("route", "x"))
	admitted := 0
	ask := func(ds []*commonv3.RateLimitDescriptor) {
		t.Helper()
		if r.ask(t, "split", 0, ds...).GetOverallCode() == ok {
			admitted++
		}
	}
	ask(alone)
	// Analytics finds alice's requests of one shape hot, on this gateway
	// alone: a split naming it with the whole limit.
	e := r.events.list()[0]
	dirs.d.Store(&limiter.Directives{Version: 1, Splits: map[string]limiter.SplitDirective{
		limiter.DirectiveKey(e.KeyKind.String(), e.KeyID): {
			Key:    limiter.DirectiveKey(e.KeyKind.String(), e.KeyID),
			Shares: map[string]float64{"gw-1": 1}, Expires: time.Now().Add(time.Hour),
		},
	}})
	for range 20 {
		ask(alone)
		ask(withRoute)
	}
	// The limit, and what it refilled while the test ran (5 a minute).
	if refill := int(time.Since(began)/(12*time.Second)) + 1; admitted > 5+refill {
		t.Errorf("user=alice admitted %d times, want at most its limit, 5 (+%d refilled)", admitted, refill)
	}
}
