package limiter

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSequenceNumbersEveryDecision: on a standalone Redis and a Cluster,
// Redis numbers each identity's decisions, allowed and denied alike, in the
// same atomic step: concurrent callers get 1..n exactly once each, in one
// epoch; a split's share is a sequence of its own; a sequence gone (its
// container expired) restarts at 1 in a later epoch; it keeps no
// container alive; cached denials and the Memory store carry none.
func TestSequenceNumbersEveryDecision(t *testing.T) {
	for name, rdb := range map[string]redis.UniversalClient{"redis": mustRedis(t), "cluster": mustCluster(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := mustLimiter(t, rdb, Config{DenyCache: -1})
			key := uniqueKey(t)
			rules := []Rule{{Name: "hour", Limit: 50, Period: time.Hour}, {Name: "minute", Limit: 1000, Period: time.Minute}}

			const callers, each = 16, 8
			var (
				mu     sync.Mutex
				seqs   []int64
				epochs = map[time.Time]bool{}
				denied int
				wg     sync.WaitGroup
			)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						d, err := l.Allow(ctx, key, rules, 1)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						seqs, epochs[d.SeqEpoch] = append(seqs, d.Seq), true
						if !d.Allowed {
							denied++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			slices.Sort(seqs)
			for i, s := range seqs {
				if s != int64(i+1) {
					t.Fatalf("sequence numbers %v, want 1..%d each once", seqs, callers*each)
				}
			}
			if len(epochs) != 1 || denied != callers*each-50 {
				t.Errorf("%d epochs, %d denied; want one epoch, and the %d past the limit denied (and numbered)", len(epochs), denied, callers*each-50)
			}
			var epoch time.Time
			for e := range epochs {
				epoch = e
			}

			// The container lives until its drained hour refills, plus a
			// second, as without a sequence.
			ttl, err := rdb.PTTL(ctx, identityKey(l.cfg.Prefix, key)).Result()
			if err != nil || ttl <= 59*time.Minute || ttl > time.Hour+time.Second {
				t.Errorf("container TTL %v, %v; want 1h1s at most and over 59m", ttl, err)
			}

			// A split's share is a sequence of its own, in its container.
			share := []Rule{{Name: "hour", Limit: 50, Period: time.Hour, Whole: Whole{Gateway: "gw-1", Limit: 50, Period: time.Hour}}}
			share[0].Limit, share[0].Share = 25, true
			for want := int64(1); want <= 2; want++ {
				if d, err := l.Allow(ctx, key+"/gw:gw-1", share, 1); err != nil || d.Seq != want || d.SeqEpoch.Equal(epoch) {
					t.Errorf("split check = %+v, %v; want number %d of an epoch of its own", d, err, want)
				}
			}

			// Gone, it restarts at 1 in a later epoch.
			if err := rdb.Del(ctx, identityKey(l.cfg.Prefix, key)).Err(); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Allow(ctx, key, rules, 1); err != nil || d.Seq != 1 || !d.SeqEpoch.After(epoch) {
				t.Errorf("after expiry = seq %d epoch %v, %v; want 1 in an epoch after %v", d.Seq, d.SeqEpoch, err, epoch)
			}

			// A calendar rule's check (the general path) is numbered too,
			// and the fast path goes on where it left off.
			k3 := uniqueKey(t)
			cal := []Rule{{Name: "day", Limit: 3, Calendar: MustCalendar(Day, "UTC", "00:00")}}
			for want := int64(1); want <= 5; want++ {
				if d, err := l.Allow(ctx, k3, cal, 1); err != nil || d.Seq != want {
					t.Errorf("calendar check %d: seq %d, %v", want, d.Seq, err)
				}
			}
			for want := int64(6); want <= 7; want++ {
				if d, err := l.Allow(ctx, k3, rules, 1); err != nil || d.Seq != want {
					t.Errorf("fast check after general ones: seq %d, %v; want %d", d.Seq, err, want)
				}
			}

			// Checks whose first containers differ (the door's descriptor
			// buckets in another combination) keep each one's sequence:
			// a container's record rides along when it is not first.
			k4 := uniqueKey(t)
			ra := Rule{Name: "a", Bucket: "a", Limit: 100, Period: time.Minute}
			rb := Rule{Name: "b", Bucket: "b", Limit: 100, Period: time.Minute}
			for i, tc := range []struct {
				rules []Rule
				want  int64
			}{{[]Rule{ra, rb}, 1}, {[]Rule{rb}, 1}, {[]Rule{ra, rb}, 2}, {[]Rule{rb}, 2}, {[]Rule{ra, rb}, 3}} {
				if d, err := l.Allow(ctx, k4, tc.rules, 1); err != nil || d.Seq != tc.want {
					t.Errorf("bucket check %d: seq %d, %v; want %d", i+1, d.Seq, err, tc.want)
				}
			}

			// A cached denial is no store decision: no number.
			cached := mustLimiter(t, rdb, Config{})
			spent := []Rule{{Name: "one", Limit: 1, Period: time.Hour}}
			k2 := uniqueKey(t)
			for i, want := range []int64{1, 2, 0} {
				d, err := cached.Allow(ctx, k2, spent, 1)
				if err != nil || d.Seq != want || d.Cached != (want == 0) {
					t.Errorf("call %d: seq %d cached %v, %v; want seq %d", i+1, d.Seq, d.Cached, err, want)
				}
			}
		})
	}
	mem := NewMemory(time.Now, 100)
	if d, err := mem.Allow(context.Background(), "k", []Rule{{Name: "m", Limit: 5, Period: time.Minute}}, 1); err != nil || d.Seq != 0 {
		t.Errorf("Memory: seq %d, %v; want none", d.Seq, err)
	}
}
