package edgelimit_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestRedisLeastPrivilege: the ACL users of docs/security.md are enough.
// On the test stack's standalone Redis and on its Cluster, it creates the
// two users exactly as the page writes them (a fresh name, password and prefix
// each run), runs the gateway binary as one (checks, the key admin API's
// inspect, reset and clear, /readyz, the directive watcher) and analytics'
// Redis work as the other (the start check, directive writes and reads),
// and finds no denial in any node's ACL LOG. It also checks that the users
// are restricted at all: outside their keys and commands Redis refuses
// them.
func TestRedisLeastPrivilege(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway")
	}
	t.Parallel()
	acls := docACLs(t)
	bin := buildBinaries(t, "gateway")
	t.Run("standalone", func(t *testing.T) {
		addr := testenv.RedisAddr(t)
		admin := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { admin.Close() })
		leastPrivilege(t, bin, acls, admin, func(l *boot.Redis) { l.Addr = addr }, "EDGELIMIT_REDIS_ADDR", addr)
	})
	t.Run("sentinel", func(t *testing.T) {
		master, sentinels := testenv.RedisSentinel(t)
		addr := testenv.RedisAddr(t)
		admin := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { admin.Close() })
		// The Sentinels get a user of their own, from docs/security.md too.
		sentinel := redis.NewClient(&redis.Options{Addr: sentinels[0]})
		t.Cleanup(func() { sentinel.Close() })
		user, password := fmt.Sprintf("se-%d", time.Now().UnixNano()), fmt.Sprintf("se-pw-%d", time.Now().UnixNano())
		setUser(t, sentinel, user, password, "", acls["edgelimit-sentinel"])
		leastPrivilege(t, bin, acls, admin, func(l *boot.Redis) {
			l.SentinelAddrs, l.SentinelMaster = sentinels[:1], master
			l.SentinelUsername, l.SentinelPassword = user, boot.Secret(password)
		}, "EDGELIMIT_REDIS_SENTINEL_ADDRS", sentinels[0], "EDGELIMIT_REDIS_SENTINEL_MASTER", master,
			"EDGELIMIT_REDIS_SENTINEL_USERNAME", user, "EDGELIMIT_REDIS_SENTINEL_PASSWORD", password)
		wantNoDenial(t, sentinel, map[string]string{"edgelimit-sentinel": user})
	})
	t.Run("cluster", func(t *testing.T) {
		addrs := testenv.RedisClusterAddrs(t)
		admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { admin.Close() })
		leastPrivilege(t, bin, acls, admin, func(l *boot.Redis) { l.ClusterAddrs = addrs[:1] },
			"EDGELIMIT_REDIS_CLUSTER_ADDRS", addrs[0])
	})
}

// docACLs are the ACL SETUSER lines of docs/security.md, by user name.
func docACLs(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	acls := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if w := strings.Fields(sc.Text()); len(w) > 3 && w[0] == "ACL" && w[1] == "SETUSER" {
			acls[w[2]] = w[3:]
		}
	}
	for _, u := range []string{"edgelimit-gateway", "edgelimit-analytics", "edgelimit-sentinel"} {
		if len(acls[u]) == 0 {
			t.Fatalf("docs/security.md has no ACL SETUSER %s line", u)
		}
	}
	return acls
}

// forEachNode runs f on every node admin reaches: the server, or every
// node of the Cluster (an ACL user must exist on each).
func forEachNode(t *testing.T, admin redis.UniversalClient, f func(c *redis.Client) error) {
	t.Helper()
	ctx := context.Background()
	var err error
	if cc, ok := admin.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return f(c) })
	} else {
		err = f(admin.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// setUser creates user with the documented rules for a role, its password
// and its keys under prefix instead of rl; it is deleted with the test.
func setUser(t *testing.T, c *redis.Client, user, password, prefix string, rules []string) {
	t.Helper()
	ctx := context.Background()
	args := []any{"ACL", "SETUSER", user}
	for _, w := range rules {
		switch {
		case strings.HasPrefix(w, ">"):
			w = ">" + password
		case strings.HasPrefix(w, "~rl:"):
			w = "~" + prefix + ":" + strings.TrimPrefix(w, "~rl:")
		}
		args = append(args, w)
	}
	if err := c.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER on %s: %v", c.Options().Addr, err)
	}
	t.Cleanup(func() { c.Do(context.Background(), "ACL", "DELUSER", user) })
}

// wantNoDenial fails for each entry of c's ACL LOG of one of users (by
// role).
func wantNoDenial(t *testing.T, c *redis.Client, users map[string]string) {
	t.Helper()
	entries, err := c.ACLLog(context.Background(), 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		for role, user := range users {
			if e.Username == user {
				t.Errorf("ACL LOG on %s: %s (%s) refused %s %q", c.Options().Addr, role, user, e.Reason, e.Object)
			}
		}
	}
}

func leastPrivilege(t *testing.T, bin string, acls map[string][]string, admin redis.UniversalClient, at func(*boot.Redis), linkEnv ...string) {
	ctx := context.Background()
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	prefix := "acl" + suffix
	users := map[string]string{"edgelimit-gateway": "gw-" + suffix, "edgelimit-analytics": "an-" + suffix}
	passwords := map[string]string{"edgelimit-gateway": "gw-pw-" + suffix, "edgelimit-analytics": "an-pw-" + suffix}
	for role, user := range users {
		forEachNode(t, admin, func(c *redis.Client) error {
			setUser(t, c, user, passwords[role], prefix, acls[role])
			return nil
		})
	}

	// Analytics' Redis work, as analytics does it (boot.NewRedis, the
	// start check, the directive store).
	// client is a Redis client of role's user on the link under test.
	client := func(role string) (boot.Redis, redis.UniversalClient) {
		l := boot.Redis{Username: users[role], Password: boot.Secret(passwords[role])}
		at(&l)
		rdb, err := boot.NewRedis(l, boot.RedisTuning{Timeout: 2 * time.Second}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.Close() })
		return l, rdb
	}
	an, ardb := client("edgelimit-analytics")
	if err := boot.PingRedis(ctx, ardb, an); err != nil {
		t.Fatalf("analytics' start check as its ACL user: %v", err)
	}
	ds := limiter.NewDirectiveStore(ardb, prefix)
	nat := limiter.NATDirective{Key: prefix + ":{ip:203.0.113.7}", Factor: 2, Clients: 10, Expires: time.Now().Add(10 * time.Minute)}
	if err := ds.WriteNATs(ctx, []limiter.NATDirective{nat}); err != nil {
		t.Fatalf("analytics' directive write as its ACL user: %v", err)
	}
	if err := ds.WriteSplits(ctx, nil); err != nil {
		t.Fatalf("analytics' directive write (none) as its ACL user: %v", err)
	}
	if d, _, err := ds.Load(ctx); err != nil || len(d.NATs) != 1 {
		t.Fatalf("analytics' directive read as its ACL user = %d NATs, %v; want 1, nil", len(d.NATs), err)
	}

	// The gateway binary, as its user.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	defer upstream.Close()
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, secureGatewayConfig, upstream.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	listen, adminAddr, token := testenv.FreeAddr(t), testenv.FreeAddr(t), "admin-token-"+suffix
	s := &secureStack{bin: bin}
	var log testenv.LogBuffer
	vars := map[string]string{
		"EDGELIMIT_REDIS_USERNAME":  users["edgelimit-gateway"],
		"EDGELIMIT_REDIS_PASSWORD":  passwords["edgelimit-gateway"],
		"EDGELIMIT_REDIS_PREFIX":    prefix,
		"EDGELIMIT_LISTEN":          listen,
		"EDGELIMIT_ADMIN_LISTEN":    adminAddr,
		"EDGELIMIT_ADMIN_TOKEN":     token,
		"EDGELIMIT_KEY_HASH_SECRET": "acl-test-key-hash-secret",
	}
	for i := 0; i+1 < len(linkEnv); i += 2 {
		vars[linkEnv[i]] = linkEnv[i+1]
	}
	s.start(t, "gateway", vars, &log, "-config", cfg)
	waitReady(t, "gateway", "http://"+adminAddr+"/readyz", &log)

	remaining := func() string {
		t.Helper()
		resp, err := http.Get("http://" + listen + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get("X-RateLimit-Remaining")
	}
	adminCall := func(method, path string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+adminAddr+"/admin/v1/keys"+path+"?ip=127.0.0.1", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s /admin/v1/keys%s = %s, want 200: %.300s\ngateway log:\n%s", method, path, resp.Status, body, log.String())
		}
	}
	// Decided by Redis: a failing script would fail open without the
	// header's count going down.
	if a, b := remaining(), remaining(); a != "99" || b != "98" {
		t.Errorf("X-RateLimit-Remaining = %q then %q, want 99 then 98 (decided by Redis); gateway log:\n%s", a, b, log.String())
	}
	adminCall(http.MethodGet, "")
	adminCall(http.MethodPost, "/reset")
	if r := remaining(); r != "99" {
		t.Errorf("after the admin reset X-RateLimit-Remaining = %q, want 99", r)
	}
	adminCall(http.MethodPost, "/clear")
	testenv.WaitFor(t, 30*time.Second, "the gateway loads analytics' NAT directive", func() bool {
		return strings.Contains(log.String(), `"msg":"directives loaded"`) && strings.Contains(log.String(), `"nats":1`)
	})

	// No command of either was refused, on any node.
	forEachNode(t, admin, func(c *redis.Client) error {
		wantNoDenial(t, c, users)
		return nil
	})

	// The users are restricted: other keys and other commands are refused.
	_, grdb := client("edgelimit-gateway")
	for what, err := range map[string]error{
		"gateway SET outside its prefix":     grdb.Set(ctx, "other:"+suffix, "x", time.Minute).Err(),
		"gateway CONFIG GET":                 grdb.ConfigGet(ctx, "*").Err(),
		"gateway FLUSHALL":                   grdb.Do(ctx, "FLUSHALL").Err(),
		"analytics SET on a limiter key":     ardb.Set(ctx, prefix+":{ip:1}", "x", time.Minute).Err(),
		"analytics EVAL":                     ardb.Eval(ctx, "return 1", []string{prefix + ":{directives}:x"}).Err(),
		"analytics GET outside its prefixes": ardb.Get(ctx, "other:"+suffix).Err(),
	} {
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s = %v, want NOPERM: the user is not restricted", what, err)
		}
	}
}
