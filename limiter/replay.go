package limiter

import (
	"context"
	"time"
)

// Replay re-decides recorded checks with Memory, the limiter's own
// in-process model of its rules, on a clock set to each check's recorded
// time: what-if analysis replays stored decisions through the algorithm
// the gateway runs, not a copy of it.
//
// It is meant for one key (or the few buckets of one key) at a time, in
// time order: Reset between keys drops every state, so memory is bounded
// by the buckets of the key in flight, and a clock that steps back at a
// new key never meets the old key's states. A Replay is not safe for
// concurrent use.
type Replay struct {
	at  time.Time
	max int
	m   *Memory
}

// NewReplay returns a Replay holding at most maxStates rule states at once
// (default 1024 when maxStates ≤ 0): one per rule per bucket of a key.
func NewReplay(maxStates int) *Replay {
	if maxStates <= 0 {
		maxStates = 1024
	}
	r := &Replay{max: maxStates}
	r.m = NewMemory(r.now, maxStates)
	return r
}

func (r *Replay) now() time.Time { return r.at }

// Reset forgets every state, as if the store had just started.
func (r *Replay) Reset() {
	if r.m.Len() > 0 {
		r.m = NewMemory(r.now, r.max)
	}
}

// Allow decides cost units of key against rules at time at, exactly as
// Memory.Allow would had its clock read at then. Times should not go back
// within a key; where they do (clocks of several gateways), Memory clamps
// as it does for a clock that steps back.
func (r *Replay) Allow(at time.Time, key string, rules []Rule, cost int64) (Decision, error) {
	r.at = at
	return r.m.Allow(context.Background(), key, rules, cost)
}

// Grant sets what key's window of the calendar rule at time at has been
// granted in all to granted (at least 0), as a recorded grant left it:
// Memory.Grant adds units, so the replay asks it for one more and
// corrects by what that reports.
func (r *Replay) Grant(at time.Time, key string, rule Rule, granted int64) error {
	r.at = at
	g, err := r.m.Grant(context.Background(), key, rule, 1)
	if err != nil {
		return err
	}
	if units := max(0, granted) - g.Granted; units != 0 {
		_, err = r.m.Grant(context.Background(), key, rule, units)
	}
	return err
}
