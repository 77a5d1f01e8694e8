package limiter

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// RuleState is one rule's live state for an identity.
type RuleState struct {
	Rule      string // the rule's bucket name (Rule.Name or its Bucket)
	Algorithm Algorithm
	Found     bool // false: no state stored, the rule is full
	// Remaining is the whole units available now: tokens, or the limit
	// minus the weighted window count.
	Remaining int64
	// Count and Previous are a sliding window's units in the current and
	// the previous window (0 for token buckets); Count is a calendar
	// rule's units in its current window.
	Count, Previous int64
	// Granted is what Grant added to a calendar rule's current window:
	// the window admits Limit + Granted.
	Granted    int64
	ResetAfter time.Duration // until the rule is full again
}

// KeyState is an identity's live state for a set of rules.
type KeyState struct {
	Key   string
	Rules []RuleState
	// TTL is how long the stored state lives; 0 when there is none.
	TTL time.Duration
	// Time is the store's clock the state was computed at: Redis' TIME,
	// or Memory's injected clock.
	Time time.Time
}

// Inspect reports key's state for rules at Redis' time, consuming nothing
// and writing nothing. It runs allow.lua itself (with cost 0), so it reads
// states, including the previous layout's, exactly as a check would.
func (r *Redis) Inspect(ctx context.Context, key string, rules []Rule) (KeyState, error) {
	if err := validate(key, rules, 1); err != nil {
		return KeyState{}, err
	}
	if hasWas(rules) {
		ext, was := withWas(rules)
		ks, err := r.inspect(ctx, key, ext)
		if err != nil {
			return KeyState{}, err
		}
		return joinWasStates(ks, rules, was), nil
	}
	return r.inspect(ctx, key, rules)
}

func (r *Redis) inspect(ctx context.Context, key string, rules []Rule) (KeyState, error) {
	groups := r.groups(key, rules)
	if len(groups) == 1 {
		res, err := r.script(ctx, r.Keys(key, rules), scriptArgs(rules, 0, r.cfg.Now()))
		if err != nil {
			return KeyState{}, fmt.Errorf("inspect limiter state: %w", err)
		}
		return parseInspect(key, res, rules)
	}
	// Rules in several Cluster slots: one inspection a slot.
	ks := KeyState{Key: key, Rules: make([]RuleState, len(rules))}
	for _, idx := range groups {
		part := rulesAt(rules, idx)
		res, err := r.script(ctx, r.Keys(key, part), scriptArgs(part, 0, r.cfg.Now()))
		if err != nil {
			return KeyState{}, fmt.Errorf("inspect limiter state: %w", err)
		}
		p, err := parseInspect(key, res, part)
		if err != nil {
			return KeyState{}, err
		}
		for j, i := range idx {
			ks.Rules[i] = p.Rules[j]
		}
		ks.TTL = max(ks.TTL, p.TTL)
		if p.Time.After(ks.Time) {
			ks.Time = p.Time
		}
	}
	return ks, nil
}

// groups are the calls Inspect and Reset make of rules: one a Cluster
// slot, of at most MaxRules each; a single group is nil (all of them).
func (r *Redis) groups(key string, rules []Rule) [][]int {
	var groups [][]int
	if r.cluster {
		groups = r.slotGroups(key, rules)
	}
	if len(rules) > MaxRules {
		groups = chunks(groups, len(rules), MaxRules)
	}
	if len(groups) <= 1 {
		return [][]int{nil}
	}
	return groups
}

// parseInspect checks the shape of allow.lua's cost-0 reply before using it.
func parseInspect(key string, res []any, rules []Rule) (KeyState, error) {
	ints, err := replyInts(res, 2+5*len(rules), len(rules))
	if err != nil {
		return KeyState{}, err
	}
	ks := KeyState{Key: key, Rules: make([]RuleState, len(rules))}
	for i, rule := range rules {
		v := ints[5*i:]
		ks.Rules[i] = RuleState{
			Rule: rule.bucket(), Algorithm: rule.algorithm(), Found: v[0] == 1,
			Remaining: v[1], Count: v[2], Previous: v[3],
			ResetAfter: time.Duration(v[4]) * time.Microsecond,
		}
		if rule.Calendar != nil {
			// the script's previous count is a calendar rule's grant
			ks.Rules[i].Previous, ks.Rules[i].Granted = 0, v[3]
		}
	}
	ks.TTL = time.Duration(max(0, ints[len(ints)-2])) * time.Millisecond
	ks.Time = time.UnixMicro(ints[len(ints)-1])
	return ks, nil
}

// Reset refills rules to full for key: their states are dropped (a rule
// without state is full), in the previous layout too, while the states
// of other rules stay as they are. The local deny cache forgets key.
func (r *Redis) Reset(ctx context.Context, key string, rules []Rule) error {
	if err := validate(key, rules, 1); err != nil {
		return err
	}
	if hasWas(rules) {
		// The previous containers too: no gateway of either layout may
		// find what was reset there.
		rules, _ = withWas(rules)
	}
	groups := r.groups(key, rules)
	for _, idx := range groups {
		part := rules
		if len(groups) > 1 {
			part = rulesAt(rules, idx) // one reset a Cluster slot
		}
		if _, err := r.script(ctx, r.Keys(key, part), scriptArgs(part, -1, r.cfg.Now())); err != nil {
			return fmt.Errorf("reset limiter state: %w", err)
		}
	}
	r.forget(key)
	return nil
}

// Clear deletes the state of every rule of key's identity key, and the
// previous layout's key of each rule it held. States of bucketed rules
// (Rule.Bucket: the Envoy door's descriptors) live in containers only
// their rules name (Rule.Tag): Reset them with their rules. The local deny
// cache forgets key.
func (r *Redis) Clear(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	res, err := r.script(ctx, []string{identityKey(r.cfg.Prefix, key)}, []any{-2, 1, 0, ""})
	if err != nil {
		return fmt.Errorf("clear limiter state: %w", err)
	}
	if len(res)%2 != 0 {
		return fmt.Errorf("%w: %d values for name and kind pairs", ErrBadScriptData, len(res))
	}
	var old []string
	for i := 0; i < len(res); i += 2 {
		name, ok := res[i].(string)
		kind, ok2 := res[i+1].(int64)
		if !ok || !ok2 {
			return fmt.Errorf("%w: state %d is %T, %T, want name and kind", ErrBadScriptData, i/2, res[i], res[i+1])
		}
		algo := TokenBucket
		if kind == 2 {
			algo = SlidingWindow
		}
		if kind < 3 {
			// (the previous layout had no calendar or in-flight rules)
			old = append(old, legacyKey(r.cfg.Prefix, key, name, algo))
		}
	}
	// A split's share of key "<k>/gw:<g>" lives beside k's container (see
	// containerKey); any "/gw:" may be where k ends, and a key that is no
	// share has nothing there.
	var shares []string
	for i := strings.Index(key, "/gw:"); i > 0; {
		shares = append(shares, identityKey(r.cfg.Prefix, key[:i])+key[i:])
		j := strings.Index(key[i+1:], "/gw:")
		if j < 0 {
			break
		}
		i += 1 + j
	}
	// A second call: the script's own keys are declared up front, and
	// the old names were unknown until it ran (they share its slot; the
	// shares' containers may not).
	pipe := r.rdb.Pipeline()
	if len(old) > 0 {
		pipe.Del(ctx, old...)
	}
	for _, k := range shares {
		pipe.Del(ctx, k)
	}
	if len(old)+len(shares) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("clear limiter state of the previous layout or a split's share: %w", err)
		}
	}
	r.forget(key)
	return nil
}

// forget drops key's entries from the local deny cache, so a reset key is
// not denied from memory until its old retry time. A check in flight
// while the reset runs may still cache its denial.
func (r *Redis) forget(key string) {
	if r.deny != nil {
		r.deny.forget(key)
	}
}

func checkKey(key string) error {
	switch {
	case key == "":
		return ErrEmptyKey
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(key), MaxKeyLen)
	}
	return nil
}

// Inspect reports key's state for rules at the store's clock, consuming
// nothing, computed by the same functions as Allow.
func (m *Memory) Inspect(_ context.Context, key string, rules []Rule) (KeyState, error) {
	if err := validate(key, rules, 1); err != nil {
		return KeyState{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := m.now()
	now := at.UnixMicro()
	ks := KeyState{Key: key, Rules: make([]RuleState, len(rules)), Time: at}
	for i, rule := range rules {
		st, _ := m.lookup(key, rule, now)
		rs := RuleState{Rule: rule.bucket(), Algorithm: rule.algorithm(), Found: st != nil}
		switch rule.algorithm() {
		case FixedWindow:
			e := fixedWindow(st, rule, 0, now, false)
			rs.Remaining, rs.ResetAfter = e.before.remaining, time.Duration(e.before.reset)*time.Microsecond
			rs.Count, rs.Granted = e.next.cur, e.next.granted
		case InFlight:
			e := inFlight(st, rule, 0, now)
			rs.Remaining, rs.ResetAfter = e.before.remaining, time.Duration(e.before.reset)*time.Microsecond
			rs.Count = int64(len(e.next.leases))
		case SlidingWindow:
			e := slidingWindow(st, rule, 0, now, false)
			rs.Remaining, rs.ResetAfter = e.before.remaining, time.Duration(e.before.reset)*time.Microsecond
			rs.Count, rs.Previous = e.next.cur, e.next.prev
		default:
			e := tokenBucket(st, rule, 0, now, false)
			rs.Remaining, rs.ResetAfter = e.before.remaining, time.Duration(e.before.reset)*time.Microsecond
		}
		ks.Rules[i] = rs
	}
	for _, st := range m.ids[key] {
		ks.TTL = max(ks.TTL, time.Duration(st.expires-now)*time.Microsecond)
	}
	return ks, nil
}

// Reset refills rules to full for key, leaving its other rules' states.
func (m *Memory) Reset(_ context.Context, key string, rules []Rule) error {
	if err := validate(key, rules, 1); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rule := range rules {
		// the rule's state under any algorithm, as allow.lua drops it
		for _, algo := range append(families, InFlight) {
			if st := m.state[legacyKey("mem", key, rule.bucket(), algo)]; st != nil {
				m.drop(st)
			}
		}
	}
	return nil
}

// Clear deletes the state of every rule of key.
func (m *Memory) Clear(_ context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.ids[key]) > 0 {
		m.drop(m.ids[key][0])
	}
	return nil
}

// GrantResult is a calendar rule's window after a grant.
type GrantResult struct {
	Rule string // the rule's bucket name
	// Granted is what the window's grants add up to now: the window
	// admits the rule's Limit plus Granted.
	Granted int64
	// Count is what the window has admitted, Remaining what it still may.
	Count, Remaining int64
	// Start and End bound the window the grant went to; it ends there.
	Start, End time.Time
	// Time is the store's clock the grant was made at.
	Time time.Time
}

// maxGrant is the most units a window's grant holds (allow.lua's
// GRANTMAX), and the largest change one grant asks for.
const maxGrant = 1 << 32

// checkGrant checks a grant's input; its errors wrap ErrInput.
func checkGrant(key string, rule Rule, units int64) error {
	if err := validate(key, []Rule{rule}, 1); err != nil {
		return err
	}
	switch {
	case rule.Calendar == nil:
		return fmt.Errorf("%w: %w %q: only a calendar rule's window takes a grant", ErrInput, ErrInvalidRule, rule.Name)
	case units == 0 || units > maxGrant || units < -maxGrant:
		return fmt.Errorf("%w: grant of %d units: want 1 to %d, or as many negative to take back", ErrInput, units, int64(maxGrant))
	}
	return nil
}

// Grant adds units to what key may use of the calendar rule in the window
// that holds Redis' time now, or takes back -units of what was granted
// (never below none: the window then admits the rule's Limit again). The
// grant ends with the window. Units already counted stay counted. The
// local deny cache forgets key; other gateways' caches hold a calendar
// rule's denial for a second at most (see calendarDenyHold).
func (r *Redis) Grant(ctx context.Context, key string, rule Rule, units int64) (GrantResult, error) {
	if err := checkGrant(key, rule, units); err != nil {
		return GrantResult{}, err
	}
	rule.Cost = units
	rules := []Rule{rule}
	res, err := r.script(ctx, r.Keys(key, rules), scriptArgs(rules, -3, r.cfg.Now()))
	if err != nil {
		return GrantResult{}, fmt.Errorf("grant limiter units: %w", err)
	}
	ints, err := replyInts(res, 6, 1)
	if err != nil {
		return GrantResult{}, err
	}
	r.forget(key)
	return GrantResult{Rule: rule.bucket(), Granted: ints[0], Count: ints[1], Remaining: ints[2],
		Start: time.UnixMicro(ints[3]), End: time.UnixMicro(ints[4]), Time: time.UnixMicro(ints[5])}, nil
}

// Grant adds units to key's allowance of the calendar rule in the window
// holding the store's clock, or takes back -units of what was granted;
// see Redis.Grant.
func (m *Memory) Grant(_ context.Context, key string, rule Rule, units int64) (GrantResult, error) {
	if err := checkGrant(key, rule, units); err != nil {
		return GrantResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := m.now()
	now := at.UnixMicro()
	st, other := m.lookup(key, rule, now)
	e := fixedWindow(st, rule, 0, now, false)
	next := e.next
	next.granted = min(maxGrant, max(0, next.granted+units))
	m.put(key, ruleKey("mem", key, rule), next)
	if other != nil {
		m.drop(other)
	}
	return GrantResult{Rule: rule.bucket(), Granted: next.granted, Count: next.cur, Remaining: max(0, rule.Limit+next.granted-next.cur),
		Start: time.UnixMicro(next.window), End: time.UnixMicro(next.window + next.period), Time: at}, nil
}
