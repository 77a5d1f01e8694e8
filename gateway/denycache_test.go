package gateway

import (
	"net/http"
	"testing"

	"github.com/edgelimit/edgelimit/internal/event"
)

// TestDenyCacheAnswersWithoutTheStore: once the store denies a caller,
// its next requests are answered from the limiter's deny cache, before
// the gateway sets up a store call: no check reaches Redis, the answer is
// the same 429 with its Retry-After and rate-limit headers, and each is a
// decision event marked local_cache.
func TestDenyCacheAnswersWithoutTheStore(t *testing.T) {
	lim, _ := redisStore(t)
	ev := &eventLog{}
	gw := startGateway(t, testConfig(newTestUpstream(t).URL), Options{Store: lim, Publisher: ev})
	for i := range 5 {
		if r := get(t, gw.URL+"/"); r.status != http.StatusOK {
			t.Fatalf("request %d = %d, want 200", i, r.status)
		}
	}
	first := get(t, gw.URL+"/")
	if first.status != http.StatusTooManyRequests {
		t.Fatalf("request 6 = %d, want 429", first.status)
	}
	before := lim.Stats()
	for i := range 10 {
		r := get(t, gw.URL+"/")
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" ||
			r.header.Get(hRemaining) != "0" || r.header.Get(hPolicy) != first.header.Get(hPolicy) {
			t.Fatalf("cached denial %d = %d %v, want the store's 429 with its headers (%v)", i, r.status, r.header, first.header)
		}
	}
	after := lim.Stats()
	if after.Checks != before.Checks || after.Cached-before.Cached != 10 {
		t.Errorf("limiter stats %+v → %+v: want 10 denials from the cache and no check sent to Redis", before, after)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if n := len(ev.all); n != 16 {
		t.Fatalf("%d decision events, want 16", n)
	}
	for i, d := range ev.all[6:] {
		if d.Allowed || d.StoreStatus != event.StoreLocalCache || d.Mode != event.ModeEnforced || d.BindingRule != "minute" {
			t.Errorf("cached denial %d's event: allowed %v, store %v, mode %v, binding %q; want a denial from local_cache by minute",
				i, d.Allowed, d.StoreStatus, d.Mode, d.BindingRule)
		}
	}
	if d := ev.all[5]; d.Allowed || d.StoreStatus != event.StoreOK {
		t.Errorf("the store's denial's event: allowed %v, store %v; want a denial by the store", d.Allowed, d.StoreStatus)
	}
}
