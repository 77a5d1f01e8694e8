package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// readyKey is the reserved key of the warm-up's real check; no identity
// has it (theirs start "k:", "u:", "ip:" or a door's domain).
const readyKey = "edgelimit:ready"

// readyRule costs the reserved key nothing that lasts: a limit no warm-up
// reaches, in a bucket that empties in a second.
var readyRule = []limiter.Rule{{Name: "ready", Limit: math.MaxInt32, Period: time.Second}}

// How often the warm-up tries again while the store is not usable, at
// first and at most, and how often a warm link is looked after.
const (
	warmRetryFirst = 50 * time.Millisecond
	warmRetryMax   = 2 * time.Second
	keepWarmEvery  = time.Second
)

var errNotWarm = errors.New("store link not tried yet")

// WarmUp readies the shared store before the gateway says it is ready
// (see Ready): Options.Warm (connections dialled and authenticated, the
// function library loaded), then one real check of a reserved key within
// the store deadline. Until both succeed /readyz answers 503 with the
// reason; traffic sent to the gateway anyway is answered under its
// failure policies. It tries again, backing off to 2s, until it succeeds
// (nil) or ctx ends (its error). Without a shared store the gateway is
// ready from the start.
func (g *Gateway) WarmUp(ctx context.Context) error {
	if !g.shared {
		return nil
	}
	start := g.now()
	warned := false
	for wait := warmRetryFirst; ; wait = min(2*wait, warmRetryMax) {
		err := g.warmOnce(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		g.warmErr.Store(&err)
		if !warned {
			g.log.Warn("store link not usable yet; /readyz answers 503 until it is", "error", err.Error())
			warned = true
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
	if g.warmErr.Swap(nil) != nil {
		close(g.warmed)
		g.log.Info("store link ready", "took", g.now().Sub(start).Round(time.Millisecond).String())
	}
	return nil
}

// KeepWarm calls Options.Warm every second until ctx ends, so that
// connections a failover or an idle timeout closed are dialled again
// outside any request. Run it after WarmUp.
func (g *Gateway) KeepWarm(ctx context.Context) {
	if g.warm == nil {
		return
	}
	for sleep(ctx, keepWarmEvery) {
		wctx, cancel := context.WithTimeout(ctx, warmRetryMax)
		if err := g.warm(wctx); err != nil && ctx.Err() == nil {
			g.log.Debug("keep the store link warm", "error", err.Error())
		}
		cancel()
	}
}

// warmOnce is one try of the warm-up.
func (g *Gateway) warmOnce(ctx context.Context) error {
	if g.warm != nil {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := g.warm(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("warm the store link: %w", err)
		}
	}
	deadline := g.st.Load().cfg.StoreDeadline
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	if _, err := g.store.Allow(cctx, readyKey, readyRule, 1); err != nil {
		return fmt.Errorf("a check within the store deadline (%v): %w", deadline, err)
	}
	return nil
}

// Warmed is closed once WarmUp has found the store usable.
func (g *Gateway) Warmed() <-chan struct{} { return g.warmed }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
