package testenv_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestLoad: every goroutine calls f until stop, and once stop returns no
// call is in flight or starts again, and f's context has ended.
func TestLoad(t *testing.T) {
	var calls, inFlight atomic.Int64
	var last atomic.Pointer[context.Context]
	stop := testenv.Load(t, 3, time.Millisecond, func(ctx context.Context) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		calls.Add(1)
		last.Store(&ctx)
	})
	testenv.WaitFor(t, 30*time.Second, "calls from the load", func() bool { return calls.Load() >= 10 })
	stop()
	if n := inFlight.Load(); n != 0 {
		t.Errorf("%d calls in flight after stop returned", n)
	}
	after := calls.Load()
	stop() // again: a no-op, as the test's cleanup will do
	if ctx := *last.Load(); ctx.Err() == nil {
		t.Errorf("f's context after stop: Err() = nil, want it ended")
	}
	if n := calls.Load(); n != after {
		t.Errorf("calls went on after stop: %d, then %d", after, n)
	}
}
