package limiter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Directives close the loop from analytics to the gateways. Analytics
// writes them to Redis; each gateway polls one small version key in the
// background and reloads the set only when it changed, so the request path
// never makes an extra Redis call.
//
// Key layout (one hash tag, so one Cluster slot, written atomically):
//
//	<prefix>:{directives}:version  counter, bumped on every write
//	<prefix>:{directives}:split    hash: limiter key → SplitDirective JSON
//	<prefix>:{directives}:nat      hash: IP key     → NATDirective JSON
//
// Every directive carries its own expiry; readers ignore expired ones,
// writers prune them, and each hash expires with its newest directive, so
// directives age out even if analytics stops.

// SplitDirective splits a hot key's capacity among the gateways that carry
// it: each gateway checks its own bucket, in its own slot, holding its share
// of the capacity and refill.
type SplitDirective struct {
	// Key is the limiter key as the gateway computes it.
	Key string `json:"key"`
	// Shares maps gateway id (or OtherGateways) to its fraction of the
	// limit; they sum to 1.
	Shares map[string]float64 `json:"shares"`
	// Expires is when the split lapses and the shared bucket returns.
	Expires time.Time `json:"expires"`
}

// NATDirective raises an IP-keyed limit for an address shared by many
// clients (NAT, a campus, a mobile carrier).
type NATDirective struct {
	// Key is the IP limiter key as the gateway computes it.
	Key string `json:"key"`
	// Factor multiplies the anonymous limit; at least 1.
	Factor float64 `json:"factor"`
	// Clients is the estimated number of distinct clients behind the IP.
	Clients int64 `json:"clients"`
	// Expires is when the raise lapses.
	Expires time.Time `json:"expires"`
}

// Validate reports a directive that must not be applied.
func (d SplitDirective) Validate() error {
	if d.Key == "" || len(d.Key) > MaxKeyLen {
		return fmt.Errorf("split directive: bad key length %d", len(d.Key))
	}
	if len(d.Shares) == 0 {
		return fmt.Errorf("split directive %q: no shares", d.Key)
	}
	sum := 0.0
	for gw, s := range d.Shares {
		if gw == "" || s <= 0 || s > 1 || math.IsNaN(s) {
			return fmt.Errorf("split directive %q: bad share %v for gateway %q", d.Key, s, gw)
		}
		sum += s
	}
	if math.Abs(sum-1) > 0.01 {
		return fmt.Errorf("split directive %q: shares sum to %.3f, want 1", d.Key, sum)
	}
	return nil
}

// Validate reports a directive that must not be applied.
func (d NATDirective) Validate() error {
	if d.Key == "" || len(d.Key) > MaxKeyLen {
		return fmt.Errorf("nat directive: bad key length %d", len(d.Key))
	}
	if d.Factor < 1 || d.Factor > 1000 || math.IsNaN(d.Factor) {
		return fmt.Errorf("nat directive %q: factor %v outside [1, 1000]", d.Key, d.Factor)
	}
	return nil
}

// Directives is one consistent set, as a gateway applies it.
type Directives struct {
	Version int64
	Splits  map[string]SplitDirective
	NATs    map[string]NATDirective
}

// OtherGateways names, among a split's shares, the share reserved for every
// gateway the split does not name (one new since analytics looked): they
// check one bucket together, so the named shares and theirs still sum to
// the limit.
const OtherGateways = "*"

// Split returns the key and rules gateway must check for key: its own
// bucket with its share of every rule, while a live split names it (or
// reserves a share for OtherGateways). Otherwise it returns key and rules
// unchanged.
//
// Each share carries its Whole, and the stores check it with its share:
// a check of the split's key ("<limiter key>/gw:<gateway>") also checks
// and charges the limiter key's own bucket under the rule as it was, in
// the same atomic call. So a switch into or out of a split, a change of
// shares, and gateways that switch at different moments admit no more
// than the rule: the shares only divide it.
//
// Shares are whole units, apportioned by largest remainder (ties by gateway
// name) so that every gateway computes the same apportionment and the
// shares of each rule's limit and burst sum exactly to them. A split that
// would leave a named gateway without a single unit of some rule is not
// applied at all: the shared bucket is exact, and a limit that small gains
// nothing from a split. A reserve for the others below one unit gives them
// one unit per MaxPeriod, all together.
//
// Rules with a Bucket of their own are never split, nor the rules checked
// with them (a split moves every rule of the check under the split's key):
// their state is named by the bucket, not by the key, and checked by the
// callers of other keys too (the Envoy door's descriptors: every request
// that carries one, whatever else it carries, and every value a
// share_threshold wildcard matches), so a split of one key would fork it,
// the limit admitted once in the split's buckets and once more through the
// other keys.
func (d *Directives) Split(key, gateway string, rules []Rule, now time.Time) (string, []Rule, bool) {
	if d == nil {
		return key, rules, false
	}
	s, ok := d.Splits[key]
	if !ok || !now.Before(s.Expires) || slices.ContainsFunc(rules, func(r Rule) bool { return r.Bucket != "" }) {
		return key, rules, false
	}
	if _, ok := s.Shares[gateway]; !ok {
		gateway = OtherGateways
	}
	names := slices.Sorted(maps.Keys(s.Shares))
	i := slices.Index(names, gateway)
	others := slices.Index(names, OtherGateways)
	out := make([]Rule, len(rules))
	for j, r := range rules {
		whole := Whole{Gateway: gateway, Limit: r.Limit, Period: r.Period, Burst: r.Burst}
		limits := apportion(r.Limit, names, s.Shares)
		var bursts []int64
		if r.Burst > 0 {
			bursts = apportion(r.Burst, names, s.Shares)
		}
		if !named(limits, others) || (bursts != nil && !named(bursts, others)) {
			return key, rules, false
		}
		if i < 0 || limits[i] == 0 || (bursts != nil && bursts[i] == 0) {
			// The others' reserve is below a unit, or there is none (a
			// split written by hand or by an older analytics): the named
			// gateways hold the whole limit, so the others share one
			// bucket of a single unit per MaxPeriod rather than add to it.
			r.Limit, r.Burst, r.Period = 1, 1, MaxPeriod
			if r.Algorithm == InFlight {
				// slots, not a rate: one, held no longer than a lease
				r.Burst, r.Period = 0, whole.Period
			}
		} else {
			r.Limit = limits[i]
			if bursts != nil {
				r.Burst = bursts[i]
			}
		}
		r.Share, r.Whole = true, whole
		out[j] = r
	}
	return key + "/gw:" + gateway, out, true
}

// A split's check (Directives.Split) is decided with each share's whole,
// all-or-nothing: the share and the key's own bucket under the rule as it
// was, both charged. That is what keeps a split exact: the shares only
// divide a bucket that still counts everything, so no order of switches
// (into a split, out of it, to other shares, gateways reading the
// directive a second apart, a key in and out of splits all day) admits
// more than the rule, and a switch out of a split finds the bucket as the
// shares left it. It costs one more record read and written in the same
// call (on the fast path still), which is why the shares' states live
// beside the key's, in its Cluster slot (see containerKey), rather than
// spreading a hot key over the Cluster.
//
// While the shares stay within their parts the whole never binds: it has
// room for what each share has left. It binds only after a switch, when
// the key had used part of the rule: then the shares (which start full)
// share what is left first come, first served, each within its part,
// until the bucket refills (one Window at most). A share is not seeded
// with its part of the bucket's use instead: read at the share's first
// check, the bucket also holds what the other shares used since the
// switch, so a gateway whose first request came later would be charged
// for theirs (TestShareGrows: 75 of 100 after a 50:50 split), and seeding
// fairly needs the bucket's state as of the switch kept per split.

// wholeKey returns the key a split's check is a split of: key without its
// "/gw:<gateway>" when rules are a split's shares with their wholes
// (checked by checkWhole), else false.
func wholeKey(key string, rules []Rule) (string, bool) {
	g := rules[0].Whole.Gateway
	if g == "" {
		return "", false
	}
	return key[:len(key)-len("/gw:")-len(g)], true
}

// withWholes returns the rules a split's check decides: the shares, then
// the whole of each, in the same order.
func withWholes(rules []Rule) []Rule {
	out := make([]Rule, 2*len(rules))
	copy(out, rules)
	for i, r := range rules {
		out[len(rules)+i] = r.Whole.rule(r)
	}
	return out
}

// joinWholes folds the decision d of withWholes(rules) into one result
// per share, of it and its whole (see both).
func joinWholes(d Decision, rules []Rule) Decision {
	n := len(rules)
	rr := make([]RuleResult, n)
	for i, r := range rules {
		rr[i] = both(r, d.Rules[i], d.Rules[n+i])
	}
	out := decide(rr)
	out.Time, out.Reason, out.Cached = d.Time, d.Reason, d.Cached
	out.Seq, out.SeqEpoch = d.Seq, d.SeqEpoch
	return out
}

// named reports whether every named gateway's part is a unit or more; the
// others' part (at index others, -1 for none) may be empty.
func named(parts []int64, others int) bool {
	for i, p := range parts {
		if p == 0 && i != others {
			return false
		}
	}
	return true
}

// apportion splits n whole units among names by their shares with the
// largest remainder method: each gets the floor of its quota, and the
// units left go to the largest fractional parts (ties to the first name).
// The parts sum exactly to n; a share of 0 or less gets nothing.
func apportion(n int64, names []string, shares map[string]float64) []int64 {
	total := 0.0
	for _, name := range names {
		total += max(0, shares[name])
	}
	parts := make([]int64, len(names))
	if total <= 0 {
		return parts
	}
	type rem struct {
		i    int
		frac float64
	}
	rems := make([]rem, len(names))
	left := n
	for i, name := range names {
		q := float64(n) * max(0, shares[name]) / total
		parts[i] = min(left, int64(math.Floor(q)))
		left -= parts[i]
		rems[i] = rem{i, q - math.Floor(q)}
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.frac, a.frac) })
	for k := 0; left > 0 && k < len(rems); k++ {
		parts[rems[k].i]++
		left--
	}
	return parts
}

// NAT returns rules raised for an IP key under a live NAT directive.
func (d *Directives) NAT(key string, rules []Rule, now time.Time) ([]Rule, bool) {
	if d == nil {
		return rules, false
	}
	n, ok := d.NATs[key]
	if !ok || !now.Before(n.Expires) {
		return rules, false
	}
	out := make([]Rule, len(rules))
	for i, r := range rules {
		out[i] = r.scaled(n.Factor)
	}
	return out, true
}

// scaled multiplies a rule's limit and burst, keeping both at least 1 and
// within what the script computes exactly.
func (r Rule) scaled(f float64) Rule {
	scale := func(n int64) int64 {
		return min(maxCapacity, max(1, int64(math.Round(float64(n)*f))))
	}
	r.Limit = scale(r.Limit)
	if r.Burst > 0 {
		r.Burst = scale(r.Burst)
	}
	return r
}

// DirectiveStore reads and writes directives in Redis.
type DirectiveStore struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewDirectiveStore returns a store under prefix (default "rl").
func NewDirectiveStore(rdb redis.UniversalClient, prefix string) *DirectiveStore {
	if prefix == "" {
		prefix = "rl"
	}
	return &DirectiveStore{rdb: rdb, prefix: prefix}
}

func (s *DirectiveStore) key(name string) string { return s.prefix + ":{directives}:" + name }

// WriteSplits replaces the split directives with ds (pruning the rest) and
// bumps the version, atomically.
func (s *DirectiveStore) WriteSplits(ctx context.Context, ds []SplitDirective) error {
	return writeAll(ctx, s, "split", ds, splitMeta)
}

// WriteNATs replaces the NAT directives with ds and bumps the version.
func (s *DirectiveStore) WriteNATs(ctx context.Context, ds []NATDirective) error {
	return writeAll(ctx, s, "nat", ds, natMeta)
}

// splitMeta and natMeta give what writeAll and readAll need of a
// directive: the key it is stored under, its expiry, and whether it is
// valid.
func splitMeta(d SplitDirective) (string, time.Time, error) { return d.Key, d.Expires, d.Validate() }
func natMeta(d NATDirective) (string, time.Time, error)     { return d.Key, d.Expires, d.Validate() }

// writeAll validates and encodes ds, then replaces the set called name.
func writeAll[T any](ctx context.Context, s *DirectiveStore, name string, ds []T, meta func(T) (string, time.Time, error)) error {
	fields := make(map[string]string, len(ds))
	var latest time.Time
	for _, d := range ds {
		key, expires, err := meta(d)
		if err != nil {
			return err
		}
		b, err := json.Marshal(d)
		if err != nil {
			return fmt.Errorf("encode %s directive: %w", name, err)
		}
		fields[key] = string(b)
		latest = later(latest, expires)
	}
	return s.replace(ctx, name, fields, latest)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (s *DirectiveStore) replace(ctx context.Context, name string, fields map[string]string, latest time.Time) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, s.key(name))
		if len(fields) > 0 {
			p.HSet(ctx, s.key(name), fields)
			p.PExpireAt(ctx, s.key(name), latest)
		}
		p.Incr(ctx, s.key("version"))
		return nil
	})
	if err != nil {
		return fmt.Errorf("write %s directives: %w", name, err)
	}
	return nil
}

// Version returns the directive set's version; 0 when none was written.
func (s *DirectiveStore) Version(ctx context.Context) (int64, error) {
	v, err := s.rdb.Get(ctx, s.key("version")).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read directive version: %w", err)
	}
	return v, nil
}

// Load reads the whole directive set. Malformed entries are skipped and
// counted in the returned error-free set's absence; bad is how many.
func (s *DirectiveStore) Load(ctx context.Context) (d Directives, bad int, err error) {
	var ver *redis.StringCmd
	var splits, nats *redis.MapStringStringCmd
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ver = p.Get(ctx, s.key("version"))
		splits = p.HGetAll(ctx, s.key("split"))
		nats = p.HGetAll(ctx, s.key("nat"))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Directives{}, 0, fmt.Errorf("load directives: %w", err)
	}
	d.Version, _ = strconv.ParseInt(ver.Val(), 10, 64)
	d.Splits = readAll(splits.Val(), splitMeta, &bad)
	d.NATs = readAll(nats.Val(), natMeta, &bad)
	return d, bad, nil
}

// readAll decodes the fields of one directive hash, keeping the
// directives that are valid and stored under their own key, and counting
// the rest in bad.
func readAll[T any](fields map[string]string, meta func(T) (string, time.Time, error), bad *int) map[string]T {
	ds := make(map[string]T, len(fields))
	for k, v := range fields {
		var d T
		if json.Unmarshal([]byte(v), &d) == nil {
			if key, _, err := meta(d); key == k && err == nil {
				ds[k] = d
				continue
			}
		}
		*bad++
	}
	return ds
}

// Watcher keeps a gateway's copy of the directives fresh in the
// background. Current is what the request path reads: one atomic load.
type Watcher struct {
	store    *DirectiveStore
	interval time.Duration
	cur      atomic.Pointer[Directives]
	// OnLoad, if set, is told of every reload (for metrics and logs).
	OnLoad func(d *Directives, bad int, err error)
}

// NewWatcher polls store every interval (default 1s).
func NewWatcher(store *DirectiveStore, interval time.Duration) *Watcher {
	if interval <= 0 {
		interval = time.Second
	}
	w := &Watcher{store: store, interval: interval}
	w.cur.Store(&Directives{})
	return w
}

// Current returns the directives in force; never nil.
func (w *Watcher) Current() *Directives { return w.cur.Load() }

// Run polls until ctx ends. A failed poll keeps the last good set: its
// directives still expire on their own.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		w.Refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh polls once: it reads the version and reloads if it changed.
func (w *Watcher) Refresh(ctx context.Context) {
	v, err := w.store.Version(ctx)
	if err == nil && v == w.cur.Load().Version {
		return
	}
	var d Directives
	var bad int
	if err == nil {
		d, bad, err = w.store.Load(ctx)
	}
	if err == nil {
		w.cur.Store(&d)
	}
	if w.OnLoad != nil {
		w.OnLoad(w.cur.Load(), bad, err)
	}
}
