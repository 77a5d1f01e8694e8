package analytics

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/limiter"
)

// KeyReport is one key's page: who it is, what it did in a range and what
// the limits do to it now. It answers for a key id (the HMAC) or a key name
// (an API key's configured id); a name can match several ids, which the
// report adds up and lists.
type KeyReport struct {
	// Key is what was asked for.
	Key string `json:"key"`
	Span
	// Keys are the keys that matched, by id and kind.
	Keys []KeyIdentity `json:"keys"`
	// Total sums every decision of the matched keys.
	Total KeyCount `json:"total"`
	// Rules, Routes, Gateways, Plans and Methods break Total down, the most
	// denied first.
	Rules    []KeyCount `json:"rules"`
	Routes   []KeyCount `json:"routes"`
	Gateways []KeyCount `json:"gateways"`
	Plans    []KeyCount `json:"plans"`
	Methods  []KeyCount `json:"methods"`
	// Truncated says the breakdown hit its row limit: the counts are a
	// lower bound.
	Truncated bool `json:"truncated,omitempty"`
	// Splits are the split directives in force for the matched keys.
	Splits []limiter.SplitDirective `json:"splits"`
	// NATs are the NAT directives in force for the matched IP keys.
	NATs []limiter.NATDirective `json:"nats"`
	// ipKeys maps a matched IP key's id to its limiter key (its address),
	// which NAT directives name.
	ipKeys map[string]string
	// Directives says where the directives came from: "redis", or why
	// they are unknown ("not read": no Redis configured).
	Directives string `json:"directives"`
	// Bucket and History are the matched keys' trend over the range.
	Bucket  string       `json:"bucket"`
	TZ      string       `json:"tz"`
	History []TrendPoint `json:"history"`
}

// KeyIdentity is one key: the one a report matched, the one an answer's
// row is about.
type KeyIdentity struct {
	KeyID   string `json:"key_id"`
	KeyKind string `json:"key_kind"`
	// KeyName is the key's name (an API key's configured id), or "".
	KeyName string `json:"key_name"`
}

// KeyCount is a key's decisions under one value of a dimension (a rule, a
// route, ...). Denied is RateLimited plus FailClosed.
type KeyCount struct {
	Name        string  `json:"name"`
	Requests    int64   `json:"requests"`
	Denied      int64   `json:"denied"`
	Ratio       float64 `json:"ratio"`
	RateLimited int64   `json:"rate_limited"`
	FailClosed  int64   `json:"fail_closed"`
	FailOpen    int64   `json:"fail_open"`
	Shadow      int64   `json:"shadow"`
	Cost        int64   `json:"cost"`
	CostAllowed int64   `json:"cost_allowed"`
}

func (c *KeyCount) add(o KeyCount) {
	c.Requests += o.Requests
	c.Denied += o.Denied
	c.FailClosed += o.FailClosed
	c.FailOpen += o.FailOpen
	c.Shadow += o.Shadow
	c.Cost += o.Cost
	c.CostAllowed += o.CostAllowed
	c.RateLimited = c.Denied - c.FailClosed
	c.Ratio = ratio(c.Denied, c.Requests)
}

// maxKeyRows bounds a key page's breakdown: rules × routes × gateways ×
// plans × methods of one key, a product of configuration sizes.
const maxKeyRows = 10000

// maxKeyLen bounds the key asked for: an id is 32 hex digits, a name at
// most the event's MaxFieldLen.
const maxKeyLen = 1024

// KeyReport reads key's page over rg (its filters unused), with its
// history per bucket in time zone tz (see TrendQuery). It finds no
// directives; see KeyReport.AddDirectives.
func (r *Reader) KeyReport(ctx context.Context, rg Range, key, bucket, tz string) (KeyReport, error) {
	if key == "" || len(key) > maxKeyLen {
		return KeyReport{}, fmt.Errorf("%w: key %d bytes long: want a key id or a key name", ErrBadQuery, len(key))
	}
	rg = Range{From: rg.From, To: rg.To, KeyID: key}
	q, err := TrendQuery{Range: rg, Bucket: bucket, TZ: tz}.normalize()
	if err != nil {
		return KeyReport{}, err
	}
	type row struct {
		id                            KeyIdentity
		rule, route, gw, plan, method string
		c                             KeyCount
	}
	args := append(rg.args(), clickhouse.Named("limit", maxKeyRows))
	rows, err := queryRows(ctx, r.ch, "key summary", qKeySummary, args, func(rows driver.Rows, k *row) error {
		return rows.Scan(&k.id.KeyID, &k.id.KeyKind, &k.id.KeyName, &k.rule, &k.route, &k.gw, &k.plan, &k.method,
			&k.c.Requests, &k.c.Denied, &k.c.FailClosed, &k.c.FailOpen, &k.c.Shadow, &k.c.Cost, &k.c.CostAllowed)
	})
	if err != nil {
		return KeyReport{}, err
	}
	rep := KeyReport{Key: key, Span: Span{From: rg.From, To: rg.To}, Bucket: q.Bucket, TZ: q.TZ, Truncated: len(rows) == maxKeyRows,
		Directives: "not read"}
	keys := map[KeyIdentity]bool{}
	by := make([]map[string]*KeyCount, 5)
	for i := range by {
		by[i] = map[string]*KeyCount{}
	}
	for _, k := range rows {
		keys[k.id] = true
		rep.Total.add(k.c)
		for i, v := range []string{k.rule, k.route, k.gw, k.plan, k.method} {
			c := by[i][v]
			if c == nil {
				c = &KeyCount{Name: v}
				by[i][v] = c
			}
			c.add(k.c)
		}
	}
	rep.Keys = slices.SortedFunc(maps.Keys(keys), func(a, b KeyIdentity) int {
		return cmp.Or(cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.KeyKind, b.KeyKind), cmp.Compare(a.KeyName, b.KeyName))
	})
	rep.Keys = mergeNames(rep.Keys)
	sorted := func(m map[string]*KeyCount) []KeyCount {
		out := make([]KeyCount, 0, len(m))
		for _, c := range m {
			out = append(out, *c)
		}
		slices.SortFunc(out, func(a, b KeyCount) int {
			return cmp.Or(cmp.Compare(b.Denied, a.Denied), cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.Name, b.Name))
		})
		return out
	}
	rep.Rules, rep.Routes, rep.Gateways, rep.Plans, rep.Methods = sorted(by[0]), sorted(by[1]), sorted(by[2]), sorted(by[3]), sorted(by[4])
	if len(rows) == 0 {
		return rep, nil
	}
	if rep.History, err = r.Trends(ctx, q); err != nil {
		return KeyReport{}, err
	}
	for _, k := range rep.Keys {
		if k.KeyKind != "ip" {
			continue
		}
		args := []any{clickhouse.Named("key", k.KeyID), clickhouse.Named("from", rg.From.UTC().Truncate(time.Second)),
			clickhouse.Named("to", rg.To.UTC().Truncate(time.Second))}
		ips, err := queryRows(ctx, r.ch, "key address", qKeyAddress, args, func(rows driver.Rows, ip *string) error { return rows.Scan(ip) })
		if err != nil {
			return KeyReport{}, err
		}
		if len(ips) != 1 {
			continue
		}
		if ipKey, ok := limiter.IPKey(ips[0]); ok {
			if rep.ipKeys == nil {
				rep.ipKeys = map[string]string{}
			}
			rep.ipKeys[k.KeyID] = ipKey
		}
	}
	return rep, nil
}

// mergeNames folds a key's unnamed rows (stored before key names were
// kept) into its named identity, sorted by id: one key, one line.
func mergeNames(ids []KeyIdentity) []KeyIdentity {
	var out []KeyIdentity
	for _, id := range ids {
		if n := len(out); n > 0 && out[n-1].KeyID == id.KeyID && out[n-1].KeyKind == id.KeyKind {
			out[n-1].KeyName = max(out[n-1].KeyName, id.KeyName)
			continue
		}
		out = append(out, id)
	}
	return out
}

// AddDirectives sets the split and NAT directives in force at now for the
// report's keys from d, a set read from Redis.
func (rep *KeyReport) AddDirectives(d limiter.Directives, now time.Time) {
	rep.Directives, rep.Splits, rep.NATs = "redis", nil, nil
	for _, k := range rep.Keys {
		if s, ok := d.Splits[limiter.DirectiveKey(k.KeyKind, k.KeyID)]; ok && s.Expires.After(now) {
			rep.Splits = append(rep.Splits, s)
		}
		ipKey, isIP := rep.ipKeys[k.KeyID]
		if n, ok := d.NATs[ipKey]; isIP && k.KeyKind == "ip" && ok && n.Expires.After(now) {
			rep.NATs = append(rep.NATs, n)
		}
	}
}
