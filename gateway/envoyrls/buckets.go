package envoyrls

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/limiter"
)

// rule is the limiter rule of a descriptor's limit in its bucket.
func (c Config) rule(l *limit, bucket string) gateway.Rule {
	r := limiter.Rule{Name: l.ruleName, Limit: int64(l.requestsPerUnit), Period: l.period, Algorithm: c.Algorithm,
		Shadow: l.shadow || c.ShadowMode, Bucket: bucket}
	if c.Algorithm == limiter.TokenBucket && c.BurstFactor != 1 {
		r.Burst = min(max(1, int64(math.Round(float64(r.Limit)*c.BurstFactor))), 1<<32)
	}
	return gateway.Rule{Rule: r, FailurePolicy: c.FailurePolicy}
}

// bucketRule is the rule of a limited descriptor, in its bucket. The
// bucket depends on the descriptor alone, never on what else its request
// holds, so that each limit of a caller counts in one bucket: the
// configured limit's is named by the entries (bucketed ones under
// share_threshold), and so is an override's equal to it, which shares
// it; an override of another limit counts in a bucket of that limit
// (limitBucket). Two rules of one request with one bucket thus always
// have one limit, and are one rule.
func (c Config) bucketRule(dom string, f resolved) gateway.Rule {
	be := f.entries
	if f.bucketed != nil {
		be = f.bucketed
	}
	rule := c.rule(f.lim, bucket(dom, be))
	if f.override && (f.configured == nil || !sameLimit(rule.Rule, c.rule(f.configured, rule.Bucket).Rule)) {
		rule.Bucket = bucket(dom, f.entries)
		rule.Bucket = limitBucket(rule.Rule)
	}
	rule.Tag, rule.Alone, rule.WasTag = placement(dom, be, f.vary, c.PreviousLayout)
	return rule
}

// unnamed is match's vary for the entries of a descriptor no node
// matches (an override's): every value but a generic_key's, which names a
// rule.
func unnamed(entries []entry) uint64 {
	var vary uint64
	for i, e := range entries {
		if e.key != "generic_key" {
			vary |= 1 << i
		}
	}
	return vary
}

// sameLimit reports whether a and b, rules of one bucket, decide alike:
// everything but the name (which tells the descriptors apart) agrees.
func sameLimit(a, b limiter.Rule) bool {
	a.Name = b.Name
	return a == b
}

// limitBucket is the bucket of r's entries under r's limit, for an
// override of another limit than the configured one: a hash of r's
// bucket and everything its state depends on, prefixed "l" so that it
// never equals an entries bucket ("e…").
func limitBucket(r limiter.Rule) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d\x00%s\x00%t", r.Bucket, r.Limit, int64(r.Period), r.Burst, r.Algorithm, r.Shadow))
	return "l" + hex.EncodeToString(sum[:16])
}

// current is the limit as a descriptor status reports it.
func (l *limit) current() *rlsv3.RateLimitResponse_RateLimit {
	if l.status != nil {
		return l.status
	}
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.ruleName, RequestsPerUnit: l.requestsPerUnit,
		Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[l.unit])}
	if l.multiplier > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(l.multiplier)
	}
	return rl
}

// overrideLimit is the limit a request sets for its descriptor; n is the
// node the descriptor matched (nil: none), which names the rule. An
// override of 0 blocks, as a configured 0 does (ratelimit's block list),
// and so does one that cannot be counted as sent (a unit that is none of
// ratelimit's, such as the UNKNOWN Envoy parses from metadata, or a period
// over limiter.MaxPeriod): refusing it with an error would let Envoy,
// failing open by default, pass the request uncounted.
func overrideLimit(dom string, n *node, o *commonv3.RateLimitDescriptor_RateLimitOverride) *limit {
	path := "override"
	if n != nil {
		path = n.path + ".override"
	}
	unit := o.GetUnit().String()
	l := &limit{requestsPerUnit: o.GetRequestsPerUnit(), unit: unit, multiplier: 1, ruleName: ruleName(dom, path)}
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		l.multiplier = m.GetValue()
	}
	period, ok := units[unit]
	if !ok || time.Duration(l.multiplier) > limiter.MaxPeriod/period {
		l.requestsPerUnit = 0
		return l
	}
	l.period = period * time.Duration(l.multiplier)
	return l
}

// identity names one request's descriptors in events: the domain and a
// hash of every entry of every descriptor, which the event hashes again
// with the gateway's key.
func identity(d *domain, all []resolved) string {
	b := make([]byte, 0, 512) // on the stack for most requests
	b = appendField(b, d.name)
	for _, f := range all {
		b = binary.AppendUvarint(b, uint64(len(f.entries)))
		for _, e := range f.entries {
			b = appendField(appendField(b, e.key), e.value)
		}
	}
	sum := sha256.Sum256(b)
	out := make([]byte, len(d.tag)+1+32)
	n := copy(out, d.tag)
	out[n] = '|'
	hex.Encode(out[n+1:], sum[:16])
	return string(out)
}

// DoorBucket is where the service counts a descriptor of domain with
// entries, under its configured limit, for the gateway's admin API
// (gateway.Admin.SetDoor): its limiter key and rule, and how a request of
// it alone is named in events. An override's bucket, named by its limit,
// is not reached this way. The error says why there is no bucket,
// without naming a value.
func (s *Service) DoorBucket(domain string, entries []gateway.DescriptorEntry) (gateway.DoorBucket, error) {
	snap := s.snap.Load()
	dom := snap.rules.domains[domain]
	if dom == nil {
		return gateway.DoorBucket{}, fmt.Errorf("no domain of grpc.config_dir is named %q", domain)
	}
	f := resolved{entries: make([]entry, len(entries))}
	desc := make([]gateway.DescriptorEntry, len(entries))
	for i, e := range entries {
		f.entries[i] = entry{e.Key, e.Value}
		desc[i] = gateway.DescriptorEntry{Key: e.Key, Value: e.Value, Secret: secretValue(e.Key, e.Value)}
	}
	n, ok, bucketed, vary := dom.match(f.entries)
	switch {
	case !ok:
		return gateway.DoorBucket{}, fmt.Errorf("no descriptor of domain %q limits these entries", domain)
	case n.limit.unlimited:
		return gateway.DoorBucket{}, fmt.Errorf("the entries' descriptor (%s) is unlimited", n.limit.ruleName)
	case n.limit.requestsPerUnit == 0:
		return gateway.DoorBucket{}, fmt.Errorf("the entries' descriptor (%s) blocks every request (requests_per_unit: 0)", n.limit.ruleName)
	}
	f.lim, f.configured, f.bucketed, f.vary = n.limit, n.limit, bucketed, vary
	rule := snap.cfg.bucketRule(dom.name, f)
	return gateway.DoorBucket{Key: dom.tag, Rules: []limiter.Rule{rule.Rule}, Identity: identity(dom, []resolved{f}),
		Domain: dom.name, Descriptor: desc}, nil
}

// charged sets each rule's cost: what rules[j] is charged (charges[j]) less
// what it is given back (gives[j]), a negative Cost when it gives back
// more; Cost stays 0 (the call's) when that is cost. A rule charged what
// it is given back changes nothing and is left out (its descriptors'
// picks then have none). Rules that give back go last, in order, so that
// a request of more rules than one limiter call takes gives back only
// once every charge is admitted (gateway.Call).
func charged(rules []gateway.Rule, charges, gives []int64, cost int64, picks []pick) []gateway.Rule {
	same := true
	for j := range rules {
		same = same && charges[j] == cost && gives[j] == 0
	}
	if same {
		return rules // the common case: every rule charged the call's cost
	}
	at := make([]int, len(rules)) // rules[j]'s place in out; -1: left out
	for j := range at {
		at[j] = -1
	}
	out := make([]gateway.Rule, 0, len(rules))
	for _, giving := range []bool{false, true} {
		for j, r := range rules {
			net := charges[j] - gives[j]
			if net == 0 || (net < 0) != giving {
				continue
			}
			if net != cost {
				r.Cost = net
			}
			at[j] = len(out)
			out = append(out, r)
		}
	}
	for i := range picks {
		if picks[i].rule >= 0 {
			picks[i].rule = at[picks[i].rule]
		}
	}
	return out
}
