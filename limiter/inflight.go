package limiter

import (
	"context"
	"fmt"
)

// inFlightRules checks the rules of a Renew or Release: in-flight rules
// only, each with its lease, charged one slot (cost 1) or given it back.
func inFlightRules(key string, rules []Rule, give bool) ([]Rule, error) {
	if err := validate(key, rules, 1); err != nil {
		return nil, err
	}
	if err := leased(rules); err != nil {
		return nil, err
	}
	out := make([]Rule, len(rules))
	for i, r := range rules {
		if r.Algorithm != InFlight {
			return nil, fmt.Errorf("%w: %w %q: only in-flight rules hold leases", ErrInput, ErrInvalidRule, r.Name)
		}
		r.Cost = 1
		if give {
			r.Cost = -1
		}
		out[i] = r
	}
	return out, nil
}

// Renew extends the leases that a check of key under rules (in-flight
// rules only, as the check had them, Lease and all) took, by their
// Period from now: a long answer's holder renews well within it, so that
// its slot is reclaimed only after its holder died. A lease already
// reclaimed is taken again if a slot is free; the decision says whether
// it was (Allowed false: every slot is taken, the answer goes on past the
// limit). Unnumbered, never cached.
func (r *Redis) Renew(ctx context.Context, key string, rules []Rule) (Decision, error) {
	rules, err := inFlightRules(key, rules, false)
	if err != nil {
		return Decision{}, err
	}
	d, _, err := r.decideOne(ctx, key, rules, 1, how{at: r.cfg.Now()})
	return d, err
}

// Release gives back the slots the leases of rules (see Renew) hold, once
// the answer has ended; a lease already reclaimed is no slot.
func (r *Redis) Release(ctx context.Context, key string, rules []Rule) (Decision, error) {
	rules, err := inFlightRules(key, rules, true)
	if err != nil {
		return Decision{}, err
	}
	d, _, err := r.decideOne(ctx, key, rules, 1, how{at: r.cfg.Now()})
	return d, err
}

// Renew is Redis.Renew in memory.
func (m *Memory) Renew(_ context.Context, key string, rules []Rule) (Decision, error) {
	rules, err := inFlightRules(key, rules, false)
	if err != nil {
		return Decision{}, err
	}
	return m.allow(key, rules, 1, false), nil
}

// Release is Redis.Release in memory.
func (m *Memory) Release(_ context.Context, key string, rules []Rule) (Decision, error) {
	rules, err := inFlightRules(key, rules, true)
	if err != nil {
		return Decision{}, err
	}
	return m.allow(key, rules, 1, false), nil
}
