// Package limiter decides whether a caller may proceed: every rule of a key
// is checked in one atomic Redis script call (or in memory, with the same
// semantics), all-or-nothing.
package limiter

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Algorithm names how a rule counts.
type Algorithm string

const (
	// TokenBucket allows bursts up to Rule.Burst and refills at Limit per Period.
	TokenBucket Algorithm = "token_bucket"
	// SlidingWindow is a sliding window counter: it admits a request when
	// the units admitted in the current fixed window (Period long, aligned to
	// the Unix epoch), plus this request, plus the previous window's units
	// weighted by the share of the previous window still inside the sliding
	// Period, come to at most Limit. The weight is rounded up to 1/2^20.
	//
	// What that guarantees, exactly: at most Limit units in every fixed
	// window, and on average at most Limit per Period. It is an
	// approximation of a true sliding window: when a window's units all came
	// at its very end and the next window's as early as allowed, one interval
	// of Period holds up to 2×Limit−1 units (10 per 2s: 18 within 1.9s),
	// never more. To forbid bursts exactly, use a token bucket with Burst 1
	// (a GCRA): it spaces requests Period/Limit apart, so it admits at most
	// Limit in any interval of Period (and Burst + Limit×t/Period units in
	// any interval t in general).
	SlidingWindow Algorithm = "sliding_window"
	// FixedWindow counts the units admitted in each window of a calendar
	// (Rule.Calendar) and admits a request while they, plus it, come to at
	// most Limit (plus the window's Grant). It is a calendar rule's
	// algorithm, and only theirs.
	FixedWindow Algorithm = "fixed_window"
	// InFlight admits at most Limit requests of a key at once: a check
	// takes a lease on a slot (Rule.Lease) for Period, released when the
	// answer ends (Redis.Release) and renewed while it lasts; a lease
	// whose holder died is reclaimed when its Period has passed. Each
	// request takes one slot, whatever the call's cost.
	InFlight Algorithm = "in_flight"
)

// MaxInFlight is the most requests an in-flight rule may admit at once.
const MaxInFlight = 10000

// Limits on input, checked before any store call.
const (
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 512
	// MaxRules is the most rules one check may carry.
	MaxRules = 16
	// MaxNameLen is the longest rule name accepted, in bytes.
	MaxNameLen = 64
	// MaxBucketLen is the longest Rule.Bucket accepted, in bytes.
	MaxBucketLen = 128
	// maxCapacity keeps capacity×1e6 micro-tokens exact in Lua's doubles (2^53).
	maxCapacity = 1 << 32
	// MaxPeriod is the longest period accepted: it keeps period×limit
	// products exact in doubles.
	MaxPeriod = 400 * 24 * time.Hour
	// MaxCost is the largest Rule.Cost accepted (2^53), and -MaxCost the
	// largest give-back: integers stay
	// exact in Lua's doubles up to there, and any cost above 2^32 already
	// exceeds every rule's capacity.
	MaxCost = 1 << 53
)

// Errors returned for bad input. Each wraps ErrInput as well, so callers
// can tell a caller's mistake from a store failure with one errors.Is.
var (
	ErrInput         = errors.New("limiter: bad input")
	ErrEmptyKey      = errors.New("limiter: empty key")
	ErrKeyTooLong    = errors.New("limiter: key too long")
	ErrNoRules       = errors.New("limiter: no rules")
	ErrTooManyRules  = errors.New("limiter: too many rules")
	ErrInvalidRule   = errors.New("limiter: invalid rule")
	ErrInvalidCost   = errors.New("limiter: cost must be positive")
	ErrBadScriptData = errors.New("limiter: unexpected script reply")
)

// Rule is one limit on a key, e.g. 100 requests per minute.
//
// The yaml tags are the gateway's configuration syntax, which embeds Rule.
type Rule struct {
	// Name identifies the rule in headers, events and Redis keys.
	Name string `yaml:"name"`
	// Limit is how many units the rule admits per Period.
	Limit int64 `yaml:"limit"`
	// Period is the window the limit refers to; zero for a calendar rule.
	Period time.Duration `yaml:"period"`
	// Calendar, when set, makes the rule count per calendar day, week,
	// month or year in a time zone (see Calendar) instead of per Period.
	Calendar *Calendar `yaml:"calendar"`
	// Burst is the token bucket's capacity; zero means Limit. Ignored by
	// SlidingWindow, whose capacity is always Limit.
	Burst int64 `yaml:"burst"`
	// Algorithm defaults to TokenBucket when empty.
	Algorithm Algorithm `yaml:"algorithm"`
	// Shadow rules are decided and reported but never deny, and a shadow
	// rule's own denial never stops the other rules from consuming.
	Shadow bool `yaml:"shadow"`
	// Bucket, when set, names the rule's state in the store instead of
	// Name, so that rules shown (in headers, metrics, events) under one
	// bounded Name can count apart: the gateway's Envoy door names a rule
	// by its descriptor's place in the configuration and buckets it by the
	// descriptor's values. Not configurable; the same characters as Name,
	// at most MaxBucketLen bytes. Two rules of one check may share a Name
	// but not a bucket.
	Bucket string `yaml:"-"`
	// Tag, set beside a Bucket, is the Redis Cluster hash tag its state
	// lives under instead of the key's, so that a key's buckets (the Envoy
	// door's: its key is the domain, shared by every caller) spread over
	// the Cluster. Buckets of one check under one tag share a slot and one
	// atomic call; a check whose buckets land in several slots is decided
	// across them (see Redis.Allow). Not configurable; the same characters
	// as Bucket.
	Tag string `yaml:"-"`
	// Rules of one check under one Tag share a container (one key, read
	// and written once: the Envoy door's descriptors naming one caller);
	// Alone keeps the rule's state in a container of its own under its
	// Tag instead, named by its Bucket too: for a bucket whose values are
	// not bounded by the configuration (a descriptor naming a caller and
	// a path), which would make the shared container grow with them. Not
	// configurable.
	Alone bool `yaml:"-"`
	// WasTag, beside a Tag, is the tag the rule's state had a container
	// of its own under before (the Envoy
	// door's layout until one caller's descriptors shared one). While it
	// is set, a check also checks and charges the rule there, in the same
	// all-or-nothing decision, and answers by the more used of the two: so
	// gateways of both layouts running side by side hold a caller to one
	// limit. Not configurable; the same characters as Tag.
	WasTag string `yaml:"-"`
	// Share marks a rule a split made (Directives.Split): its limit and
	// burst are this gateway's part of one rule's, and the parts of all
	// gateways sum to it. A share that grows took its units from another
	// gateway's, which only clamps what it had, so a raised capacity keeps
	// the tokens the state had instead of adding the difference (which an
	// operator raising a limit gets): adding it would mint the moved units
	// on every resize. A full state starts full at the new capacity, as no
	// state would. Not configurable.
	Share bool `yaml:"-"`
	// Whole, set on a share by Directives.Split, is the rule the share was
	// cut from. Such a share is checked together with its whole: the key's
	// own bucket (the check's key without its "/gw:<Gateway>"), checked and
	// charged alongside in the same atomic call, so whatever the shares and
	// the unsplit callers do, and whenever each switches, the key is held
	// to the rule. Its state lives in the key's Redis Cluster slot. Not
	// configurable.
	Whole Whole `yaml:"-"`
	// Cost, when positive, is what this rule is charged instead of the
	// call's cost; zero charges the call's. It lets one atomic check
	// charge rules differently (the Envoy door's per-descriptor
	// hits_addend: tokens on one descriptor, requests on another), still
	// all-or-nothing. A negative Cost gives -Cost units back instead (the
	// door's is_negative_hits, or what a check that a later one denied
	// had charged): a token bucket's tokens up to its capacity, a sliding
	// window's current count down to 0. Such a rule always admits; like
	// any rule it changes nothing when another rule of the check denies.
	// From -MaxCost to MaxCost. Not configurable.
	Cost int64 `yaml:"-"`
	// Lease names the slot an InFlight rule's check takes (renews, when
	// the key already holds it), or its Release gives back: unique per
	// request, not zero, at most 56 bits. Not configurable.
	Lease uint64 `yaml:"-"`
}

// Whole is the rule a split's share (Rule.Share) was cut from: the same
// name, algorithm, shadow and cost, with the rule's own limit, burst and
// period. The zero Whole marks a rule that is no such share.
type Whole struct {
	// Gateway names the share: the gateway id, or OtherGateways, that the
	// check's key ends in ("<key>/gw:<Gateway>").
	Gateway string
	Limit   int64
	Period  time.Duration
	Burst   int64
}

// rule is the whole of share r as a rule of its own: r but for the limit,
// period and burst it was cut from.
func (w Whole) rule(r Rule) Rule {
	r.Limit, r.Period, r.Burst, r.Share, r.Whole = w.Limit, w.Period, w.Burst, false, Whole{}
	return r
}

// charge is what the rule is charged in a check of cost: Cost when set,
// negative for a give-back.
func (r Rule) charge(cost int64) int64 {
	if r.Algorithm == InFlight {
		// one slot a request, whatever it costs
		if r.Cost < 0 || cost < 0 {
			return -1
		}
		return 1
	}
	if r.Cost != 0 {
		return r.Cost
	}
	return cost
}

// container tells where a rule with a Tag keeps its state, for the deny
// cache: alone or shared, and maybe in its previous container too.
func (r Rule) container() string {
	if r.Alone {
		return "alone:" + r.WasTag
	}
	return r.WasTag
}

// bucket is the rule's identity in the store: Bucket, else Name.
func (r Rule) bucket() string {
	if r.Bucket != "" {
		return r.Bucket
	}
	return r.Name
}

// Capacity is the most units the rule can admit at once (a calendar
// rule's Grant adds to that, for its window only).
func (r Rule) Capacity() int64 {
	if r.algorithm() == TokenBucket && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Window is the time Capacity() units take to refill from empty: Period
// for a sliding window, Capacity × Period / Limit (rounded up to a
// microsecond) for a token bucket. "Capacity() per Window()" is a quota a
// client can compute with: Remaining never exceeds Capacity(), and an
// empty rule is full again after Window(). A calendar rule's is the
// longest its windows can be (a month: 31 days, plus an hour in a zone
// with DST), so that Limit per Window() never promises more than a
// window admits; its ResetAfter says when the window at hand ends.
func (r Rule) Window() time.Duration {
	if r.Calendar != nil {
		return r.Calendar.span()
	}
	if r.algorithm() == SlidingWindow || r.Capacity() == r.Limit {
		return r.Period
	}
	return time.Duration(waitMicros(r.Capacity(), r.Period.Microseconds(), r.Limit)) * time.Microsecond
}

func (r Rule) algorithm() Algorithm {
	if r.Calendar != nil {
		return FixedWindow
	}
	if r.Algorithm == "" {
		return TokenBucket
	}
	return r.Algorithm
}

// Validate reports what is wrong with the rule, if anything.
func (r Rule) Validate() error {
	switch {
	case r.Name == "":
		return fmt.Errorf("%w: empty name", ErrInvalidRule)
	case len(r.Name) > MaxNameLen:
		return fmt.Errorf("%w %q: name longer than %d bytes", ErrInvalidRule, r.Name[:16], MaxNameLen)
	case strings.ContainsAny(r.Name, "{}: \t\r\n"):
		return fmt.Errorf("%w %q: name may not contain braces, colons or spaces", ErrInvalidRule, r.Name)
	case len(r.Bucket) > MaxBucketLen || strings.ContainsAny(r.Bucket, "{}: \t\r\n"):
		return fmt.Errorf("%w %q: bucket longer than %d bytes or holding braces, colons or spaces", ErrInvalidRule, r.Name, MaxBucketLen)
	case len(r.Tag) > MaxBucketLen || strings.ContainsAny(r.Tag, "{}: \t\r\n") || (r.Tag != "" && r.Bucket == ""):
		return fmt.Errorf("%w %q: tag longer than %d bytes, holding braces, colons or spaces, or without a bucket", ErrInvalidRule, r.Name, MaxBucketLen)
	case r.Alone && r.Tag == "":
		return fmt.Errorf("%w %q: alone without a tag", ErrInvalidRule, r.Name)
	case len(r.WasTag) > MaxBucketLen || strings.ContainsAny(r.WasTag, "{}: \t\r\n") || (r.WasTag != "" && r.Tag == ""):
		return fmt.Errorf("%w %q: previous tag longer than %d bytes, holding braces, colons or spaces, or without a tag", ErrInvalidRule, r.Name, MaxBucketLen)
	case r.Limit <= 0:
		return fmt.Errorf("%w %q: limit %d must be positive", ErrInvalidRule, r.Name, r.Limit)
	case r.Calendar != nil && r.validateCalendar() != nil:
		return r.validateCalendar()
	case r.Calendar == nil && r.Algorithm == FixedWindow:
		return fmt.Errorf("%w %q: algorithm %q counts calendar windows: it needs a calendar (e.g. calendar: month)", ErrInvalidRule, r.Name, FixedWindow)
	case r.Calendar == nil && r.Period < time.Millisecond:
		return fmt.Errorf("%w %q: period %v must be at least 1ms", ErrInvalidRule, r.Name, r.Period)
	case r.Period > MaxPeriod:
		return fmt.Errorf("%w %q: period %v longer than %v", ErrInvalidRule, r.Name, r.Period, MaxPeriod)
	case r.Burst < 0:
		return fmt.Errorf("%w %q: burst %d is negative", ErrInvalidRule, r.Name, r.Burst)
	case r.Capacity() > maxCapacity || r.Limit > maxCapacity:
		return fmt.Errorf("%w %q: limit or burst above %d", ErrInvalidRule, r.Name, int64(maxCapacity))
	case r.Cost < -MaxCost || r.Cost > MaxCost:
		return fmt.Errorf("%w %q: cost %d outside %d to %d", ErrInvalidRule, r.Name, r.Cost, -int64(MaxCost), int64(MaxCost))
	}
	switch r.Algorithm {
	case "", TokenBucket, SlidingWindow, FixedWindow:
	case InFlight:
		switch {
		case r.Calendar != nil:
			return fmt.Errorf("%w %q: an in-flight rule counts requests at once, not per calendar window", ErrInvalidRule, r.Name)
		case r.Limit > MaxInFlight:
			return fmt.Errorf("%w %q: at most %d requests in flight", ErrInvalidRule, r.Name, MaxInFlight)
		}
	default:
		return fmt.Errorf("%w %q: unknown algorithm %q (want %q or %q)", ErrInvalidRule, r.Name, r.Algorithm, TokenBucket, SlidingWindow)
	}
	return nil
}

// validateCalendar checks what a calendar rule may not have.
func (r Rule) validateCalendar() error {
	c := r.Calendar
	switch {
	case c.err != nil:
		return fmt.Errorf("%w %q: %w", ErrInvalidRule, r.Name, c.err)
	case c.loc == nil:
		return fmt.Errorf("%w %q: calendar made without ParseCalendar", ErrInvalidRule, r.Name)
	case r.Period != 0:
		return fmt.Errorf("%w %q: a calendar rule has no period (its windows are calendar %ss): leave period out", ErrInvalidRule, r.Name, c.unit)
	case r.Burst != 0:
		return fmt.Errorf("%w %q: a calendar rule has no burst: it admits its limit per %s, all of it at once if asked; leave burst out, or add a token bucket rule beside it for the rate", ErrInvalidRule, r.Name, c.unit)
	case r.Algorithm == SlidingWindow:
		return fmt.Errorf("%w %q: no sliding window of a calendar %s: a calendar rule counts in fixed windows that reset at the boundary; leave algorithm out, or use a sliding window with a period", ErrInvalidRule, r.Name, c.unit)
	case r.Algorithm != "" && r.Algorithm != FixedWindow:
		return fmt.Errorf("%w %q: a calendar rule counts in fixed windows: algorithm %q does not apply; leave it out", ErrInvalidRule, r.Name, r.Algorithm)
	}
	return nil
}

// validate checks one Allow call's input; its errors wrap ErrInput.
func validate(key string, rules []Rule, cost int64) error {
	if err := check(key, rules, cost); err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	return nil
}

func check(key string, rules []Rule, cost int64) error {
	switch {
	case key == "":
		return ErrEmptyKey
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(key), MaxKeyLen)
	case len(rules) == 0:
		return ErrNoRules
	case len(rules) > MaxRules:
		return fmt.Errorf("%w: %d, at most %d", ErrTooManyRules, len(rules), MaxRules)
	case cost <= 0:
		return fmt.Errorf("%w: got %d", ErrInvalidCost, cost)
	}
	seen := make(map[string]bool, len(rules))
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return err
		}
		if err := checkWhole(key, r, rules[0].Whole.Gateway); err != nil {
			return err
		}
		// A bucket is one state, except where a check reads it in its
		// previous container as well (see withWas).
		b := r.bucket()
		if r.Alone {
			b += "\x00" + r.Tag
		}
		if seen[b] {
			return fmt.Errorf("%w %q: duplicate name", ErrInvalidRule, r.bucket())
		}
		seen[b] = true
	}
	return nil
}

// leased reports an in-flight rule of a check without a lease of its own.
func leased(rules []Rule) error {
	for _, r := range rules {
		if r.Algorithm == InFlight && (r.Lease == 0 || r.Lease >= 1<<56) {
			return fmt.Errorf("%w: %w %q: an in-flight check needs a lease id (1 to 2^56-1)", ErrInput, ErrInvalidRule, r.Name)
		}
	}
	return nil
}

// checkWhole reports a share whose whole (Rule.Whole) is not one the
// store can check: every rule of a split's check is a share of one key
// (gateway, the first rule's), within the key's own rule.
func checkWhole(key string, r Rule, gateway string) error {
	w := r.Whole
	if w == (Whole{}) && gateway == "" {
		return nil
	}
	wr := w.rule(r)
	switch {
	case w.Gateway == "" || w.Gateway != gateway:
		return fmt.Errorf("%w %q: a split's rules must all be shares of one gateway's", ErrInvalidRule, r.Name)
	case !r.Share || r.Bucket != "":
		return fmt.Errorf("%w %q: a rule with a whole must be a share without a bucket", ErrInvalidRule, r.Name)
	case len(key) <= len("/gw:"+w.Gateway) || !strings.HasSuffix(key, "/gw:"+w.Gateway):
		return fmt.Errorf("%w %q: key does not end in /gw:%s", ErrInvalidRule, r.Name, w.Gateway)
	}
	if err := wr.Validate(); err != nil {
		return fmt.Errorf("whole of a share: %w", err)
	}
	if wr.Capacity() < r.Capacity() || wr.Limit < r.Limit && r.Period == wr.Period {
		return fmt.Errorf("%w %q: share above its whole", ErrInvalidRule, r.Name)
	}
	return nil
}

// RuleResult is one rule's view of a check.
type RuleResult struct {
	Rule Rule
	// Allowed is whether this rule alone would admit the request.
	Allowed bool
	// Remaining is how many units the rule admits right after this check;
	// never more than Rule.Capacity() (advertise Capacity() per
	// Rule.Window() beside it, not Limit per Period, when Burst ≠ Limit),
	// but for a calendar rule under a grant, whose window admits Limit
	// plus the grant.
	Remaining int64
	// RetryAfter is how long until this rule would admit the request; zero
	// when it does now.
	RetryAfter time.Duration
	// ResetAfter is how long until the rule is back at full capacity: for
	// a calendar rule that has counted anything, until its window ends.
	ResetAfter time.Duration
}

// Decision is the outcome of one check. Being over the limit is a Decision,
// not an error.
type Decision struct {
	// Allowed is true when every enforced rule admitted the request; then
	// every rule consumed. When false, no rule consumed.
	Allowed bool
	// Rules holds one result per rule, in the order given.
	Rules []RuleResult
	// Binding indexes Rules: the enforced rule closest to denying (when
	// allowed) or the one denying for longest (when denied).
	Binding int
	// Reason explains a denial no amount of waiting can lift, e.g. a cost
	// above a rule's capacity. Empty otherwise.
	Reason string
	// Cached is true when the local deny cache answered without a store call.
	Cached bool
	// Time is the store's clock when it decided: Redis' TIME for Redis, the
	// injected clock for Memory; the local clock for a cached denial or a
	// cost no wait can satisfy. Remaining, RetryAfter and ResetAfter count
	// from it.
	Time time.Time
	// Seq numbers the decision among the decisions of its first
	// container (the identity's, or a split share's) in the store, allowed
	// and denied alike, in the same atomic step: 1, 2, ... within the
	// epoch SeqEpoch (when the sequence's first decision was made; when
	// the container expires the next decision starts a new epoch, so an
	// epoch names one sequence). A reader that holds a key's decisions
	// sees a missing one as a gap. Redis numbers; zero when it did not: a
	// cached denial, a cost no wait can satisfy, a check over rules in
	// several Cluster slots (Tags), and every decision of the Memory store
	// (the local fallback's among them, which must not pass for the
	// shared store's).
	Seq      int64
	SeqEpoch time.Time
}

// BindingRule returns the result of the binding rule.
func (d Decision) BindingRule() RuleResult { return d.Rules[d.Binding] }

// RetryAfter is how long until the request would be allowed; zero when allowed.
func (d Decision) RetryAfter() time.Duration {
	if d.Allowed {
		return 0
	}
	return d.Rules[d.Binding].RetryAfter
}

// Violated returns the enforced rules that denied the request.
func (d Decision) Violated() []RuleResult {
	var out []RuleResult
	for _, r := range d.Rules {
		if !r.Allowed && !r.Rule.Shadow {
			out = append(out, r)
		}
	}
	return out
}

// both is rule's result where it was checked in two places, a and b (a
// share and its whole; a bucket and its previous container): it admits
// when both do, has what both have left, and waits for both.
func both(rule Rule, a, b RuleResult) RuleResult {
	return RuleResult{
		Rule:       rule,
		Allowed:    a.Allowed && b.Allowed,
		Remaining:  min(a.Remaining, b.Remaining),
		RetryAfter: max(a.RetryAfter, b.RetryAfter),
		ResetAfter: max(a.ResetAfter, b.ResetAfter),
	}
}

// decide fills Allowed and Binding from the per-rule results.
func decide(rr []RuleResult) Decision {
	d := Decision{Allowed: true, Rules: rr, Binding: -1}
	for _, r := range rr {
		if !r.Allowed && !r.Rule.Shadow {
			d.Allowed = false
		}
	}
	for i, r := range rr {
		if d.Binding >= 0 {
			b := rr[d.Binding]
			if r.Rule.Shadow && !b.Rule.Shadow {
				continue
			}
			if !(b.Rule.Shadow && !r.Rule.Shadow) && !closer(r, b, d.Allowed) {
				continue
			}
		}
		d.Binding = i
	}
	return d
}

// closer reports whether a binds more tightly than b.
func closer(a, b RuleResult, allowed bool) bool {
	if !allowed {
		if a.Allowed != b.Allowed {
			return !a.Allowed
		}
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// overCapacity answers, without a store call, a check no wait can satisfy.
func overCapacity(rules []Rule, cost int64) (Decision, bool) {
	var reasons []string
	for _, r := range rules {
		if c := r.charge(cost); !r.Shadow && c > r.Capacity() {
			reasons = append(reasons, fmt.Sprintf("cost %d exceeds capacity %d of rule %q", c, r.Capacity(), r.Name))
		}
	}
	if reasons == nil {
		return Decision{}, false
	}
	rr := make([]RuleResult, len(rules))
	for i, r := range rules {
		rr[i] = RuleResult{Rule: r, Allowed: r.charge(cost) <= r.Capacity()}
	}
	d := decide(rr)
	d.Reason = strings.Join(reasons, "; ")
	return d, true
}
