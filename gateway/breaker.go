package gateway

import (
	"sync"
	"time"
)

// circuit is a breaker state.
type circuit int

// Breaker states, also the values of the circuit state gauge.
const (
	circuitClosed   circuit = 0 // calls go to the store
	circuitHalfOpen circuit = 1 // one probe is in flight
	circuitOpen     circuit = 2 // calls fail at once
)

func (c circuit) String() string {
	switch c {
	case circuitClosed:
		return "closed"
	case circuitHalfOpen:
		return "half_open"
	}
	return "open"
}

// breaker stops calls to a failing store: after `failures` consecutive
// failures it opens for `open`, then lets one call through as a probe; the
// probe's success closes it, its failure opens it again. So no request waits
// on a dead store, and enforcement resumes by itself when the store returns.
//
// Consecutive means in sequence, not merely in a row of reports: a failure
// counts only if its call started after the last counted failure was seen.
// One stall of the store (or of this process: a GC pause, a starved CPU)
// times out every call in flight at once; counted as many failures, it would
// open the circuit and fail open for a whole interval. Counted as one, the
// circuit opens only when failures persist for `failures` rounds.
type breaker struct {
	onChange func(from, to circuit)

	mu       sync.Mutex
	failures int
	open     time.Duration
	state    circuit
	fails    int
	lastFail time.Time // when the last counted failure was seen
	until    time.Time // end of the open interval
}

func newBreaker(failures int, open time.Duration, onChange func(from, to circuit)) *breaker {
	return &breaker{failures: failures, open: open, onChange: onChange}
}

// configure changes the thresholds (on reload), keeping the state.
func (b *breaker) configure(failures int, open time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures, b.open = failures, open
}

// allow says whether a call may go to the store now. A true answer in
// the half-open state makes the caller the probe, which must report back
// with success, failure or abandon.
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case circuitClosed:
		return true, false
	case circuitOpen:
		if now.Before(b.until) {
			return false, false
		}
		b.set(circuitHalfOpen)
		return true, true
	}
	return false, false // a probe is in flight
}

// success reports a store call that worked.
func (b *breaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails = 0
	if b.state != circuitClosed {
		b.set(circuitClosed)
	}
}

// failure reports a store call that started at start and failed at now.
func (b *breaker) failure(start, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == circuitHalfOpen {
		b.until = now.Add(b.open)
		b.set(circuitOpen)
		return
	}
	if b.state != circuitClosed || (b.fails > 0 && !start.After(b.lastFail)) {
		return // already open, or in flight when the last failure was seen
	}
	b.fails++
	b.lastFail = now
	if b.fails >= b.failures {
		b.until = now.Add(b.open)
		b.set(circuitOpen)
	}
}

// abandon reports a call that ended without telling anything about the
// store (the client went away): a probe's slot is given back at once.
func (b *breaker) abandon(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == circuitHalfOpen {
		b.set(circuitOpen) // with until in the past: the next call probes
	}
}

// retryIn is how long until the store may be tried again.
func (b *breaker) retryIn(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == circuitOpen {
		return max(0, b.until.Sub(now))
	}
	return 0
}

func (b *breaker) current() circuit {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

func (b *breaker) set(to circuit) {
	from := b.state
	b.state = to
	if b.onChange != nil && from != to {
		b.onChange(from, to)
	}
}
