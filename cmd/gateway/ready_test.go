package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// readyConfig is a gateway at the product's defaults (failure_policy
// open) with a 5-per-hour rule. Its store deadline is a second, not the
// default 25 ms: the test's property is that the burst dials nothing
// (counted by the pool, clock-free), and at 25 ms a machine busy with
// other tests made some checks fail open however ready the gateway was.
const readyConfig = `
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
store_deadline: 1s
plans:
  free:
    rules:
      - {name: hour, limit: 5, period: 1h}
anonymous_plan: free
upstreams:
  app: {url: %s}
routes:
  - {name: all, path_prefix: /, upstream: app}
kafka:
  disabled: true
`

// TestReadyMeansReady: a gateway that says ready decides its first burst
// in the store with the connections it holds. Started against a Redis
// that needs TLS and an ACL user, and against a Cluster, it is waited for
// on /readyz and then sent 64 requests at once, three starts each: no
// check of the burst dials a connection (edgelimit_redis_pool_misses_total
// does not move: a gateway that said ready before it had dialled and
// authenticated did that within its first requests' deadline, and they
// failed open), not one fails open, every answer carries the rate-limit
// headers, and exactly the rule's 5 pass.
func TestReadyMeansReady(t *testing.T) {
	t.Run("tls-acl", func(t *testing.T) {
		certs, rs := testenv.TLSCerts(t), testenv.SecureRedis(t)
		readyBurst(t, map[string]string{
			"EDGELIMIT_REDIS_ADDR":          rs.Addrs[0],
			"EDGELIMIT_REDIS_USERNAME":      rs.User,
			"EDGELIMIT_REDIS_PASSWORD":      rs.Password,
			"EDGELIMIT_REDIS_TLS_CA_FILE":   certs.CA,
			"EDGELIMIT_REDIS_TLS_CERT_FILE": certs.Client,
			"EDGELIMIT_REDIS_TLS_KEY_FILE":  certs.ClientKey,
		})
	})
	t.Run("cluster", func(t *testing.T) {
		readyBurst(t, map[string]string{"EDGELIMIT_REDIS_CLUSTER_ADDRS": strings.Join(testenv.RedisClusterAddrs(t), ",")})
	})
}

func readyBurst(t *testing.T, link map[string]string) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, readyConfig, up.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		vars := map[string]string{"EDGELIMIT_REDIS_PREFIX": fmt.Sprintf("ready%d-%d", time.Now().UnixNano(), i)}
		for k, v := range link {
			vars[k] = v
		}
		r := start(t, []string{"-config", path}, env(vars)) // awaits /readyz

		misses := metric(t, r.admin, "edgelimit_redis_pool_misses_total")
		const n = 64
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}, Timeout: time.Minute}
		var (
			wg              sync.WaitGroup
			mu              sync.Mutex
			ok, denied, bad int
			noHeaders       []int
		)
		gate := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-gate
				resp, err := client.Get(r.addr + "/")
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					bad++
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					ok++
				case http.StatusTooManyRequests:
					denied++
				default:
					bad++
				}
				if resp.Header.Get("X-RateLimit-Limit") == "" {
					noHeaders = append(noHeaders, resp.StatusCode)
				}
			})
		}
		close(gate)
		wg.Wait()
		client.CloseIdleConnections()

		if after := metric(t, r.admin, "edgelimit_redis_pool_misses_total"); after != misses {
			t.Errorf("start %d: the first burst dialled Redis: pool misses %s before it, %s after", i, misses, after)
		}
		failOpen := metric(t, r.admin, "edgelimit_gateway_fail_open_total")
		if failOpen != "0" || ok != 5 || denied != n-5 || bad != 0 || len(noHeaders) > 0 {
			var unavailable []string
			_, _, body := httpGet(t, r.admin+"/metrics")
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "edgelimit_gateway_store_unavailable_total") {
					unavailable = append(unavailable, l)
				}
			}
			t.Errorf("start %d: fail_open_total %s; %d allowed, %d denied, %d failed, %d answers without rate-limit headers (want 0 fail-opens, 5 allowed, %d denied, all with headers); %v",
				i, failOpen, ok, denied, bad, len(noHeaders), n-5, unavailable)
			t.Logf("log:\n%s", r.logs)
		}
		r.cancel()
		select {
		case err := <-r.done:
			r.done <- err // for start's cleanup
		case <-time.After(30 * time.Second):
			t.Fatal("run did not return after cancel")
		}
	}
}
