package envoyrls

import (
	"context"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

const layoutRules = `domain: lay
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: generic_key
    value: everyone
    rate_limit: {unit: hour, requests_per_unit: 1000}
`

// layoutStore is a limiter on the test Redis under a prefix of its own,
// and a client to read its keys.
func layoutStore(t *testing.T) (*limiter.Redis, *redis.Client, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "lay" + randHex(6)
	lim, err := limiter.New(rdb, limiter.Config{Prefix: prefix, DenyCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	return lim, rdb, prefix
}

func storedKeys(t *testing.T, rdb *redis.Client, prefix string) []string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestCallerDescriptorsShareAKey: a request's descriptors naming one
// caller are one Redis key, whatever their keys; one that also names a
// path has a key of its own in the caller's slot, so the caller's does not
// grow with paths; one every caller shares keeps a key of its own.
func TestCallerDescriptorsShareAKey(t *testing.T) {
	lim, rdb, prefix := layoutStore(t)
	r := startRLSOn(t, map[string]string{"lay.yaml": layoutRules}, Config{}, gatewayConfig(), lim)
	ctx := context.Background()
	ask := func(path string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := r.try("lay", 0, desc("minute", "u1"), desc("hour", "u1"), desc("user", "u1", "path", path), desc("generic_key", "everyone"))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	if code := ask("/a"); code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", code)
	}
	keys := storedKeys(t, rdb, prefix)
	if len(keys) != 3 {
		t.Fatalf("keys after one request: %q; want 3 (the caller's, its path's, everyone's)", keys)
	}
	var caller string
	for _, k := range keys {
		if strings.HasSuffix(k, ":") {
			caller = k
		}
	}
	if caller == "" {
		t.Fatalf("no shared container among %q", keys)
	}
	size := rdb.StrLen(ctx, caller).Val()
	tag := caller[strings.IndexByte(caller, '{') : strings.IndexByte(caller, '}')+1]
	paths := 0
	for _, k := range keys {
		if k != caller && strings.Contains(k, tag) {
			paths++
		}
	}
	if paths != 1 {
		t.Errorf("keys %q: want the path's bucket under the caller's tag %s", keys, tag)
	}
	if code := ask("/b"); code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("second request: %v", code)
	}
	if keys := storedKeys(t, rdb, prefix); len(keys) != 4 {
		t.Errorf("keys after a second path: %q; want 4", keys)
	}
	if got := rdb.StrLen(ctx, caller).Val(); got != size {
		t.Errorf("the caller's container grew from %d to %d bytes with a new path", size, got)
	}
	if code := ask("/c"); code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("third request: %v", code)
	}
	if code := ask("/d"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("fourth request: %v; want OVER_LIMIT (3 a minute)", code)
	}
}

// TestPreviousLayoutHoldsOldGateways: a caller a gateway of the previous
// layout drained (its descriptor's key of its own) is denied by a door
// with previous_layout, and what such a door admits counts there too; a
// door without it starts the caller afresh, which is why the setting is
// on during the upgrade.
func TestPreviousLayoutHoldsOldGateways(t *testing.T) {
	lim, _, _ := layoutStore(t)
	files := map[string]string{"lay.yaml": layoutRules}
	both := startRLSOn(t, files, Config{PreviousLayout: true}, gatewayConfig(), lim)
	fresh := startRLSOn(t, files, Config{}, gatewayConfig(), lim)
	ctx := context.Background()
	// oldCheck is a check of a gateway of the previous layout.
	oldCheck := func(user string) bool {
		t.Helper()
		b, err := both.svc.DoorBucket("lay", []gateway.DescriptorEntry{{Key: "minute", Value: user}})
		if err != nil {
			t.Fatal(err)
		}
		rule := b.Rules[0]
		if rule.WasTag == "" {
			t.Fatalf("rule %+v: no previous tag with previous_layout", rule)
		}
		rule.Tag, rule.Alone, rule.WasTag = rule.WasTag, true, ""
		d, err := lim.Allow(ctx, b.Key, []limiter.Rule{rule}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	code := func(r *rls, user string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := r.try("lay", 0, desc("minute", user), desc("hour", user))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	for range 3 {
		if !oldCheck("u1") {
			t.Fatal("the old gateway denied within the limit")
		}
	}
	if c := code(both, "u1"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("door with previous_layout after the old gateway's 3: %v; want OVER_LIMIT", c)
	}
	if c := code(fresh, "u1"); c != rlsv3.RateLimitResponse_OK {
		t.Errorf("door without previous_layout: %v; want OK (it does not read the old key)", c)
	}
	for i := range 3 {
		if c := code(both, "u2"); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("door with previous_layout, request %d: %v", i, c)
		}
	}
	if oldCheck("u2") {
		t.Error("the old gateway admitted past what the door with previous_layout counted")
	}
}

// TestPreviousTagKeepsItsNames: the previous layout's tags and the buckets
// are those its releases computed (pinned, from 59a6d9b: a change would
// lose every old key and record).
func TestPreviousTagKeepsItsNames(t *testing.T) {
	for _, tc := range []struct {
		entries []entry
		want    string
	}{
		{[]entry{{"minute", "u1"}}, "t8180291fcf1136bf"},
		{[]entry{{"generic_key", "a"}, {"remote_address", "10.0.0.1"}, {"path", "/x"}}, "tb8adb954a8cf4558"},
		{[]entry{{"generic_key", "a"}, {"generic_key", "b"}}, "t50684db98b40b886"},
	} {
		if got := previousTag("lay", tc.entries); got != tc.want {
			t.Errorf("previousTag(%v) = %s, want %s", tc.entries, got, tc.want)
		}
	}
	// The buckets name the records in either layout.
	for _, tc := range []struct {
		entries []entry
		want    string
	}{
		{[]entry{{"minute", "u1"}}, "e8180291fcf1136bf7d77a36c4a19facc"},
		{[]entry{{"generic_key", "a"}, {"remote_address", "10.0.0.1"}, {"path", "/x"}}, "e6de68bd4924a68c54a4bc8e0985e9960"},
	} {
		if got := bucket("lay", tc.entries); got != tc.want {
			t.Errorf("bucket(%v) = %s, want %s", tc.entries, got, tc.want)
		}
	}
}
