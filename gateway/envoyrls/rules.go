package envoyrls

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/limiter"
)

// ErrRules wraps every problem found in a directory of Envoy ratelimit
// configuration files.
var ErrRules = errors.New("invalid envoy ratelimit config")

// The YAML of envoyproxy/ratelimit's configuration files, as its
// src/config reads them.
type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	QuotaMode      bool             `yaml:"quota_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unit            string         `yaml:"unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

// validKeys are the keys envoyproxy/ratelimit accepts anywhere in a file;
// any other key makes it refuse the file, and so does this loader.
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"name": true, "replaces": true, "detailed_metric": true,
	// Newer ratelimit versions' keys.
	"quota_mode": true, "value_to_metric": true, "share_threshold": true,
}

// units are ratelimit's units (RateLimitResponse.RateLimit.Unit) and the
// periods this gateway gives them; ratelimit counts the same lengths.
var units = map[string]time.Duration{
	"SECOND": time.Second,
	"MINUTE": time.Minute,
	"HOUR":   time.Hour,
	"DAY":    24 * time.Hour,
	"WEEK":   7 * 24 * time.Hour,
	"MONTH":  30 * 24 * time.Hour,
	"YEAR":   365 * 24 * time.Hour,
}

// Rules are the compiled configuration files: the domains and their
// descriptor trees. A reload builds new Rules and swaps them in.
type Rules struct {
	domains map[string]*domain
}

type domain struct {
	name string
	// tag is the limiter key every bucket of the domain lives under.
	tag  string
	root node
}

// node is one level of a descriptor tree: the children by "key_value"
// (or "key" alone for any value), wildcard children ("key_prefix*") in
// file order.
type node struct {
	children  map[string]*node
	wildcards []string
	limit     *limit
	// path is the node's place in the tree, ratelimit's stats key without
	// the domain ("key_value.key2"), and names the rule; a value that may
	// be a credential (see secretValue) is "-" and its place in its list
	// ("api_key_-2").
	path string
	// share: every value this wildcard node matches shares one bucket
	// (share_threshold); value is the wildcard value ("files/*").
	share bool
	value string
}

// limit is one descriptor's rate_limit.
type limit struct {
	name            string // ratelimit's rate_limit.name, for replaces
	replaces        []string
	unlimited       bool
	shadow          bool
	detailed        bool
	requestsPerUnit uint32
	unit            string // SECOND … YEAR
	period          time.Duration
	multiplier      uint32 // of unit, in a request's override; 0 or 1: one unit
	// ruleName is the rule's bounded name in headers, metrics and events.
	ruleName string
	// status is current's answer, made once for a configured limit:
	// every response that reports it shares it (never changed once made).
	status *rlsv3.RateLimitResponse_RateLimit
}

// Domains lists the configured domains, sorted.
func (r *Rules) Domains() []string {
	var out []string
	for name := range r.domains {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// LoadDir reads every *.yaml and *.yml file of dir (not below it, dot
// files aside), as envoyproxy/ratelimit reads its runtime config
// directory. Every problem names its file; a domain in two files is
// refused.
func LoadDir(dir string) (*Rules, error) {
	files, err := readDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRules, err)
	}
	return Parse(files)
}

// DirSum is a hash of what LoadDir would read from dir (file names and
// contents, through symlinks), so a poll can tell a changed directory,
// e.g. a Kubernetes ConfigMap's symlink swap, from an untouched one. ok is
// false when dir cannot be read.
func DirSum(dir string) (sum []byte, ok bool) {
	files, err := readDir(dir)
	if err != nil {
		return nil, false
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, name := range names {
		for _, b := range [][]byte{[]byte(name), files[name]} {
			h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
			h.Write(b)
		}
	}
	return h.Sum(nil), true
}

func readDir(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read config dir: %w", err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		files[filepath.Join(dir, e.Name())] = b
	}
	return files, nil
}

// Parse compiles configuration files by name.
func Parse(files map[string][]byte) (*Rules, error) {
	r := &Rules{domains: map[string]*domain{}}
	var errs []error
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := r.load(name, files[name]); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrRules, name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Rules) load(file string, content []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(content, &doc); err != nil {
		return fmt.Errorf("error loading config file: %w", err)
	}
	if len(doc.Content) == 0 {
		return errors.New("config file cannot have empty domain")
	}
	if err := checkKeys(doc.Content[0]); err != nil {
		return err
	}
	var root yamlRoot
	dec := yaml.NewDecoder(bytes.NewReader(content))
	if err := dec.Decode(&root); err != nil {
		return fmt.Errorf("error loading config file: %w", err)
	}
	if root.Domain == "" {
		return errors.New("config file cannot have empty domain")
	}
	if _, dup := r.domains[root.Domain]; dup {
		return fmt.Errorf("duplicate domain '%s' in config file", root.Domain)
	}
	d := &domain{name: root.Domain, tag: domainTag(root.Domain), root: node{children: map[string]*node{}}}
	if err := d.root.load(root.Domain, "", root.Descriptors); err != nil {
		return err
	}
	r.domains[root.Domain] = d
	return nil
}

// checkKeys refuses keys envoyproxy/ratelimit does not know, at any depth.
func checkKeys(n *yaml.Node) error {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Tag != "!!str" {
				return fmt.Errorf("config error, key is not of type string: %v", k.Value)
			}
			if !validKeys[k.Value] {
				return fmt.Errorf("config error, unknown key '%s'", k.Value)
			}
			if err := checkKeys(n.Content[i+1]); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, e := range n.Content {
			if e.Kind != yaml.MappingNode {
				return fmt.Errorf("config error, yaml file contains list of type other than map: %v", e.Value)
			}
			if err := checkKeys(e); err != nil {
				return err
			}
		}
	}
	return nil
}

func (n *node) load(dom, parent string, ds []yamlDescriptor) error {
	for i, d := range ds {
		if d.Key == "" {
			return errors.New("descriptor has empty key")
		}
		final, named := d.Key, d.Key
		if d.Value != "" {
			final += "_" + d.Value
			named += "_" + d.Value
			if secretValue(d.Key, d.Value) {
				// A value configured under a credential's key (a customer's
				// own API key given its own limit) would otherwise be in
				// the rule's name, and so in headers, metrics, events and
				// the errors below; its place in the list names it instead.
				named = fmt.Sprintf("%s_-%d", d.Key, i+1)
			}
		}
		path := named
		if parent != "" {
			path = parent + "." + named
		}
		if _, dup := n.children[final]; dup {
			return fmt.Errorf("duplicate descriptor composite key '%s.%s'", dom, path)
		}
		// A '*' ends a wildcard value only at its end; elsewhere it is a
		// character like any other, as in ratelimit.
		if d.ShareThreshold && !strings.HasSuffix(final, "*") {
			return fmt.Errorf("share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", final)
		}
		child := &node{children: map[string]*node{}, path: path, share: d.ShareThreshold, value: d.Value}
		if rl := d.RateLimit; rl != nil {
			unit := strings.ToUpper(rl.Unit)
			period, validUnit := units[unit]
			switch {
			case rl.Unlimited && validUnit:
				return errors.New("should not specify rate limit unit when unlimited")
			case !rl.Unlimited && !validUnit:
				return fmt.Errorf("invalid rate limit unit '%s'", rl.Unit)
			}
			// quota_mode reports OK over the limit, as shadow_mode does;
			// ratelimit also lists the violation in dynamic metadata.
			l := &limit{name: rl.Name, unlimited: rl.Unlimited, shadow: d.ShadowMode || d.QuotaMode, detailed: d.DetailedMetric,
				requestsPerUnit: rl.RequestsPerUnit, unit: unit, period: period, ruleName: ruleName(dom, path)}
			for _, rep := range rl.Replaces {
				if rep.Name == "" {
					return errors.New("should not have an empty replaces entry")
				}
				if rep.Name == rl.Name {
					return errors.New("replaces should not contain name of same descriptor")
				}
				l.replaces = append(l.replaces, rep.Name)
			}
			l.status = l.current()
			child.limit = l
		}
		if err := child.load(dom, path, d.Descriptors); err != nil {
			return err
		}
		n.children[final] = child
		if strings.HasSuffix(final, "*") {
			n.wildcards = append(n.wildcards, final)
		}
	}
	return nil
}

// entry is one key/value of a request's descriptor.
type entry struct{ key, value string }

// match finds the limit of one request descriptor the way ratelimit's
// GetLimit does: at each level "key_value", else the first wildcard whose
// prefix matches, else "key" (any value); the limit of the node reached by
// the last entry applies, none if the walk ends early. bucketed are the
// entries the descriptor's bucket is named by: entries itself, but with
// the wildcard value for entries matched by a share_threshold wildcard.
// Bit i of vary is set when entry i's value is not bounded by the
// configuration: matched by a node of any value or a wildcard that does
// not share (see placement).
func (d *domain) match(entries []entry) (n *node, ok bool, bucketed []entry, vary uint64) {
	n, bucketed = &d.root, entries
	for i, e := range entries {
		next := n.children[e.key+"_"+e.value]
		if next == nil {
			full := e.key + "_" + e.value
			for _, w := range n.wildcards {
				if strings.HasPrefix(full, strings.TrimSuffix(w, "*")) {
					next = n.children[w]
					break
				}
			}
			if next != nil && next.share {
				if &bucketed[0] == &entries[0] {
					bucketed = slices.Clone(entries)
				}
				bucketed[i].value = next.value
			} else if next != nil {
				vary |= 1 << i
			}
		}
		if next == nil {
			next = n.children[e.key]
			vary |= 1 << i
		}
		if next == nil {
			return nil, false, nil, 0
		}
		if i == len(entries)-1 {
			return next, next.limit != nil, bucketed, vary
		}
		if len(next.children) == 0 {
			return nil, false, nil, 0
		}
		n = next
	}
	return nil, false, nil, 0
}

// ruleName names a descriptor's rule in headers, metrics and events: the
// domain and the descriptor's place in the configuration (never a
// request's values, so the names are as many as the configured
// descriptors), in characters that need no escaping in a header's
// structured field, at most limiter.MaxNameLen bytes.
func ruleName(dom, path string) string {
	s := dom + "." + path
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == '.', c == '*', c == '/':
			b = append(b, c)
		default:
			b = append(b, '_')
		}
	}
	if len(b) > limiter.MaxNameLen {
		sum := sha256.Sum256([]byte(s))
		b = append(b[:limiter.MaxNameLen-17], '~')
		b = append(b, hex.EncodeToString(sum[:8])...)
	}
	return string(b)
}

// domainTag is the limiter key of a domain: every bucket of the domain
// lives under it, so all descriptors of one request are decided in one
// atomic call (one Redis Cluster slot per domain).
func domainTag(dom string) string {
	if len(dom) <= 128 && plain(dom) {
		return "rls:" + dom
	}
	sum := sha256.Sum256([]byte(dom))
	return "rls#" + hex.EncodeToString(sum[:16])
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return s != ""
}

// placement is where a descriptor's bucket lives in Redis
// (limiter.Rule's Tag, Alone and WasTag), from its entries and which of
// them vary (see match). A descriptor with one entry that varies names a
// caller by that value: it shares the container of the caller's
// descriptors (tagged by the domain and the value alone, whatever its
// key), so a request's descriptors of one caller are one key, read and
// written once; the others in it are values the configuration names, so
// the container holds one bucket per configured descriptor at most. One
// with several varying entries (a caller and a path) would grow that
// container with every value of the others: it has a key of its own,
// under the first one's tag (same slot, same call). One whose entries
// are all named by the configuration (generic_key's, a value a
// descriptor lists) is shared by every caller: a key of its own, where
// it always was. previous sets WasTag, the tag of the key of its own
// every descriptor had before (see Config.PreviousLayout).
func placement(dom string, entries []entry, vary uint64, previous bool) (tag string, alone bool, was string) {
	i := -1
	for j := range entries {
		if vary&(1<<j) != 0 {
			i = j
			break
		}
	}
	if i < 0 {
		return previousTag(dom, entries), true, ""
	}
	var buf [256]byte
	b := appendField(appendField(buf[:0], dom), entries[i].value)
	tag = hashName('c', b, 8)
	if previous {
		was = previousTag(dom, entries)
	}
	return tag, bits.OnesCount64(vary) > 1, was
}

// hashName is mark, then the first n bytes of b's SHA-256 in hex.
func hashName(mark byte, b []byte, n int) string {
	sum := sha256.Sum256(b)
	var out [1 + 2*sha256.Size]byte
	out[0] = mark
	hex.Encode(out[1:], sum[:n])
	return string(out[:1+2*n])
}

// appendField appends s length-prefixed, so that no two lists of fields
// hash alike.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// previousTag is the tag of a descriptor's own key in releases before
// callers' containers (and still, for a descriptor all of whose entries
// the configuration names): a hash of the domain and its first entry that
// is not a generic_key, or of all its entries when each is one.
func previousTag(dom string, entries []entry) string {
	var buf [256]byte
	b := appendField(buf[:0], dom)
	i := slices.IndexFunc(entries, func(e entry) bool { return e.key != "generic_key" })
	if i < 0 {
		for _, e := range entries {
			b = appendField(appendField(b, e.key), e.value)
		}
	} else {
		b = appendField(appendField(b, entries[i].key), entries[i].value)
	}
	return hashName('t', b, 8)
}

// bucket is the store identity of one request descriptor: a hash of the
// domain and the request's entries (keys and values), as ratelimit keys
// its counters by them, so every value of a wildcard or any-value
// descriptor counts apart and the same entries share one bucket whichever
// request carries them.
func bucket(dom string, entries []entry) string {
	var buf [256]byte
	b := appendField(buf[:0], dom)
	for _, e := range entries {
		b = appendField(appendField(b, e.key), e.value)
	}
	return hashName('e', b, 16)
}
