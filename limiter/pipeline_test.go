package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestPooledCallsKeepTheirAnswers: calls are pooled and reused once their
// caller has read the answer, and callers that give up leave theirs to
// the sender. Under many concurrent callers on shared pipelines, some of
// them giving up at once, every caller that gets an answer gets its own:
// each checks a fresh key against a limit no other caller uses, so the
// remaining count names whose answer it is.
func TestPooledCallsKeepTheirAnswers(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: mustRedis(t).Options().Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l := mustLimiter(t, rdb, Config{DenyCache: -1, Senders: 2, Batch: 16})
	if err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	const callers, rounds = 48, 40
	var wg sync.WaitGroup
	var answered, gaveUp atomic.Int64
	for i := range callers {
		wg.Go(func() {
			for j := range rounds {
				limit := int64(1000 + i*rounds + j) // this caller's, this round's
				rules := []Rule{{Name: "r", Limit: limit, Period: time.Hour}}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if j%3 == 0 {
					// Gone before, during or after its pipeline.
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(j%5)*50*time.Microsecond)
				}
				var (
					d   Decision
					err error
				)
				if j%3 == 1 {
					// The same by the pooled call's own timer, which
					// the call's next user must not hear.
					d, err = l.AllowUncachedWithin(ctx, time.Duration(j%5)*5*time.Millisecond+50*time.Microsecond, uniqueKey(t), rules, 1)
				} else {
					d, err = l.Allow(ctx, uniqueKey(t), rules, 1)
				}
				// Its deadline may show as the socket's timeout before the
				// context's own timer has run.
				_, gone := ctx.Deadline()
				gone = gone || j%3 == 1
				cancel()
				switch {
				case err != nil && gone && errors.Is(err, ErrBadScriptData):
					// A call skipped for its ended context once came
					// back with no reply and no error.
					t.Errorf("caller %d round %d gave up and got %v: want its context's error or a timeout", i, j, err)
				case err != nil && gone:
					gaveUp.Add(1)
				case err != nil:
					t.Errorf("Allow: %v", err)
				case !d.Allowed || d.Rules[0].Rule.Limit != limit || d.Rules[0].Remaining != limit-1:
					t.Errorf("caller %d round %d got %+v: want its own first check of limit %d (remaining %d)", i, j, d, limit, limit-1)
				default:
					answered.Add(1)
				}
			}
		})
	}
	wg.Wait()
	st := l.Stats()
	t.Logf("%d answered, %d gave up, %+v", answered.Load(), gaveUp.Load(), st)
	if answered.Load() < callers*rounds/2 {
		t.Errorf("only %d of %d checks answered", answered.Load(), callers*rounds)
	}
	if st.Pipelines >= st.Checks {
		t.Errorf("Stats() = %+v: no check shared a pipeline, so reuse across a pipeline went untested", st)
	}
}
