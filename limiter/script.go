package limiter

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed allow.lua
var allowTemplate string

// The library's and its function's names carry a hash of the source, so
// that gateways of two builds sharing a Redis each call their own.
var (
	allowVersion  = sourceVersion(allowTemplate)
	allowLibrary  = "edgelimit_" + allowVersion
	allowFunction = "edgelimit_allow_" + allowVersion
	allowSource   = strings.NewReplacer("@LIBRARY@", allowLibrary, "@FUNCTION@", allowFunction).Replace(allowTemplate)
	// allowEval is the same code for EVALSHA: without the shebang line,
	// which EVAL reads as flags (and servers before 7.0 as Lua).
	allowEval   = allowSource[strings.IndexByte(allowSource, '\n')+1:]
	allowScript = redis.NewScript(allowEval)
)

func sourceVersion(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:6])
}

// AllowScript returns the Lua source as EVAL runs it and its SHA1, for
// tools that call the script directly (benchmarks, redis-cli). Its ARGV
// starts with the number of checks (see allow.lua).
func AllowScript() (source, sha string) { return allowEval, allowScript.Hash() }

// AllowLibrary returns the Redis Functions library (for FUNCTION LOAD)
// and the name of its function (for FCALL).
func AllowLibrary() (source, function string) { return allowSource, allowFunction }

// How the limiter calls allow.lua: as a function (FCALL) until a server
// says it has none (Redis before 7.0), then by EVALSHA.
const (
	viaFunction int32 = iota
	viaScript
)

// group is one script call of a pipeline and the checks it carries.
type group struct {
	calls []*call
	cmd   *redis.Cmd
}

// run executes one batch in a pipeline, coalesced into script calls (see
// coalesce); a call the server could not run as sent (the library or
// script missing, no functions at all, TRYAGAIN) is sent again (see
// resend). Every call's result is delivered to its caller.
func (r *Redis) run(s *sender, batch []*call) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		// The pipeline serves many callers: bound it by the latest deadline
		// among them, and let each caller give up on its own context.
		ctx = context.WithoutCancel(ctx)
		var latest time.Time
		for _, c := range batch {
			dl, ok := c.bound()
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
	} else if dl := batch[0].deadline; !dl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	var now time.Time
	live := make([]*call, 0, len(batch))
	for _, c := range batch {
		err := c.ctx.Err()
		if err == nil && !c.deadline.IsZero() {
			if now.IsZero() {
				now = time.Now()
			}
			if !now.Before(c.deadline) {
				err = context.DeadlineExceeded
			}
		}
		if err != nil {
			// Its caller is gone: don't spend Redis time on it. That is its
			// error; the pipeline's own context may well be live.
			c.err = err
			c.done <- struct{}{}
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	groups := r.exec(ctx, r.coalesce(s.groups[:0], live))
	groups = r.resend(ctx, groups)
	for _, g := range groups {
		deliver(g)
	}
	clear(groups)
	s.groups = groups[:0]
}

// deliver hands each call of g its part of g's reply.
func deliver(g group) {
	res, err := g.cmd.Slice()
	if err == nil && len(res) != len(g.calls) {
		err = fmt.Errorf("%w: %d replies for %d checks", ErrBadScriptData, len(res), len(g.calls))
	}
	for i, c := range g.calls {
		if err != nil {
			c.err = err
		} else if e, ok := res[i].(error); ok {
			c.err = e
		} else {
			c.res = res[i]
		}
		c.done <- struct{}{} // the last touch: c may be reused from here
	}
}

// coalesce puts calls into groups of at most Config.Coalesce, one script
// call each: on a Cluster only calls of one slot can share a call (a
// script's keys must), elsewhere any can.
func (r *Redis) coalesce(groups []group, calls []*call) []group {
	if r.cfg.Coalesce == 1 || len(calls) == 1 {
		for _, c := range calls {
			groups = append(groups, group{calls: []*call{c}})
		}
		return groups
	}
	if !r.cluster {
		for len(calls) > 0 {
			k := min(len(calls), r.cfg.Coalesce)
			groups = append(groups, group{calls: calls[:k:k]})
			calls = calls[k:]
		}
		return groups
	}
	open := make(map[uint16]int, len(calls))
	for _, c := range calls {
		slot := keySlot(c.keys[0])
		if i, ok := open[slot]; ok && len(groups[i].calls) < r.cfg.Coalesce {
			groups[i].calls = append(groups[i].calls, c)
			continue
		}
		open[slot] = len(groups)
		groups = append(groups, group{calls: []*call{c}})
	}
	return groups
}

// exec sends groups as one pipeline and returns them with their commands.
func (r *Redis) exec(ctx context.Context, groups []group) []group {
	r.pipelines.Add(1)
	pipe := r.rdb.Pipeline()
	for i := range groups {
		r.checks.Add(int64(len(groups[i].calls)))
		groups[i].cmd = r.scriptCmd(ctx, pipe, false, groups[i].calls)
	}
	// Per-command errors are read from each cmd; Exec's error repeats the first.
	_, _ = pipe.Exec(ctx)
	return groups
}

// resend sends again the groups whose call did not run: once the library
// is loaded (or, on a server without functions, in full by EVAL) after
// "function not found" or NOSCRIPT, and each check of a group on its own,
// without the previous layout's keys, after TRYAGAIN. Each of those errors
// means the script did not run, so sending again consumes nothing twice.
//
// Without the old keys: Redis Cluster answers TRYAGAIN to a command of
// several keys in a slot being migrated unless the node holds every one of
// them, and old keys are almost always gone, so every check of the slot
// would fail (its failure policy's answer, not a decision) until the
// migration ended. A check of one container is then served wherever its
// key is (the target after ASK); the rules whose state is still only in
// the previous layout are checked from full this once.
func (r *Redis) resend(ctx context.Context, groups []group) []group {
	var missing, again []group
	keep := groups[:0]
	for _, g := range groups {
		switch err := g.cmd.Err(); {
		case isNoScript(err) || isNoFunction(err) || isUnknownCommand(err) || (isNoPerm(err) && r.via.Load() == viaFunction):
			missing = append(missing, g)
		case isTryAgain(err):
			for _, c := range g.calls {
				c.keys = c.keys[:c.containers]
				again = append(again, group{calls: []*call{c}})
			}
		default:
			keep = append(keep, g)
		}
	}
	if len(missing) > 0 {
		full := false
		if err := r.loadLibrary(ctx); err != nil {
			full = true // by EVAL: runs, and caches, the script wherever it lands
		}
		r.reloads.Add(int64(len(missing)))
		pipe := r.rdb.Pipeline()
		for i := range missing {
			missing[i].cmd = r.scriptCmd(ctx, pipe, full, missing[i].calls)
		}
		_, _ = pipe.Exec(ctx)
		keep = append(keep, missing...)
	}
	if len(again) > 0 {
		r.unstable.Add(int64(len(again)))
		pipe := r.rdb.Pipeline()
		for i := range again {
			again[i].cmd = r.scriptCmd(ctx, pipe, r.via.Load() == viaScript, again[i].calls)
		}
		_, _ = pipe.Exec(ctx)
		keep = append(keep, again...)
	}
	return keep
}

// scriptCmd queues one call of allow.lua for calls on pipe: FCALL, or
// EVALSHA (EVAL when full), as a command go-redis never sends twice: a
// Cluster pipeline resends a node's whole batch when its first reply is
// an error it deems transient (TRYAGAIN, LOADING, CLUSTERDOWN) or the
// connection fails while reading, whatever MaxRetries says, so checks that
// had already run would consume again. MOVED and ASK, which say the
// command did not run, are still followed.
func (r *Redis) scriptCmd(ctx context.Context, pipe redis.Pipeliner, full bool, calls []*call) *redis.Cmd {
	name, body := "fcall", allowFunction
	switch {
	case full:
		name, body = "eval", allowEval
	case r.via.Load() == viaScript:
		name, body = "evalsha", allowScript.Hash()
	}
	nk, na := 0, 1
	for _, c := range calls {
		nk += len(c.keys)
		na += 1 + len(c.args)
	}
	a := make([]any, 3, 3+nk+na)
	a[0], a[1], a[2] = name, body, nk
	for _, c := range calls {
		for _, k := range c.keys {
			a = append(a, k)
		}
	}
	a = append(a, len(calls))
	for _, c := range calls {
		a = append(a, len(c.keys))
		a = append(a, c.args...)
	}
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

func isNoFunction(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

func isUnknownCommand(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "ERR unknown command")
}

// ErrMigrating is Allow's error for a check that Redis Cluster refused
// with TRYAGAIN until the caller's deadline: its slot was being migrated.
// The check did not run, and the store is not down: one slot is moving, so
// a caller should not count it against the store's health.
var ErrMigrating = errors.New("limiter: cluster slot migrating")

func isNoPerm(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOPERM")
}

func isTryAgain(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "TRYAGAIN")
}

// Load puts the library into the server (every master of a Cluster) ahead
// of traffic, or the script into its cache where the server has no
// functions. It is optional: a missing library is loaded on first use.
func (r *Redis) Load(ctx context.Context) error {
	if err := r.loadLibrary(ctx); err != nil {
		if r.via.Load() != viaScript {
			return err
		}
		if err := r.rdb.Do(ctx, "script", "load", allowEval).Err(); err != nil {
			return fmt.Errorf("load limiter script: %w", err)
		}
	}
	return nil
}

// loadLibrary loads allow.lua as a function library on every master. A
// server without functions switches the limiter to EVALSHA for good.
func (r *Redis) loadLibrary(ctx context.Context) error {
	if r.via.Load() == viaScript {
		return errNoFunctions
	}
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.Do(ctx, "function", "load", allowSource).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // another gateway of this build was first
		}
		return err
	}
	var err error
	if cl, ok := r.rdb.(*redis.ClusterClient); ok {
		err = cl.ForEachMaster(ctx, load)
	} else if c, ok := r.rdb.(*redis.Client); ok {
		err = load(ctx, c)
	} else {
		err = r.rdb.Do(ctx, "function", "load", allowSource).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			err = nil
		}
	}
	if isUnknownCommand(err) || isNoPerm(err) {
		// No functions on this server, or none for this user (an ACL
		// written for EVALSHA): the script does the same.
		r.via.Store(viaScript)
		return errNoFunctions
	}
	if err != nil {
		return fmt.Errorf("load limiter library: %w", err)
	}
	return nil
}

var errNoFunctions = errors.New("limiter: server has no functions")

// script runs allow.lua once for one admin call (an inspection, reset or
// listing) and returns its reply. Admin calls go around the check path's
// batching: they are rare, and must not queue behind checks.
func (r *Redis) script(ctx context.Context, keys []string, args []any) ([]any, error) {
	c := &call{ctx: ctx, keys: keys, containers: len(keys), args: args, done: make(chan struct{}, 1)}
	g := r.exec(ctx, []group{{calls: []*call{c}}})
	deliver(r.resend(ctx, g)[0])
	if c.err != nil {
		return nil, c.err
	}
	res, ok := c.res.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: reply is %T, want an array", ErrBadScriptData, c.res)
	}
	return res, nil
}

// keySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, or of the whole key when it has none.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
