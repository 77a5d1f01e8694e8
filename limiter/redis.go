package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed allow.lua
var allowSource string

var allowScript = redis.NewScript(allowSource)

// AllowScript returns the Lua source and its SHA1, for tools that call the
// script directly (benchmarks, redis-cli).
func AllowScript() (source, sha string) { return allowSource, allowScript.Hash() }

// rediser is what Redis needs of a go-redis client: UniversalClient fits,
// so standalone, Sentinel and Cluster all work.
type rediser interface {
	Pipeline() redis.Pipeliner
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
}

// Config tunes the Redis limiter.
type Config struct {
	// Prefix starts every Redis key; default "rl".
	Prefix string
	// Batch is the most checks sent in one pipeline; default 128.
	Batch int
	// Senders is how many pipelines may be in flight at once; default 2.
	// Batching happens only when all senders are busy, so a lone request
	// never waits; under load, fewer senders make longer pipelines, and a
	// pipeline's round trip (a write and a read, for the gateway and for
	// Redis) costs more CPU than a check in it. Two keep one pipeline
	// filling while the other is in flight.
	Senders int
	// DenyCache is how many keys the local deny cache holds; default 65536.
	// Negative disables the cache.
	DenyCache int
	// Now is the local clock, used only by the deny cache; default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "rl"
	}
	if c.Batch <= 0 {
		c.Batch = 128
	}
	if c.Senders <= 0 {
		c.Senders = 2
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

	checks, pipelines, cached, reloads, unstable, migrating atomic.Int64
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
}

// Stats returns the counters so far.
func (r *Redis) Stats() Stats {
	return Stats{Checks: r.checks.Load(), Pipelines: r.pipelines.Load(), Cached: r.cached.Load(), Reloads: r.reloads.Load(), Unstable: r.unstable.Load(), Migrating: r.migrating.Load()}
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
	res        []any
	err        error
	done       chan struct{}
}

// sender is the state of one pipeline slot, reused by every pipeline that
// slot runs: no pipeline allocates its batch or its command list.
type sender struct {
	batch []*call
	cmds  []*redis.Cmd
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
	*c = call{done: c.done}
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
	if cfg.DenyCache > 0 {
		r.deny = newDenyCache(cfg.DenyCache)
	}
	for range cfg.Senders {
		r.slots <- &sender{batch: make([]*call, 0, cfg.Batch), cmds: make([]*redis.Cmd, 0, cfg.Batch)}
	}
	return r, nil
}

// Keys returns the Redis keys a check of key against rules touches: the
// containers holding the rules' states (see layout), then each rule's key
// in the previous layout, read while the rule has no state of its own yet
// (so a fleet upgrading mid-window forgets nothing). They share one hash
// tag, so one Cluster slot.
func (r *Redis) Keys(key string, rules []Rule) []string {
	cont, m := layout(rules)
	keys := make([]string, m, m+len(rules))
	for i, rule := range rules {
		keys[cont[i]] = containerKey(r.cfg.Prefix, key, rule)
	}
	for _, rule := range rules {
		keys = append(keys, ruleKey(r.cfg.Prefix, key, rule))
	}
	return keys
}

// layout places rules in containers, the string keys their states are
// packed in: the rules named by Name share the identity's key
// (<prefix>:{<key>}), so a plan's check reads and writes one key; a rule
// with a Bucket (the Envoy door's descriptors, which come and go with
// request values) has a key of its own (<prefix>:{<key>}:<bucket>), so
// no container grows with the values a caller sends. cont[i] is rule i's
// container index (0-based); m how many there are.
func layout(rules []Rule) (cont []int, m int) {
	cont = make([]int, len(rules))
	shared := -1
	for i, rule := range rules {
		switch {
		case rule.Bucket != "":
			cont[i] = m
			m++
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

// containerKey is the container rule's state lives in.
func containerKey(prefix, key string, rule Rule) string {
	if rule.Bucket != "" {
		return identityKey(prefix, key) + ":" + rule.Bucket
	}
	return identityKey(prefix, key)
}

// ruleKey is the key of one rule's state in the previous layout (a hash
// per rule), and the memory store's name for it.
func ruleKey(prefix, key string, rule Rule) string {
	return legacyKey(prefix, key, rule.bucket(), rule.algorithm() == SlidingWindow)
}

func legacyKey(prefix, key, bucket string, sliding bool) string {
	algo := "tb"
	if sliding {
		algo = "sw"
	}
	return identityKey(prefix, key) + ":" + bucket + ":" + algo
}

// Allow checks cost units of key against every rule in one Redis call (a
// rule with a Cost of its own is charged that instead). If any enforced
// rule denies, no rule consumes. An error means the store
// failed; the decision is then unknown.
func (r *Redis) Allow(ctx context.Context, key string, rules []Rule, cost int64) (Decision, error) {
	if err := validate(key, rules, cost); err != nil {
		return Decision{}, err
	}
	if d, ok := overCapacity(rules, cost); ok {
		d.Time = r.cfg.Now()
		return d, nil
	}
	var fp uint64
	if r.deny != nil {
		fp = fingerprint(key, rules)
		if d, ok := r.deny.get(fp, key, cost, r.cfg.Now()); ok {
			r.cached.Add(1)
			return d, nil
		}
	}
	keys := r.Keys(key, rules)
	args := scriptArgs(rules, cost)
	var (
		res  []any
		sent time.Time
		cerr error
	)
	for try, waited := 0, time.Duration(0); ; try++ {
		res, sent, cerr = r.check(ctx, keys, len(keys)-len(rules), args)
		if !isTryAgain(cerr) || !r.awaitMigration(ctx, try, &waited) {
			break
		}
	}
	if isTryAgain(cerr) {
		return Decision{}, fmt.Errorf("run limiter script: %w: %w", ErrMigrating, cerr)
	}
	if cerr != nil {
		return Decision{}, fmt.Errorf("run limiter script: %w", cerr)
	}
	d, err := parseReply(res, rules)
	if err != nil {
		return Decision{}, err
	}
	if r.deny != nil && !d.Allowed {
		r.deny.put(fp, key, cost, sent, r.cfg.Now(), d)
	}
	return d, nil
}

// check runs the script once for Allow, through a pipeline: its reply,
// when it was sent, and the error of the call or of ctx.
func (r *Redis) check(ctx context.Context, keys []string, containers int, args []any) ([]any, time.Time, error) {
	c := r.newCall(ctx, keys, containers, args)
	if !r.submit(c) {
		r.recycle(c)
		return nil, time.Time{}, ctx.Err()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// c stays the sender's: it is not recycled.
		return nil, time.Time{}, ctx.Err()
	}
	res, err, sent := c.res, c.err, c.sent
	r.recycle(c)
	return res, sent, err
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
	d, ok := r.deny.get(fingerprint(key, rules), key, cost, r.cfg.Now())
	if ok {
		r.cached.Add(1)
	}
	return d, ok
}

// submit sends c at once when a sender is idle; otherwise it queues c for
// the next pipeline. It gives up (false) when c's context ends first, so a
// full queue never holds a caller past its deadline.
func (r *Redis) submit(c *call) bool {
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

// run executes one batch in a pipeline; NOSCRIPT replies are retried with
// the full script, which also reloads it into the server's cache, and
// TRYAGAIN replies without the previous layout's keys (see resend).
func (r *Redis) run(s *sender, batch []*call) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		// The pipeline serves many callers: bound it by the latest deadline
		// among them, and let each caller give up on its own context.
		ctx = context.WithoutCancel(ctx)
		var latest time.Time
		for _, c := range batch {
			dl, ok := c.ctx.Deadline()
			if !ok {
				latest = time.Time{}
				break
			}
			if dl.After(latest) {
				latest = dl
			}
		}
		if !latest.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, latest)
			defer cancel()
		}
	}
	cmds := r.exec(ctx, batch, false, s.cmds[:0])
	r.reloads.Add(r.resend(ctx, batch, cmds, isNoScript, false))
	r.unstable.Add(r.resend(ctx, batch, cmds, isTryAgain, true))
	for i, c := range batch {
		if cmds[i] == nil {
			// Skipped because its caller's context ended: that is its
			// error. The pipeline's own context may well be live.
			c.err = c.ctx.Err()
		} else {
			c.res, c.err = cmds[i].Slice()
		}
		c.done <- struct{}{} // the last touch: c may be reused from here
	}
	clear(cmds)
	s.cmds = cmds[:0]
}

// resend runs the calls of batch whose commands failed with an error that
// is matches once more, in one pipeline with the full script, and puts
// their new commands in cmds; it returns how many it sent. Either error
// means the script did not run, so sending again consumes nothing twice.
//
// With containersOnly the previous layout's keys are left out: Redis
// Cluster answers TRYAGAIN to a command of several keys in a slot being
// migrated unless the node holds every one of them, and old keys are
// almost always gone, so every check of the slot would fail (its failure
// policy's answer, not a decision) until the migration ended. A check of
// one container is then served wherever its key is (the target after
// ASK); the rules whose state is still only in the previous layout are
// checked from full this once.
func (r *Redis) resend(ctx context.Context, batch []*call, cmds []*redis.Cmd, is func(error) bool, containersOnly bool) int64 {
	var again []int
	for i, cmd := range cmds {
		if cmd != nil && is(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return 0
	}
	sub := make([]*call, len(again))
	for j, i := range again {
		sub[j] = batch[i]
		if containersOnly {
			sub[j].keys = sub[j].keys[:sub[j].containers]
		}
	}
	for j, cmd := range r.exec(ctx, sub, true, nil) {
		cmds[again[j]] = cmd
	}
	return int64(len(again))
}

// exec runs batch as one pipeline and returns its commands, appended to
// cmds: one per call, nil for a call whose caller had gone.
func (r *Redis) exec(ctx context.Context, batch []*call, full bool, cmds []*redis.Cmd) []*redis.Cmd {
	r.pipelines.Add(1)
	r.checks.Add(int64(len(batch)))
	pipe := r.rdb.Pipeline()
	for _, c := range batch {
		if c.ctx.Err() != nil {
			cmds = append(cmds, nil) // its caller is gone; don't spend Redis time on it
			continue
		}
		cmds = append(cmds, scriptCmd(ctx, pipe, full, c.keys, c.args))
	}
	// Per-command errors are read from each cmd; Exec's error repeats the first.
	_, _ = pipe.Exec(ctx)
	return cmds
}

// scriptCmd queues allow.lua on pipe, by SHA or in full, as a command
// go-redis never sends twice: a Cluster pipeline resends a node's whole
// batch when its first reply is an error it deems transient (TRYAGAIN,
// LOADING, CLUSTERDOWN) or the connection fails while reading, whatever
// MaxRetries says, so checks that had already run would consume again.
// MOVED and ASK, which say the command did not run, are still followed.
func scriptCmd(ctx context.Context, pipe redis.Pipeliner, full bool, keys []string, args []any) *redis.Cmd {
	name, body := "evalsha", allowScript.Hash()
	if full {
		name, body = "eval", allowSource
	}
	a := make([]any, 3, 3+len(keys)+len(args))
	a[0], a[1], a[2] = name, body, len(keys)
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	_ = pipe.Process(ctx, sentOnce{cmd}) // the error is cmd's
	return cmd
}

// sentOnce is a command go-redis must not replay (see scriptCmd).
type sentOnce struct{ *redis.Cmd }

// NoRetry tells go-redis not to send the command again.
func (sentOnce) NoRetry() bool { return true }

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// ErrMigrating is Allow's error for a check that Redis Cluster refused
// with TRYAGAIN until the caller's deadline: its slot was being migrated.
// The check did not run, and the store is not down: one slot is moving, so
// a caller should not count it against the store's health.
var ErrMigrating = errors.New("limiter: cluster slot migrating")

func isTryAgain(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "TRYAGAIN")
}

// Load puts the script into the server's script cache ahead of traffic.
// It is optional: a missing script is reloaded on first use.
func (r *Redis) Load(ctx context.Context) error {
	if err := r.rdb.ScriptLoad(ctx, allowSource).Err(); err != nil {
		return fmt.Errorf("load limiter script: %w", err)
	}
	return nil
}

// scriptArgs is allow.lua's ARGV for a check (cost > 0), an inspection
// (0) or a reset (-1) of rules; see the script's header. A rule's own
// Cost rides in its packed record; cost stays the mode switch. The rules go in
// one packed argument, and the token bucket's rate is reduced here, once,
// rather than by a gcd in Lua.
func scriptArgs(rules []Rule, cost int64) []any {
	cont, m := layout(rules)
	n := 0
	for _, rule := range rules {
		n += 1 + len(rule.bucket()) + 1 + 5 + 6 + 5 + 6 + 7 + 7
	}
	b := make([]byte, 0, n)
	for i, rule := range rules {
		kind, pn, pd := 0, int64(0), int64(0)
		period := rule.Period.Microseconds()
		if rule.algorithm() == SlidingWindow {
			kind = 2
		} else {
			if rule.Capacity() != rule.Limit {
				kind = 1
			}
			rate := rule.Limit * micro
			g := gcd(period, rate)
			pn, pd = period/g, rate/g
		}
		if rule.Shadow {
			kind += 4
		}
		if rule.Share {
			kind += 8
		}
		name := rule.bucket()
		b = append(b, byte(len(name)))
		b = append(b, name...)
		// MaxRules containers at most, so the flags fit in a byte.
		b = append(b, byte(kind+16*cont[i]))
		b = le(b, rule.Limit, 5)
		b = le(b, period, 6)
		b = le(b, rule.Capacity(), 5)
		b = le(b, pn, 6)
		b = le(b, pd, 7)
		// 0 when the rule is charged the call's cost; ≤ MaxCost (2^53)
		// fits 7 bytes.
		b = le(b, rule.Cost, 7)
	}
	return []any{cost, m, b}
}

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

// parseReply checks the script reply's shape before using it.
func parseReply(res []any, rules []Rule) (Decision, error) {
	ints, err := replyInts(res, 2+4*len(rules), len(rules))
	if err != nil {
		return Decision{}, err
	}
	rr := make([]RuleResult, len(rules))
	for i, rule := range rules {
		v := ints[1+4*i:]
		rr[i] = RuleResult{
			Rule:       rule,
			Allowed:    v[0] == 1,
			Remaining:  v[1],
			RetryAfter: time.Duration(v[2]) * time.Microsecond,
			ResetAfter: time.Duration(v[3]) * time.Microsecond,
		}
	}
	d := decide(rr)
	if d.Allowed != (ints[0] == 1) {
		return Decision{}, fmt.Errorf("%w: overall %d disagrees with rules", ErrBadScriptData, ints[0])
	}
	d.Time = time.UnixMicro(ints[len(ints)-1])
	return d, nil
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
func fingerprint(key string, rules []Rule) uint64 {
	h := newHash()
	h.str(key)
	for _, r := range rules {
		h.str(r.Name)
		h.str(r.Bucket)
		h.str(string(r.algorithm()))
		h.int(r.Limit)
		h.int(int64(r.Period))
		h.int(r.Capacity())
		// A rule's own cost changes its verdict and retry as the call's
		// cost does (which the entry checks): a denial at one must not
		// answer another.
		h.int(r.Cost)
		if r.Shadow {
			h.int(1)
		} else {
			h.int(0)
		}
	}
	return h.sum
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
