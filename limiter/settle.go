package limiter

import (
	"context"
	"fmt"
	"time"
)

// settleRules is rules as a settlement of delta charges them: each rule
// delta more units, or -delta back. A charge above twice a token
// bucket's or a sliding window's capacity is cut there: the debt stops at
// one capacity below empty anyway, and so micro-tokens stay exact. It
// reports bad input as Allow does, and rules a settlement cannot charge:
// a bucket under a Tag (the Envoy door's, which settles nothing) is
// decided across slots, where a charge that may not be denied has no
// all-or-nothing to keep.
func settleRules(key string, rules []Rule, delta int64) ([]Rule, error) {
	if err := validate(key, rules, 1); err != nil {
		return nil, err
	}
	if delta == 0 || delta < -MaxCost || delta > MaxCost {
		return nil, fmt.Errorf("%w: %w: a settlement of %d", ErrInput, ErrInvalidCost, delta)
	}
	out := make([]Rule, len(rules))
	for i, r := range rules {
		if r.Tag != "" {
			return nil, fmt.Errorf("%w: %w %q: a settlement cannot charge a bucket under a tag", ErrInput, ErrInvalidRule, r.Name)
		}
		r.Cost = delta
		if delta > 0 && r.Calendar == nil {
			r.Cost = min(delta, 2*r.Capacity())
		}
		out[i] = r
	}
	return out, nil
}

// Settle charges key's rules what a request used beyond what its check
// reserved, once its answer says (a token budget charged max_tokens up
// front and the tokens used after): delta more units, or -delta back when
// it used less. It always admits: a charge past a rule's limit overdraws
// it, a token bucket's tokens going negative and a window's count past
// its limit, so later checks wait for the refill; the debt stops at one
// capacity (a window's: the limit again). A give-back comes off the window the
// reservation was charged in, at (its Decision.Time), or off none once
// that has ended, and never fills a rule past its capacity.
//
// rules are those the reservation charged, as it charged them (a split's
// shares with their wholes); a shadow rule is settled too. The decision
// reports each rule's state after the settlement, unnumbered (Seq 0).
func (r *Redis) Settle(ctx context.Context, key string, rules []Rule, delta int64, at time.Time) (Decision, error) {
	rules, err := settleRules(key, rules, delta)
	if err != nil {
		return Decision{}, err
	}
	if delta > 0 {
		at = r.cfg.Now()
	}
	// Each rule carries its charge (Cost): the call's cost only says "a
	// check" (a negative one is another of the script's modes).
	d, _, err := r.decideOne(ctx, key, rules, 1, how{over: true, at: at})
	if err == nil && delta < 0 && r.deny != nil {
		// What came back may admit a check this gateway cached a denial
		// of (other gateways' caches hold theirs at most until the retry
		// they gave: under-admission, never over).
		r.deny.forget(key)
	}
	return d, err
}

// Settle is Redis.Settle in memory. Like the memory store's other
// give-backs, one comes off the current window.
func (m *Memory) Settle(_ context.Context, key string, rules []Rule, delta int64, _ time.Time) (Decision, error) {
	rules, err := settleRules(key, rules, delta)
	if err != nil {
		return Decision{}, err
	}
	return m.allow(key, rules, 1, true), nil
}
