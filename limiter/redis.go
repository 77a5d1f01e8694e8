package limiter

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// rediser is what Redis needs of a go-redis client: UniversalClient fits,
// so standalone, Sentinel and Cluster all work.
type rediser interface {
	Pipeline() redis.Pipeliner
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// Config tunes the Redis limiter.
type Config struct {
	// Prefix starts every Redis key; default "rl".
	Prefix string
	// Batch is the most checks sent in one pipeline; default 128.
	Batch int
	// Senders is how many pipelines may be in flight at once; default 1.
	// Batching happens only when all senders are busy, so a lone request
	// never waits; under load, fewer senders make longer pipelines, and a
	// pipeline's round trip (a write and a read, for the gateway and for
	// Redis, and the script call's own cost) costs more CPU than a check
	// in it. One keeps the next pipeline filling while this one is in
	// flight: on the proxy path (decisions spread out by the proxying
	// between them) two senders made pipelines of 5.5 checks, one of 10,
	// for 8 % less Redis CPU and 7 % more requests a second; the check
	// path, batched well either way, was unchanged.
	Senders int
	// DenyCache is how many keys the local deny cache holds; default 65536.
	// Negative disables the cache.
	DenyCache int
	// Now is the local clock, used only by the deny cache; default time.Now.
	Now func() time.Time
	// PreviousLayout makes every check also read the previous layout's
	// keys (a hash per rule, written by releases before the identity's
	// one key) for the rules that have no state of their own yet: turn it
	// on while upgrading from such a release, for the longest period of
	// any rule, then off. Off by default: it costs every new identity's
	// check an EXISTS of its rules' old keys.
	PreviousLayout bool
	// Coalesce is the most checks carried by one script call; default 32.
	// Checks already pipelined together (see Senders) run as one call per
	// Cluster slot (on one server, all of them), so the call's own cost is
	// paid once for many; 1 sends each check as a call of its own.
	Coalesce int
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "rl"
	}
	if c.Batch <= 0 {
		c.Batch = 128
	}
	if c.Senders <= 0 {
		c.Senders = 1
	}
	if c.Coalesce <= 0 {
		c.Coalesce = 32
	}
	if c.DenyCache == 0 {
		c.DenyCache = 65536
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("limiter: prefix %q may not contain braces", c.Prefix)
	}
	return nil
}

// Redis checks rules against Redis with one script call per check. Checks
// that arrive while every sender is busy are pipelined together.
type Redis struct {
	rdb   rediser
	cfg   Config
	deny  *denyCache
	queue chan *call
	// slots holds the idle senders: taking one is the right to run a
	// pipeline, with the buffers it reuses.
	slots chan *sender
	calls sync.Pool // *call, reused once its caller has read the result
	// cluster: only checks of one slot may share a script call.
	cluster bool
	via     atomic.Int32 // viaFunction or viaScript
	loaded  atomic.Bool  // Warm has loaded the library

	checks, pipelines, cached, reloads, unstable, migrating atomic.Int64
	across, givenBack, giveBackFailed                       atomic.Int64
}

// Stats counts what the limiter did since it started.
type Stats struct {
	Checks    int64 // checks sent to Redis
	Pipelines int64 // round trips that carried them
	Cached    int64 // denials answered by the local deny cache
	Reloads   int64 // scripts reloaded after NOSCRIPT
	// Unstable counts checks sent again without the previous layout's
	// keys after TRYAGAIN (their Cluster slot was being migrated).
	Unstable int64
	// Migrating counts checks tried again after waiting, because even so
	// Redis answered TRYAGAIN: their containers were split between the
	// two sides of a migrating slot, or not all written yet.
	Migrating int64
	// Across counts checks whose rules lay in several Cluster slots (see
	// Allow); GivenBack those of them denied in one slot after another
	// had charged, and given back; GiveBackFailed the give-backs that
	// failed, leaving a charge for a denied request (never an admission
	// over a limit).
	Across, GivenBack, GiveBackFailed int64
}

// Stats returns the counters so far.
func (r *Redis) Stats() Stats {
	return Stats{Checks: r.checks.Load(), Pipelines: r.pipelines.Load(), Cached: r.cached.Load(), Reloads: r.reloads.Load(), Unstable: r.unstable.Load(), Migrating: r.migrating.Load(),
		Across: r.across.Load(), GivenBack: r.givenBack.Load(), GiveBackFailed: r.giveBackFailed.Load()}
}

// call is one check on its way through a pipeline. The sender that runs
// it signals done once, after writing res and err; done has room for that
// signal, so the send never blocks, even for a caller that gave up.
type call struct {
	ctx  context.Context
	keys []string
	// containers is how many of keys are containers; the rest are the
	// previous layout's keys (see Keys).
	containers int
	args       []any
	sent       time.Time
	// res is the call's reply: a packed string for a check, the mode's
	// array for an inspection, reset or listing.
	res  any
	err  error
	done chan struct{}
	// deadline, when set, bounds the call besides ctx, without a context
	// of its own: timer (kept with the pooled call) wakes its caller then,
	// and the sender bounds the pipeline by it (see AllowUncachedWithin).
	deadline time.Time
	timer    *time.Timer
}

// bound is c's deadline: its own, else its context's.
func (c *call) bound() (time.Time, bool) {
	if !c.deadline.IsZero() {
		return c.deadline, true
	}
	return c.ctx.Deadline()
}

// sender is the state of one pipeline slot, reused by every pipeline that
// slot runs: no pipeline allocates its batch or its command list.
type sender struct {
	batch  []*call
	groups []group
}

// newCall returns a pooled call for ctx: keys, the first containers of
// them containers (see Keys), and the script's args.
func (r *Redis) newCall(ctx context.Context, keys []string, containers int, args []any) *call {
	c, _ := r.calls.Get().(*call)
	if c == nil {
		c = &call{done: make(chan struct{}, 1)}
	}
	c.ctx, c.keys, c.containers, c.args, c.sent = ctx, keys, containers, args, r.cfg.Now()
	return c
}

// recycle returns c to the pool. Only a caller that received c's done
// signal (or whose c was never queued) may: no sender touches c after.
func (r *Redis) recycle(c *call) {
	*c = call{done: c.done, timer: c.timer}
	r.calls.Put(c)
}

// New returns a limiter on the given client. It starts no goroutine of its
// own: senders live only while checks are waiting, so there is nothing to
// stop. Configure the client with MaxRetries -1: a check retried after a
// write timeout may have run once already and would consume twice; the
// caller's failure policy is the right place to handle the error.
func New(rdb rediser, cfg Config) (*Redis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Redis{
		rdb:   rdb,
		cfg:   cfg,
		queue: make(chan *call, cfg.Batch*cfg.Senders),
		slots: make(chan *sender, cfg.Senders),
	}
	_, r.cluster = rdb.(*redis.ClusterClient)
	if cfg.DenyCache > 0 {
		r.deny = newDenyCache(cfg.DenyCache)
	}
	for range cfg.Senders {
		r.slots <- &sender{batch: make([]*call, 0, cfg.Batch)}
	}
	return r, nil
}

// Keys returns the Redis keys a check of key against rules touches: the
// containers holding the rules' states (see layout), then, with
// Config.PreviousLayout, each rule's key in the previous layout, read
// while the rule has no state of its own yet (so a fleet upgrading
// mid-window forgets nothing). They share one hash tag, so one Cluster
// slot.
//
// A split's shares (Rule.Whole) have no previous layout: the keys are
// their container alone.
func (r *Redis) Keys(key string, rules []Rule) []string {
	cont, m := layout(rules)
	return r.keys(key, rules, cont, m)
}

// keys is Keys for rules laid out as layout did.
func (r *Redis) keys(key string, rules []Rule, cont []int, m int) []string {
	old := r.cfg.PreviousLayout && rules[0].Whole.Gateway == ""
	n := m
	if old {
		n += len(rules)
	}
	keys := make([]string, m, n)
	for i, rule := range rules {
		keys[cont[i]] = containerKey(r.cfg.Prefix, key, rule)
	}
	if old {
		for _, rule := range rules {
			keys = append(keys, ruleKey(r.cfg.Prefix, key, rule))
		}
	}
	return keys
}

// layout places rules in containers, the string keys their states are
// packed in: the rules named by Name share the identity's key
// (<prefix>:{<key>}), so a plan's check reads and writes one key; rules
// with a Bucket and one Tag (the Envoy door's descriptors naming one
// caller) share the tag's key (<prefix>:{<tag>}::<key>:); any other rule
// with a Bucket (one Alone, or without a Tag) has a key of its own
// (<prefix>:{<tag or key>}…:<bucket>), so that no container grows with
// values the configuration does not bound. cont[i] is rule i's container
// index (0-based); m how many there are.
//
// A split's shares (Rule.Whole) are packed in their own container, beside
// the key's (see containerKey); in the check with their wholes
// (withWholes) the wholes, rules of their own, are in the key's.
func layout(rules []Rule) (cont []int, m int) {
	cont = make([]int, len(rules))
	shared, split := -1, -1
	for i, rule := range rules {
		switch {
		case rule.Tag != "" && !rule.Alone && rule.Whole.Gateway == "":
			j := slices.IndexFunc(rules[:i], func(o Rule) bool { return o.Tag == rule.Tag && !o.Alone && o.Whole.Gateway == "" })
			if j >= 0 {
				cont[i] = cont[j]
				continue
			}
			cont[i] = m
			m++
		case rule.Bucket != "":
			cont[i] = m
			m++
		case rule.Whole.Gateway != "":
			if split < 0 {
				split = m
				m++
			}
			cont[i] = split
		case shared < 0:
			shared = m
			cont[i] = m
			m++
		default:
			cont[i] = shared
		}
	}
	return cont, m
}

// identityKey is the container of key's named rules. The key is the
// Redis Cluster hash tag, which ends at the first '}': a key holding one
// would move the identity into another key's slot, and one starting with
// '}' leaves the tag empty, so each key is hashed whole and a check's keys
// land in different slots (CROSSSLOT: every check fails). A key with
// braces is escaped ('%', '{', '}' as %25, %7B, %7D) and marked by a '~'
// after the tag, where no brace-free key's names have one, so no two keys
// share a name.
func identityKey(prefix, key string) string {
	if !strings.ContainsAny(key, "{}") {
		return prefix + ":{" + key + "}"
	}
	return prefix + ":{" + braceEscaper.Replace(key) + "}~"
}

var braceEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// containerKey is the container rule's state lives in. A split's share
// (Rule.Whole) of key "<k>/gw:<g>" lives in "<identity key of k>/gw:<g>",
// in k's slot, so that its check reaches k's own bucket too; no other
// key's names have a '/' right after the tag.
func containerKey(prefix, key string, rule Rule) string {
	if g := rule.Whole.Gateway; g != "" {
		whole := len(key) - len("/gw:") - len(g)
		return identityKey(prefix, key[:whole]) + key[whole:]
	}
	if rule.Tag != "" {
		// "::" never follows a tag otherwise (a bucket holds no colon).
		// A container of its own ends with its bucket, after the last
		// colon; a shared one with a colon, which no bucket's does: so no
		// two collide.
		// (A tag holds no brace: identityKey's escaping is not needed.)
		if rule.Alone {
			return prefix + ":{" + rule.Tag + "}::" + key + ":" + rule.Bucket
		}
		return prefix + ":{" + rule.Tag + "}::" + key + ":"
	}
	if rule.Bucket != "" {
		return identityKey(prefix, key) + ":" + rule.Bucket
	}
	return identityKey(prefix, key)
}

// ruleKey is the key of one rule's state in the previous layout (a hash
// per rule), and the memory store's name for it.
func ruleKey(prefix, key string, rule Rule) string {
	return legacyKey(prefix, key, rule.bucket(), rule.algorithm())
}

// families are the algorithms whose states differ: a token bucket's
// capacity does not change its family.
var families = []Algorithm{TokenBucket, SlidingWindow, FixedWindow}

func legacyKey(prefix, key, bucket string, algo Algorithm) string {
	suffix := "tb"
	switch algo {
	case SlidingWindow:
		suffix = "sw"
	case FixedWindow:
		suffix = "fw"
	case InFlight:
		suffix = "if"
	}
	return identityKey(prefix, key) + ":" + bucket + ":" + suffix
}

// Allow checks cost units of key against every rule in one Redis call (a
// rule with a Cost of its own is charged that instead). If any enforced
// rule denies, no rule consumes. An error means the store
// failed; the decision is then unknown.
//
// A denial is remembered in the local deny cache, which Allow asks first
// (CachedDenial); AllowUncachedWithin is Allow for a caller that asked it
// itself, before setting up the call.
func (r *Redis) Allow(ctx context.Context, key string, rules []Rule, cost int64) (Decision, error) {
	return r.allow(ctx, key, rules, cost, true, 0)
}

// AllowUncachedWithin is Allow without asking the deny cache, given
// within (> 0) to answer in besides ctx: past it the check fails with
// context.DeadlineExceeded. It
// costs no context and timer a check, as a ctx with that deadline would
// (the gateway's store deadline, on every request): the timer is kept
// with the pooled call, and a pipeline's deadline is set from its calls'.
func (r *Redis) AllowUncachedWithin(ctx context.Context, within time.Duration, key string, rules []Rule, cost int64) (Decision, error) {
	if within <= 0 {
		return Decision{}, fmt.Errorf("run limiter script: %w", context.DeadlineExceeded)
	}
	return r.allow(ctx, key, rules, cost, false, within)
}

func (r *Redis) allow(ctx context.Context, key string, rules []Rule, cost int64, cached bool, within time.Duration) (Decision, error) {
	if err := validate(key, rules, cost); err != nil {
		return Decision{}, err
	}
	if err := leased(rules); err != nil {
		return Decision{}, err
	}
	if d, ok := overCapacity(rules, cost); ok {
		d.Time = r.cfg.Now()
		return d, nil
	}
	if cached {
		if d, ok := r.CachedDenial(key, rules, cost); ok {
			return d, nil
		}
	}
	check, was := rules, []int(nil)
	if hasWas(rules) {
		check, was = withWas(rules)
	}
	d, sent, err := r.decide(ctx, key, check, cost, within)
	if err != nil {
		return Decision{}, err
	}
	if was != nil {
		d = joinWas(d, rules, was)
	}
	if r.deny != nil && !d.Allowed {
		r.deny.put(key, rules, cost, sent, r.cfg.Now(), d, denyHold(d))
	}
	return d, nil
}

// decide is Allow's check of valid rules, not in the deny cache: in one
// call where it can be, else across calls (see allowAcross); it also
// returns when it was sent, for the deny cache. within (> 0) bounds it
// besides ctx (see AllowUncachedWithin).
func (r *Redis) decide(ctx context.Context, key string, rules []Rule, cost int64, within time.Duration) (Decision, time.Time, error) {
	at := r.cfg.Now()
	// Rules without a Tag all live under the key's tag: one slot, and no
	// slots to compute on the common path.
	var groups [][]int
	if r.cluster && slices.ContainsFunc(rules, func(r Rule) bool { return r.Tag != "" }) {
		groups = r.slotGroups(key, rules)
	}
	if len(rules) > MaxRules {
		// Only with the previous containers (withWas): a call carries at
		// most MaxRules.
		groups = chunks(groups, len(rules), MaxRules)
	}
	if len(groups) > 1 {
		if within > 0 {
			// (a check across slots, rare: bounded by a context)
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, within)
			defer cancel()
		}
		if mixed(rules) {
			sent := r.cfg.Now()
			d, err := r.chargeThenGiveBack(ctx, key, rules, cost)
			return d, sent, err
		}
		return r.allowAcross(ctx, key, rules, cost, groups)
	}
	h := how{seq: true, at: at}
	if within > 0 {
		h.deadline = at.Add(within)
	}
	return r.decideOne(ctx, key, rules, cost, h)
}

// how is what kind of call decideOne makes: a numbered decision (seq), or
// a settlement (over: every charge admits, overdrawing; see Settle), its
// give-backs named by the windows around at; deadline, when set, bounds
// the call besides ctx (see AllowUncachedWithin).
type how struct {
	seq, over    bool
	at, deadline time.Time
}

// decideOne is decide's check of rules that one call can carry.
func (r *Redis) decideOne(ctx context.Context, key string, rules []Rule, cost int64, h how) (Decision, time.Time, error) {
	check := rules
	cont, m := layout(rules)
	var keys []string
	if whole, split := wholeKey(key, rules); split {
		// The shares' container and the key's own (no previous layout:
		// shares never had one there).
		check = withWholes(rules)
		keys = []string{containerKey(r.cfg.Prefix, key, rules[0]), identityKey(r.cfg.Prefix, whole)}
		cont, m = layout(check)
	} else {
		keys = r.keys(key, rules, cont, m)
	}
	args := packArgs(check, cont, m, cost, h.at)
	// Numbered in the first container's sequence record, or a settlement
	// (see allow.lua's seq).
	switch {
	case h.over:
		nameWindows(check, args, h.at)
		args[2] = 2
	case h.seq:
		args[2] = 1
	}
	var (
		res    any
		sent   time.Time
		cerr   error
		cancel context.CancelFunc
	)
	for try, waited := 0, time.Duration(0); ; try++ {
		res, sent, cerr = r.check(ctx, h.deadline, keys, m, args)
		if !isTryAgain(cerr) {
			break
		}
		if !h.deadline.IsZero() {
			// Waiting out a migration (rare) reads the deadline off ctx.
			// (No defer: a deferred call in the loop costs every check.)
			ctx, cancel = context.WithDeadline(ctx, h.deadline)
			h.deadline = time.Time{}
		}
		if !r.awaitMigration(ctx, try, &waited) {
			break
		}
	}
	if cancel != nil {
		cancel()
	}
	if isTryAgain(cerr) {
		return Decision{}, sent, fmt.Errorf("run limiter script: %w: %w", ErrMigrating, cerr)
	}
	if cerr != nil {
		return Decision{}, sent, fmt.Errorf("run limiter script: %w", cerr)
	}
	d, err := parseReply(res, check, h.seq && !h.over)
	if err != nil {
		return Decision{}, sent, err
	}
	if len(check) != len(rules) {
		d = joinWholes(d, rules)
	}
	return d, sent, nil
}

// check runs the script once for Allow, through a pipeline: its reply,
// when it was sent, and the error of the call, of ctx, or of deadline
// (when set) passing.
func (r *Redis) check(ctx context.Context, deadline time.Time, keys []string, containers int, args []any) (any, time.Time, error) {
	c := r.newCall(ctx, keys, containers, args)
	var expired <-chan time.Time
	if !deadline.IsZero() {
		c.deadline = deadline
		left := time.Until(deadline)
		if c.timer == nil {
			c.timer = time.NewTimer(left)
		} else {
			c.timer.Reset(left)
		}
		expired = c.timer.C
	}
	if !r.submit(c, expired) {
		err := ctx.Err()
		if err == nil {
			err = context.DeadlineExceeded
		}
		c.stop()
		r.recycle(c)
		return nil, time.Time{}, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// c stays the sender's: it is not recycled.
		c.stop()
		return nil, time.Time{}, ctx.Err()
	case <-expired:
		return nil, time.Time{}, context.DeadlineExceeded
	}
	c.stop()
	res, err, sent := c.res, c.err, c.sent
	r.recycle(c)
	return res, sent, err
}

// stop stops c's timer, if it has one running: a pooled call's timer
// fires for no later use.
func (c *call) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// Waiting out a migrating slot (see awaitMigration): the first wait, the
// longest one, and the most a caller without a deadline waits in all. A
// slot of a few keys moves in milliseconds; one left migrating by a
// reshard that died stays so until someone fixes it, which no caller
// should wait for.
const (
	firstMigrationWait = time.Millisecond
	maxMigrationWait   = 50 * time.Millisecond
	maxMigrationWaits  = time.Second
)

// awaitMigration waits before try+1 of a check that met TRYAGAIN even
// without the previous layout's keys: a check of several containers (the
// Envoy door's descriptors) in a Cluster slot being migrated, which Redis
// refuses until one node holds every one of them, i.e. until the slot has
// moved (a container not written yet is on neither side). TRYAGAIN means
// the script did not run, so trying again charges nothing twice. The wait
// doubles from firstMigrationWait up to maxMigrationWait; it reports false
// (answer the error: the caller's failure policy decides) when the wait
// would not end before ctx's deadline, so that the policy still has time
// to answer, or past maxMigrationWaits in all without a deadline.
func (r *Redis) awaitMigration(ctx context.Context, try int, waited *time.Duration) bool {
	wait := maxMigrationWait
	if try < 16 {
		wait = min(wait, firstMigrationWait<<try)
	}
	if dl, ok := ctx.Deadline(); ok {
		if time.Until(dl) <= wait {
			return false
		}
	} else if *waited+wait > maxMigrationWaits {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	*waited += wait
	r.migrating.Add(1)
	return true
}

// CachedDenial answers from the local deny cache alone, without a store
// call: a denial Redis gave key for these rules and cost that still holds.
// While the store is unavailable the gateway asks it before its failure
// policy, so a caller already over its limit is not let through.
func (r *Redis) CachedDenial(key string, rules []Rule, cost int64) (Decision, bool) {
	if r.deny == nil {
		return Decision{}, false
	}
	d, ok := r.deny.get(key, rules, cost, r.cfg.Now())
	if ok {
		r.cached.Add(1)
	}
	return d, ok
}

// submit sends c at once when a sender is idle; otherwise it queues c for
// the next pipeline. It gives up (false) when c's context ends or expired
// fires first, so a full queue never holds a caller past its deadline.
func (r *Redis) submit(c *call, expired <-chan time.Time) bool {
	select {
	case s := <-r.slots:
		go r.send(s, c)
		return true
	default:
	}
	select {
	case r.queue <- c:
		// A sender may have gone idle between the two selects; make sure
		// someone drains the queue.
		select {
		case s := <-r.slots:
			go r.send(s, nil)
		default:
		}
		return true
	case s := <-r.slots:
		go r.send(s, c)
		return true
	case <-c.ctx.Done():
		return false
	case <-expired:
		return false
	}
}

// send runs first (if any) plus whatever is queued, as one pipeline, and
// repeats while the queue is non-empty. It gives its slot back when done.
func (r *Redis) send(s *sender, first *call) {
	batch := s.batch[:0]
	if first != nil {
		batch = append(batch, first)
	}
	for {
	drain:
		for len(batch) < r.cfg.Batch {
			select {
			case c := <-r.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		if len(batch) == 0 {
			r.slots <- s
			// A call queued after our last drain but before we freed the
			// slot would otherwise wait for the next submit.
			if len(r.queue) > 0 {
				select {
				case s = <-r.slots:
					continue
				default:
				}
			}
			return
		}
		r.run(s, batch)
		// The calls are their callers' again; drop them so the reused
		// batch does not keep them alive.
		clear(batch)
		batch = batch[:0]
	}
}

// scriptArgs is one check's part of allow.lua's ARGV, for a check (cost
// > 0), an inspection (0), a reset (-1) or a grant (-3) of rules; see the
// script's header. now is the gateway's clock, which only places calendar
// rules' windows: the script picks the one holding Redis' time. A rule's own Cost rides in its packed fields; cost stays the
// mode switch. The rules' fields go in one packed argument that names no
// state (so the script's plan of it serves every identity), and the
// token bucket's rate is reduced here, once, rather than by a gcd in Lua;
// each rule's record prefix (its bucket's name and kind) follows as an
// argument of its own.
func scriptArgs(rules []Rule, cost int64, now time.Time) []any {
	cont, m := layout(rules)
	return packArgs(rules, cont, m, cost, now)
}

// packArgs is scriptArgs for rules laid out as layout did.
func packArgs(rules []Rule, cont []int, m int, cost int64, now time.Time) []any {
	// The rules' fields, then their record prefixes, in one allocation.
	size := ruleSize * len(rules)
	for _, rule := range rules {
		size += len(rule.bucket()) + 2
	}
	b := make([]byte, 0, size)
	args := make([]any, 4, 4+len(rules))
	var kindsArr [MaxRules]byte
	kinds := kindsArr[:0]
	for i, rule := range rules {
		kind, pn, pd := 0, int64(0), int64(0)
		period, capacity := rule.Period.Microseconds(), rule.Capacity()
		switch {
		case rule.Calendar != nil:
			// The windows around the gateway's now (see allow.lua's
			// header): Redis' time, seconds away at most, is in one. Zone
			// offsets are whole seconds, so the previous window's length
			// is exact in ms.
			kind = 3
			w := rule.Calendar.bounds(now)
			period, capacity, pn, pd = w[2]-w[1], (w[1]-w[0])/1000, w[3]-w[2], w[1]
		case rule.algorithm() == InFlight:
			// kind 0 with pn 0 (see allow.lua): the lease in pd, its
			// length in period
			pd = int64(rule.Lease)
		case rule.algorithm() == SlidingWindow:
			kind = 2
		default:
			if rule.Capacity() != rule.Limit {
				kind = 1
			}
			rate := rule.Limit * micro
			g := gcd(period, rate)
			pn, pd = period/g, rate/g
		}
		kinds = append(kinds, byte(kind))
		flags := kind
		if rule.Shadow {
			flags += 4
		}
		if rule.Share {
			flags += 8
		}
		// MaxRules containers at most, so the flags fit in a byte.
		b = append(b, byte(flags+16*cont[i]))
		b = le(b, rule.Limit, 5)
		b = le(b, period, 6)
		b = le(b, capacity, 5)
		b = le(b, pn, 6)
		b = le(b, pd, 7)
		// 0 when the rule is charged the call's cost; |Cost| ≤ MaxCost
		// (2^53) fits 7 bytes, signed. An in-flight rule takes (1) or
		// gives back (-1) one slot.
		c := rule.Cost
		if rule.algorithm() == InFlight {
			c = rule.charge(cost)
		}
		b = le(b, c, 7)
	}
	fields := b
	for i, rule := range rules {
		start := len(b)
		name := rule.bucket()
		b = append(b, byte(len(name)))
		b = append(b, name...)
		b = append(b, kinds[i])
		args = append(args, b[start:len(b):len(b)])
	}
	// args[2] is 0 (not numbered) unless Allow numbers the decision.
	args[0], args[1], args[2], args[3] = cost, m, 0, fields[:len(fields):len(fields)]
	return args
}

// ruleSize is the bytes of one rule's fields in scriptArgs.
const ruleSize = 1 + 5 + 6 + 5 + 6 + 7 + 7

// le appends the low size bytes of v, little-endian (struct's '<I<size>').
func le(b []byte, v int64, size int) []byte {
	for i := range size {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// parseReply checks a check's packed reply (see allow.lua) before using
// it: the overall verdict, 20 bytes a rule, the Redis time, then, when
// seq (the check asked to be numbered), the sequence's epoch and number.
func parseReply(res any, rules []Rule, seq bool) (Decision, error) {
	s, ok := res.(string)
	if !ok {
		return Decision{}, fmt.Errorf("%w: reply is %T, want a packed string", ErrBadScriptData, res)
	}
	want := 1 + 20*len(rules) + 7
	if seq {
		want += 14
	}
	if len(s) != want {
		return Decision{}, fmt.Errorf("%w: %d bytes for %d rules, want %d", ErrBadScriptData, len(s), len(rules), want)
	}
	var epoch, n int64
	if seq {
		epoch, n = uintLE(s[want-14:want-7]), uintLE(s[want-7:])
		if n < 1 {
			return Decision{}, fmt.Errorf("%w: sequence number %d", ErrBadScriptData, n)
		}
		s = s[:want-14]
	}
	rr := make([]RuleResult, len(rules))
	for i, rule := range rules {
		v := s[1+20*i:]
		if v[0] > 1 {
			return Decision{}, fmt.Errorf("%w: rule %d verdict %d", ErrBadScriptData, i, v[0])
		}
		rr[i] = RuleResult{
			Rule:       rule,
			Allowed:    v[0] == 1,
			Remaining:  uintLE(v[1:6]),
			RetryAfter: time.Duration(uintLE(v[6:13])) * time.Microsecond,
			ResetAfter: time.Duration(uintLE(v[13:20])) * time.Microsecond,
		}
	}
	d := decide(rr)
	if s[0] > 1 || d.Allowed != (s[0] == 1) {
		return Decision{}, fmt.Errorf("%w: overall %d disagrees with rules", ErrBadScriptData, s[0])
	}
	d.Time = time.UnixMicro(uintLE(s[len(s)-7:]))
	if seq {
		d.Seq, d.SeqEpoch = n, time.UnixMicro(epoch)
	}
	return d, nil
}

// uintLE reads a little-endian unsigned integer of up to 7 bytes.
func uintLE(b string) int64 {
	var v int64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | int64(b[i])
	}
	return v
}

// replyInts checks that a script reply is want integers (for n rules).
func replyInts(res []any, want, n int) ([]int64, error) {
	if len(res) != want {
		return nil, fmt.Errorf("%w: %d values for %d rules", ErrBadScriptData, len(res), n)
	}
	ints := make([]int64, len(res))
	for i, v := range res {
		x, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: value %d is %T, want integer", ErrBadScriptData, i, v)
		}
		ints[i] = x
	}
	return ints, nil
}

// fingerprint identifies a key together with its rules, so a cached denial
// never outlives a change of rules.
// fingerprint hashes key (kh) and key with rules (fp): a denial of key
// under rules answers only a check under the very same rules.
func fingerprint(key string, rules []Rule) (kh, fp uint64) {
	kh = keyHash(key)
	return kh, rulesHash(kh, rules)
}

// keyHash is fingerprint's kh alone: a lookup that finds no entry for the
// key (most checks) needs no hash of the rules.
func keyHash(key string) uint64 {
	h := newHash()
	h.str(key)
	return h.sum
}

// rulesHash is fingerprint's fp, from the key's hash kh.
func rulesHash(kh uint64, rules []Rule) uint64 {
	h := &fnv{sum: kh}
	for _, r := range rules {
		h.str(r.Name)
		h.str(r.Bucket)
		h.str(r.Tag)
		h.str(r.container())
		r.settings(h)
	}
	return h.sum
}

// settings hashes what a check sends of r besides the state it names.
func (r Rule) settings(h *fnv) {
	h.str(string(r.algorithm()))
	h.int(r.Limit)
	h.int(int64(r.Period))
	h.int(r.Capacity())
	// A rule's own cost changes its verdict and retry as the call's cost
	// does (which the entry checks): a denial at one must not answer
	// another.
	h.int(r.Cost)
	if r.Calendar != nil {
		h.str(r.Calendar.identity())
	}
	h.str(r.Whole.Gateway)
	h.int(r.Whole.Limit)
	h.int(int64(r.Whole.Period))
	h.int(r.Whole.Burst)
	if r.Shadow {
		h.int(1)
	} else {
		h.int(0)
	}
}

type fnv struct{ sum uint64 }

func newHash() *fnv { return &fnv{sum: 14695981039346656037} }

func (h *fnv) str(s string) {
	for i := 0; i < len(s); i++ {
		h.sum ^= uint64(s[i])
		h.sum *= 1099511628211
	}
	h.sum ^= 0xff
	h.sum *= 1099511628211
}

func (h *fnv) int(n int64) {
	for i := 0; i < 64; i += 8 {
		h.sum ^= uint64(n>>i) & 0xff
		h.sum *= 1099511628211
	}
}
