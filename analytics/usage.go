package analytics

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

var (
	qUsage        = mustSQL("usage")
	qUsageKeys    = mustSQL("usage_keys")
	qUsageThrough = mustSQL("usage_through")
	qUsageAccount = mustSQL("usage_accounting")
	qUsageSeq     = mustSQL("usage_seq")
)

// The dimensions a usage statement's rows can be split by.
const (
	UsageByKey   = "key"
	UsageByPlan  = "plan"
	UsageByRoute = "route"
	UsageByDay   = "day"
)

// usageDims are the dimensions in the order a row shows them.
var usageDims = []string{UsageByKey, UsageByPlan, UsageByRoute, UsageByDay}

// maxUsageKeys bounds the keys one statement names.
const maxUsageKeys = 1000

// UsageQuery asks what keys used in a period.
type UsageQuery struct {
	// From and To are the period, [From, To).
	From, To time.Time
	// TZ is the IANA zone days are cut in (UsageByDay); default UTC.
	TZ string
	// Keys are key ids or API keys' names; none: every key.
	Keys []string
	// By splits the rows, any of key, plan, route and day; default key,
	// plan and route.
	By []string
}

// UsagePeriod reads a statement's period as analysts give it: month
// ("2026-11", in loc), or from and to (ParseTime's forms, a bare date
// being midnight in loc). A month excludes from and to.
func UsagePeriod(month, from, to string, loc *time.Location, now time.Time) (time.Time, time.Time, error) {
	if month != "" {
		if from != "" || to != "" {
			return time.Time{}, time.Time{}, fmt.Errorf("%w: give a month or from and to, not both", ErrBadQuery)
		}
		m, err := time.ParseInLocation("2006-01", month, loc)
		if err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("%w: month %q: want YYYY-MM, e.g. 2026-11", ErrBadQuery, month)
		}
		return m, m.AddDate(0, 1, 0), nil
	}
	if from == "" {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: give a month (2026-11) or from (and to)", ErrBadQuery)
	}
	at := func(s string, def time.Time) (time.Time, error) {
		if d, err := time.ParseInLocation("2006-01-02", strings.TrimSpace(s), loc); err == nil {
			return d, nil
		}
		return ParseTime(s, now, def)
	}
	f, err := at(from, time.Time{})
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	t, err := at(to, now)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	return f, t, nil
}

// normalize checks q and fills its defaults; loc is q.TZ loaded.
func (q UsageQuery) normalize() (UsageQuery, *time.Location, error) {
	if q.TZ == "" {
		q.TZ = "UTC"
	}
	loc, err := LoadZone(q.TZ)
	if err != nil {
		return q, nil, err
	}
	if !q.From.Before(q.To) {
		return q, nil, fmt.Errorf("%w: the period's start %s is not before its end %s", ErrBadQuery, q.From.Format(time.RFC3339), q.To.Format(time.RFC3339))
	}
	if q.To.Sub(q.From) > 400*24*time.Hour {
		return q, nil, fmt.Errorf("%w: a period of at most 400 days", ErrBadQuery)
	}
	if len(q.By) == 0 {
		q.By = []string{UsageByKey, UsageByPlan, UsageByRoute}
	}
	for i, b := range q.By {
		if !slices.Contains(usageDims, b) {
			return q, nil, fmt.Errorf("%w: by %q: want key, plan, route or day (or several, comma separated)", ErrBadQuery, b)
		}
		if slices.Contains(q.By[:i], b) {
			return q, nil, fmt.Errorf("%w: by %q given twice", ErrBadQuery, b)
		}
	}
	// Shown in one order whatever the order asked.
	q.By = slices.DeleteFunc(slices.Clone(usageDims), func(d string) bool { return !slices.Contains(q.By, d) })
	if len(q.Keys) > maxUsageKeys {
		return q, nil, fmt.Errorf("%w: %d keys; at most %d", ErrBadQuery, len(q.Keys), maxUsageKeys)
	}
	for _, k := range q.Keys {
		if k == "" || len(k) > 256 {
			return q, nil, fmt.Errorf("%w: key %q: want a key id or an API key's name", ErrBadQuery, k)
		}
	}
	q.From, q.To = q.From.Truncate(time.Second), q.To.Truncate(time.Second)
	return q, loc, nil
}

// UsageRow is what one key (or every key, without UsageByKey) used in the
// period, per the statement's other dimensions.
type UsageRow struct {
	KeyID   string `json:"key_id,omitempty"`
	KeyName string `json:"key_name,omitempty"`
	KeyKind string `json:"key_kind,omitempty"`
	Plan    string `json:"plan,omitempty"`
	Route   string `json:"route,omitempty"`
	// Day is the day's date in the statement's zone (UsageByDay).
	Day string `json:"day,omitempty"`
	UsageCounts
}

// UsageCounts are a row's figures. Requests = Allowed + Denied; the costs
// are the requests' units, allowed and denied; WithoutStore counts the
// decisions no shared store made (fail open, the local fallback).
type UsageCounts struct {
	Requests     int64 `json:"requests"`
	Allowed      int64 `json:"allowed"`
	Denied       int64 `json:"denied"`
	AllowedCost  int64 `json:"allowed_cost"`
	DeniedCost   int64 `json:"denied_cost"`
	WithoutStore int64 `json:"without_store"`
}

func (c *UsageCounts) add(o UsageCounts) {
	c.Requests += o.Requests
	c.Allowed += o.Allowed
	c.Denied += o.Denied
	c.AllowedCost += o.AllowedCost
	c.DeniedCost += o.DeniedCost
	c.WithoutStore += o.WithoutStore
}

// UsageStatement is what keys used in a period, read from committed
// batches only, each decision once.
type UsageStatement struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	TZ   string    `json:"tz"`
	By   []string  `json:"by"`
	// Keys are the keys asked for, as given (none: every key).
	Keys  []string    `json:"keys"`
	Rows  []UsageRow  `json:"rows"`
	Total UsageCounts `json:"total"`
	// DataThrough is the start of the newest minute with a committed
	// decision (zero: none since From). Complete says it is not before
	// To: a decision at or after the period's end is stored, so the
	// consumer is past the period too.
	DataThrough time.Time `json:"data_through"`
	Complete    bool      `json:"complete"`
	// Incomplete says why not, when not.
	Incomplete string `json:"incomplete,omitempty"`
	// Gateways are the gateway runs that published in the period, with
	// the decision events each dropped (never reached the stream) there;
	// Dropped is their sum: the statement may be short by up to that many
	// decisions, of keys the gateways cannot name. A statement is
	// complete only with no drops and every run's accounting settled.
	Gateways []GatewayAccount `json:"gateways"`
	Dropped  int64            `json:"dropped"`
	// Sequences put, per key, how many decisions the shared store
	// numbered in the period beside how many of them are stored; Missing
	// is their sum of what is not: a decision lost anywhere on the way
	// (dropped by a gateway, or never published), whoever counted it.
	Sequences []KeySequence `json:"sequences"`
	Missing   int64         `json:"missing"`
	// Reconciled is the limiter's own count beside the statement's, for
	// a key's current calendar window (Reconcile).
	Reconciled []Reconciliation `json:"reconciled,omitempty"`
}

// GatewayAccount is one gateway run's accounting in a period: what its
// publisher was given, published and dropped there, from the running
// totals it reports into the stream (event mode accounting). The figures
// run from its last report before the period to its first at or after the
// end, so drops near the edges are counted in: at most, never short.
type GatewayAccount struct {
	GatewayID string    `json:"gateway_id"`
	RunStart  time.Time `json:"run_start"`
	Decisions int64     `json:"decisions"`
	Published int64     `json:"published"`
	Dropped   int64     `json:"dropped"`
	// DroppedBy is Dropped by reason (buffer_full, broker_error,
	// encode_error, closed); reasons with none are left out.
	DroppedBy map[string]int64 `json:"dropped_by,omitempty"`
	// LastReport is the newest report read; Settled says a report at or
	// after the period's end, or the run's final one, is stored, so no
	// drop of the period can come later.
	LastReport time.Time `json:"last_report"`
	Settled    bool      `json:"settled"`
}

// KeySequence is one key's numbered decisions in a period. Redis numbers
// each identity's decisions 1, 2, ... in the call that makes them, so
// Decided counts, per sequence, from the first number of the period (1
// for a sequence begun in it) to the last one stored; Stored is how many
// of those are stored, Missing the difference. Decisions without a number
// (cached denials, fail open, the local fallback) are in Unnumbered. A
// decision lost after a key's last stored one shows once a later one of
// its sequence is stored.
type KeySequence struct {
	KeyID   string `json:"key_id"`
	KeyName string `json:"key_name,omitempty"`
	Decided int64  `json:"decided"`
	Stored  int64  `json:"stored"`
	Missing int64  `json:"missing"`
	// Unnumbered counts the key's stored decisions no shared store made
	// (cached denials, fail open or closed, the local fallback), apart.
	Unnumbered int64 `json:"unnumbered"`
}

// Reconciliation puts a calendar rule's count in the limiter beside the
// statement's allowed cost of the same key in the same window.
type Reconciliation struct {
	KeyID   string `json:"key_id"`
	KeyName string `json:"key_name"`
	Rule    string `json:"rule"`
	// WindowStart and WindowEnd are the rule's current window; At is the
	// store's time the count was read at, the statement's end.
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	At          time.Time `json:"at"`
	// LimiterCount is the units the limiter counted in the window (a
	// grant, Granted, is not among them); StatementCost the statement's
	// allowed cost of the key; Difference the first less the second: 0
	// when every decision the limiter counted is stored.
	LimiterCount  int64 `json:"limiter_count"`
	Granted       int64 `json:"granted"`
	StatementCost int64 `json:"statement_cost"`
	Difference    int64 `json:"difference"`
}

// Usage returns the usage statement of q. A key of q.Keys that has no
// committed decision at all is an error (ErrBadQuery), not a statement of
// nothing used; a key that has some, but none in the period, gets a row
// of zeros when rows are split by key.
func (r *Reader) Usage(ctx context.Context, q UsageQuery) (UsageStatement, error) {
	q, loc, err := q.normalize()
	if err != nil {
		return UsageStatement{}, err
	}
	known := map[string]UsageRow{} // by key id
	if len(q.Keys) > 0 {
		type idName struct{ id, name, kind string }
		found, err := queryRows(ctx, r.ch, "usage keys", qUsageKeys, []any{clickhouse.Named("keys", q.Keys)}, func(rows driver.Rows, k *idName) error {
			return rows.Scan(&k.id, &k.name, &k.kind)
		})
		if err != nil {
			return UsageStatement{}, err
		}
		var missing []string
		for _, k := range q.Keys {
			if !slices.ContainsFunc(found, func(f idName) bool { return f.id == k || f.name == k }) {
				missing = append(missing, strconv.Quote(k))
			}
		}
		if len(missing) > 0 {
			return UsageStatement{}, fmt.Errorf("%w: no key %s: no decision of it is stored (give a key id, or an API key's name)", ErrBadQuery, strings.Join(missing, ", "))
		}
		for _, f := range found {
			row := known[f.id]
			row.KeyID, row.KeyKind = f.id, f.kind
			row.KeyName = max(row.KeyName, f.name)
			known[f.id] = row
		}
	}
	flag := func(d string) int {
		if slices.Contains(q.By, d) {
			return 1
		}
		return 0
	}
	keys, all := q.Keys, 0
	if len(keys) == 0 {
		keys, all = []string{""}, 1 // typed for has(); unused with all_keys
	}
	args := []any{
		clickhouse.Named("from", q.From.UTC()), clickhouse.Named("to", q.To.UTC()), clickhouse.Named("tz", q.TZ),
		clickhouse.Named("by_key", flag(UsageByKey)), clickhouse.Named("by_plan", flag(UsageByPlan)),
		clickhouse.Named("by_route", flag(UsageByRoute)), clickhouse.Named("by_day", flag(UsageByDay)),
		clickhouse.Named("all_keys", all), clickhouse.Named("keys", keys),
	}
	rows, err := queryRows(ctx, r.ch, "usage", qUsage, args, func(rows driver.Rows, u *UsageRow) error {
		var day uint32
		err := rows.Scan(&u.KeyID, &u.KeyKind, &u.KeyName, &u.Plan, &u.Route, &day,
			&u.Requests, &u.Allowed, &u.Denied, &u.AllowedCost, &u.DeniedCost, &u.WithoutStore)
		if day != 0 {
			u.Day = time.Unix(int64(day), 0).In(loc).Format("2006-01-02")
		}
		return err
	})
	if err != nil {
		return UsageStatement{}, err
	}
	st := UsageStatement{From: q.From, To: q.To, TZ: q.TZ, By: q.By, Keys: q.Keys, Rows: rows}
	if flag(UsageByKey) == 1 {
		// A key asked for that used nothing says so with zeros.
		for id, k := range known {
			if !slices.ContainsFunc(rows, func(u UsageRow) bool { return u.KeyID == id }) {
				st.Rows = append(st.Rows, k)
			}
		}
		slices.SortStableFunc(st.Rows, func(a, b UsageRow) int { return strings.Compare(a.KeyID, b.KeyID) })
	}
	for _, u := range st.Rows {
		st.Total.add(u.UsageCounts)
	}
	through, err := queryRows(ctx, r.ch, "usage data through", qUsageThrough, []any{clickhouse.Named("from", q.From.UTC())}, func(rows driver.Rows, t *uint32) error {
		return rows.Scan(t)
	})
	if err != nil {
		return UsageStatement{}, err
	}
	if len(through) == 1 && through[0] > 0 {
		st.DataThrough = time.Unix(int64(through[0]), 0).UTC()
	}
	if st.Gateways, err = r.gatewayAccounts(ctx, q); err != nil {
		return UsageStatement{}, err
	}
	if st.Gateways == nil {
		st.Gateways = []GatewayAccount{} // JSON: none, not unknown
	}
	ids := slices.Sorted(maps.Keys(known))
	if len(ids) == 0 {
		ids = []string{""} // typed for has(); unused with all_keys
	}
	if st.Sequences, err = r.sequences(ctx, q, ids, all); err != nil {
		return UsageStatement{}, err
	}
	names := map[string]string{} // key id to name, from the keys asked for and the rows
	for id, k := range known {
		names[id] = k.KeyName
	}
	for _, u := range st.Rows {
		if u.KeyName != "" {
			names[u.KeyID] = u.KeyName
		}
	}
	for i, s := range st.Sequences {
		st.Missing += s.Missing
		st.Sequences[i].KeyName = names[s.KeyID]
	}
	var why []string
	// A stored decision at or after the end: the newest minute's start,
	// since the rollup knows no finer time.
	switch {
	case st.DataThrough.IsZero():
		why = append(why, "no decision since the period's start is stored")
	case st.DataThrough.Before(q.To):
		why = append(why, "no decision at or after the period's end is stored yet (data through "+st.DataThrough.Format(time.RFC3339)+")")
	}
	var unsettled []string
	for _, g := range st.Gateways {
		st.Dropped += g.Dropped
		if !g.Settled {
			unsettled = append(unsettled, g.GatewayID+" (last report "+g.LastReport.Format(time.RFC3339)+")")
		}
	}
	if st.Missing > 0 {
		var lost []string
		for _, s := range st.Sequences {
			if s.Missing > 0 {
				lost = append(lost, fmt.Sprintf("%s %d", cmp.Or(s.KeyName, s.KeyID), s.Missing))
			}
		}
		why = append(why, fmt.Sprintf("the store numbered %d decisions of the period that are not stored (%s)", st.Missing, strings.Join(lost, ", ")))
	}
	if st.Dropped > 0 {
		why = append(why, fmt.Sprintf("gateways dropped %d decision events in the period: the statement may be short by up to %d decisions", st.Dropped, st.Dropped))
	}
	if len(unsettled) > 0 {
		why = append(why, "no accounting at or after the period's end from gateway "+strings.Join(unsettled, ", ")+
			": drops after its last report are not known yet (a gateway that stopped without a final report never settles)")
	}
	st.Complete = len(why) == 0
	st.Incomplete = strings.Join(why, "; ")
	return st, nil
}

// sequences reads, per key of ids (every key with all = 1), its numbered
// decisions in q's period.
func (r *Reader) sequences(ctx context.Context, q UsageQuery, ids []string, all int) ([]KeySequence, error) {
	type run struct {
		key              string
		epoch, n, lo, hi int64
	}
	runs, err := queryRows(ctx, r.ch, "usage sequences", qUsageSeq, []any{clickhouse.Named("from", q.From.UTC()),
		clickhouse.Named("to", q.To.UTC()), clickhouse.Named("all_keys", all), clickhouse.Named("keys", ids)},
		func(rows driver.Rows, x *run) error { return rows.Scan(&x.key, &x.epoch, &x.n, &x.lo, &x.hi) })
	if err != nil {
		return nil, err
	}
	out := []KeySequence{}
	for _, x := range runs {
		if len(out) == 0 || out[len(out)-1].KeyID != x.key {
			out = append(out, KeySequence{KeyID: x.key})
		}
		s := &out[len(out)-1]
		if x.epoch == 0 {
			s.Unnumbered += x.n
			continue
		}
		// A sequence begun before the period: its first number in it is
		// its first stored one (what was lost before that is not seen).
		base := int64(0)
		if x.epoch < q.From.UnixNano() {
			base = x.lo - 1
		}
		s.Decided += x.hi - base
		s.Stored += x.n
		s.Missing = s.Decided - s.Stored
	}
	return out, nil
}

// gatewayAccounts reads the accounting of every gateway run that reported
// in q's period.
func (r *Reader) gatewayAccounts(ctx context.Context, q UsageQuery) ([]GatewayAccount, error) {
	type totals struct{ d, p, bf, be, ee, cl int64 }
	return queryRows(ctx, r.ch, "usage accounting", qUsageAccount,
		[]any{clickhouse.Named("from", q.From.UTC()), clickhouse.Named("to", q.To.UTC())},
		func(rows driver.Rows, g *GatewayAccount) error {
			var (
				start int64
				a, b  totals
				after uint64
				ended uint8
				last  uint32
			)
			if err := rows.Scan(&g.GatewayID, &start, &a.d, &a.p, &a.bf, &a.be, &a.ee, &a.cl, &after,
				&b.d, &b.p, &b.bf, &b.be, &b.ee, &b.cl, &ended, &last); err != nil {
				return err
			}
			g.RunStart, g.LastReport = time.Unix(0, start).UTC(), time.Unix(int64(last), 0).UTC()
			g.Settled = after > 0 || ended == 1
			g.Decisions, g.Published = b.d-a.d, b.p-a.p
			for reason, n := range map[string]int64{"buffer_full": b.bf - a.bf, "broker_error": b.be - a.be,
				"encode_error": b.ee - a.ee, "closed": b.cl - a.cl} {
				if n > 0 {
					if g.DroppedBy == nil {
						g.DroppedBy = map[string]int64{}
					}
					g.DroppedBy[reason] = n
					g.Dropped += n
				}
			}
			return nil
		})
}

// UsageHeader is the CSV and table header of a statement split by by.
func UsageHeader(by []string) []string {
	var h []string
	for _, d := range by {
		switch d {
		case UsageByKey:
			h = append(h, "key_id", "key_name", "key_kind")
		default:
			h = append(h, d)
		}
	}
	return append(h, "requests", "allowed", "denied", "allowed_cost", "denied_cost", "without_store")
}

// Record is u as a CSV row under UsageHeader(by).
func (u UsageRow) Record(by []string) []string {
	var rec []string
	for _, d := range by {
		switch d {
		case UsageByKey:
			rec = append(rec, u.KeyID, u.KeyName, u.KeyKind)
		case UsageByPlan:
			rec = append(rec, u.Plan)
		case UsageByRoute:
			rec = append(rec, u.Route)
		case UsageByDay:
			rec = append(rec, u.Day)
		}
	}
	i := strconv.FormatInt
	return append(rec, i(u.Requests, 10), i(u.Allowed, 10), i(u.Denied, 10), i(u.AllowedCost, 10), i(u.DeniedCost, 10), i(u.WithoutStore, 10))
}

// Reconcile adds to st, a statement of one key over the window of a
// calendar rule read at at, that rule's count in the limiter.
func (st *UsageStatement) Reconcile(rule string, count, granted int64, windowStart, windowEnd, at time.Time) {
	r := Reconciliation{Rule: rule, WindowStart: windowStart, WindowEnd: windowEnd, At: at, LimiterCount: count, Granted: granted}
	for _, u := range st.Rows {
		r.StatementCost += u.AllowedCost
		if u.KeyID != "" {
			r.KeyID, r.KeyName = u.KeyID, max(r.KeyName, u.KeyName)
		}
	}
	r.Difference = r.LimiterCount - r.StatementCost
	st.Reconciled = append(st.Reconciled, r)
}
