package analytics

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

//go:embed sql/*.sql sql/part/*.sql
var sqlFS embed.FS

// keyFilters is the analyst's filters on the key rollup, written once
// (sql/part/key_filters.sql) for every query that takes them.
var keyFilters = strings.TrimSpace(mustRead("sql/part/key_filters.sql"))

// committed keeps the rows of committed batches (sql/part/committed.sql):
// every read of a consumer table filters by it.
var committed = strings.TrimSpace(mustRead("sql/part/committed.sql"))

// clientNet is a decision's client as the gateway keys it
// (sql/part/client_net.sql), for the queries that group or find clients.
var clientNet = strings.TrimSpace(mustRead("sql/part/client_net.sql"))

// mustSQL is the embedded query name as it runs: {key_filters},
// {client_net} and {committed} spliced.
func mustSQL(name string) string {
	return strings.NewReplacer("{key_filters}", keyFilters, "{client_net}", clientNet, "{committed}", committed).
		Replace(mustRead("sql/" + name + ".sql"))
}

func mustRead(file string) string {
	b, err := sqlFS.ReadFile(file)
	if err != nil {
		panic(fmt.Sprintf("analytics: embedded query %s: %v", file, err))
	}
	return string(b)
}

var (
	qTotalRequests = mustSQL("total_requests")
	qHotKeys       = mustSQL("hot_keys")
	qHotKeysRecent = mustSQL("hot_keys_recent")
	qNATIPs        = mustSQL("nat_ips")
	qStoreHealth   = mustSQL("store_health")
	qFailMinutes   = mustSQL("fail_minutes")
	qTrends        = mustSQL("trends")
	qTopKeys       = mustSQL("top_keys")
	qKeyHistory    = mustSQL("key_history")
	qIPHistory     = mustSQL("ip_history")
	qFreshness     = mustSQL("freshness")
	qKeySummary    = mustSQL("key_summary")
	qKeyAddress    = mustSQL("key_address")
)

// querier is the part of a ClickHouse connection the queries need.
type querier interface {
	Query(ctx context.Context, query string, args ...any) (driver.Rows, error)
}

// queryRows runs query and scans each row into a T with scan; what names
// the query in errors. It is every query's loop, so each caller is left
// with its bindings, its columns and what it does with the rows.
func queryRows[T any](ctx context.Context, ch querier, what, query string, args []any, scan func(driver.Rows, *T) error) ([]T, error) {
	rows, err := ch.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		if len(out) == maxRows {
			return nil, fmt.Errorf("%w: %s: more than %d rows; narrow the range or the filters, or use a coarser bucket or a smaller top",
				ErrBadQuery, what, maxRows)
		}
		var v T
		if err := scan(rows, &v); err != nil {
			return nil, fmt.Errorf("scan %s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return out, nil
}

// maxRows bounds every answer a query may hold in memory (and the API
// encode): past it the query fails as a bad one, rather than a range of
// minutes × gateways or × series filling the process. The detector's
// queries stay far under it (4 × max_keys keys × gateways).
const maxRows = 200000

// Reader runs analytics' queries against the consumer's rollups in
// ClickHouse. Every query reads a per-minute rollup, never the raw table.
type Reader struct {
	ch querier
}

// NewReader returns a Reader over ch (a clickhouse-go native connection).
func NewReader(ch querier) *Reader { return &Reader{ch: ch} }

// Buckets a trend can be grouped by; store health and the histories take
// minute, hour and day.
const (
	BucketMinute = "minute"
	Bucket5m     = "5m"
	Bucket15m    = "15m"
	BucketHour   = "hour"
	BucketDay    = "day"
)

// bucketAliases are the other names a trend bucket goes by.
var bucketAliases = map[string]string{"1m": BucketMinute, "1h": BucketHour, "1d": BucketDay}

// Dimensions a trend can be split by; DimNone gives one series.
const (
	DimNone    = ""
	DimRule    = "rule"
	DimRoute   = "route"
	DimPlan    = "plan"
	DimGateway = "gateway"
	DimKey     = "key"
	DimKind    = "kind"
	DimMethod  = "method"
)

// ErrBadQuery is wrapped by errors about a query's parameters; the HTTP API
// answers them with 400.
var ErrBadQuery = errors.New("analytics: bad query")

// Range is a time range [From, To) with optional filters, all applied at
// once; the zero filter matches everything.
type Range struct {
	From, To time.Time
	Rule     string
	Route    string
	Plan     string
	Gateway  string
	// KeyID is a key id, or (trends, top keys, key pages) a key name.
	KeyID string
	// KeyKind is api_key, user or ip (trends and top keys).
	KeyKind string
	// Method is an HTTP method (trends and top keys).
	Method string
}

// Span is the time range [From, To) an answer covers, embedded by every
// answer over a range so each says it the same way (the dashboard reads
// from and to).
type Span struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// keyKinds are the kinds a KeyKind filter takes, as the consumer stores
// them.
var keyKinds = []string{"", "api_key", "user", "ip"}

// maxSpan bounds how far back any query reaches.
const maxSpan = 400 * 24 * time.Hour

func (r Range) validate() error {
	if r.From.IsZero() || r.To.IsZero() || !r.From.Before(r.To) {
		return fmt.Errorf("%w: time range [%v, %v) is empty", ErrBadQuery, r.From, r.To)
	}
	if r.To.Sub(r.From) > maxSpan {
		return fmt.Errorf("%w: time range longer than %v", ErrBadQuery, maxSpan)
	}
	if !slices.Contains(keyKinds, r.KeyKind) {
		return fmt.Errorf("%w: kind %q: want api_key, user or ip", ErrBadQuery, r.KeyKind)
	}
	for _, f := range [...]struct{ name, v string }{{"rule", r.Rule}, {"route", r.Route}, {"plan", r.Plan},
		{"gateway", r.Gateway}, {"key", r.KeyID}, {"method", r.Method}} {
		if len(f.v) > maxFilterLen {
			return fmt.Errorf("%w: %s filter of %d bytes, over %d", ErrBadQuery, f.name, len(f.v), maxFilterLen)
		}
	}
	return nil
}

// maxFilterLen bounds a filter's value: no stored value is longer (the
// event's MaxFieldLen).
const maxFilterLen = 1024

// args binds the range: ClickHouse DateTime has seconds and the server's
// time zone, so times go as UTC seconds.
func (r Range) args() []any {
	return []any{
		clickhouse.Named("from", r.From.UTC().Truncate(time.Second)),
		clickhouse.Named("to", r.To.UTC().Truncate(time.Second)),
		clickhouse.Named("rule", r.Rule),
		clickhouse.Named("route", r.Route),
		clickhouse.Named("plan", r.Plan),
		clickhouse.Named("gateway", r.Gateway),
		clickhouse.Named("key", r.KeyID),
		clickhouse.Named("kind", r.KeyKind),
		clickhouse.Named("method", r.Method),
	}
}

func validBucket(b string) bool { return b == BucketMinute || b == BucketHour || b == BucketDay }

// BucketSize is a bucket's length (a day for BucketDay).
func BucketSize(b string) time.Duration {
	switch b {
	case Bucket5m:
		return 5 * time.Minute
	case Bucket15m:
		return 15 * time.Minute
	case BucketHour:
		return time.Hour
	case BucketDay:
		return 24 * time.Hour
	}
	return time.Minute
}

// maxPoints bounds the buckets one query may ask for.
const maxPoints = 50000

// TotalRequests counts all decisions in [from, to).
func (r *Reader) TotalRequests(ctx context.Context, from, to time.Time) (int64, error) {
	ns, err := queryRows(ctx, r.ch, "total requests", qTotalRequests, Range{From: from, To: to}.args(),
		func(rows driver.Rows, n *int64) error { return rows.Scan(n) })
	if err != nil || len(ns) == 0 {
		return 0, err
	}
	return ns[0], nil
}

// Freshness is how recent the data analytics reads is.
type Freshness struct {
	// Newest is the end of the newest minute in the rollups (zero: none in
	// the last day).
	Newest time.Time `json:"newest"`
	// LastCommit is when the consumer last committed a batch (zero: none
	// in the last day).
	LastCommit time.Time `json:"last_commit"`
	// Age is how far Newest is behind the run's time.
	Age time.Duration `json:"age_ns"`
	// Stale says the data is too old to act on (Config.StaleAfter).
	Stale bool `json:"stale"`
}

// Freshness reads how fresh the data is at now: the newest rollup minute
// and the consumer's last commit, looked for over the day before now.
func (r *Reader) Freshness(ctx context.Context, now time.Time) (Freshness, error) {
	args := []any{clickhouse.Named("from", now.UTC().Add(-24*time.Hour).Truncate(time.Second))}
	fs, err := queryRows(ctx, r.ch, "freshness", qFreshness, args, func(rows driver.Rows, f *Freshness) error {
		var newest, commit uint32
		if err := rows.Scan(&newest, &commit); err != nil {
			return err
		}
		if newest > 0 {
			f.Newest = time.Unix(int64(newest), 0).UTC().Add(time.Minute)
		}
		if commit > 0 {
			f.LastCommit = time.Unix(int64(commit), 0).UTC()
		}
		return nil
	})
	if err != nil || len(fs) == 0 {
		return Freshness{}, err
	}
	return fs[0], nil
}

// Judge sets f's Age at now and whether it is Stale: data whose newest
// minute ended more than staleAfter ago, or no data at all, is stale.
func (f Freshness) Judge(now time.Time, staleAfter time.Duration) Freshness {
	if f.Newest.IsZero() {
		f.Age, f.Stale = 24*time.Hour, true
		return f
	}
	f.Age = max(0, now.Sub(f.Newest))
	f.Stale = f.Age > staleAfter
	return f
}

// KeyTraffic returns the keys with at least minRequests allowed decisions
// in [from, to), at most limit of them, with their requests per gateway and
// their denials.
func (r *Reader) KeyTraffic(ctx context.Context, from, to time.Time, minRequests int64, limit int) ([]KeyTraffic, error) {
	args := append(Range{From: from, To: to}.args(),
		clickhouse.Named("min_requests", max(1, minRequests)),
		clickhouse.Named("limit", max(1, limit)))
	return r.keyTraffic(ctx, qHotKeys, "hot keys", args)
}

// RecentKeyTraffic returns, for the keys with at least minRequests
// decisions in the rollup's [from, to) (at most limit of them), their
// decisions per gateway since recent, to the second, from the raw table.
func (r *Reader) RecentKeyTraffic(ctx context.Context, from, to, recent time.Time, minRequests int64, limit int) ([]KeyTraffic, error) {
	args := append(Range{From: from, To: to}.args(),
		clickhouse.Named("recent", recent.UTC().Truncate(time.Second)),
		clickhouse.Named("min_requests", max(1, minRequests)),
		clickhouse.Named("limit", max(1, limit)))
	return r.keyTraffic(ctx, qHotKeysRecent, "recent key traffic", args)
}

// keyTraffic runs a query answering (key_id, key_kind, gateway_id, name,
// requests, denied) rows ordered by key, and gathers each key's gateways.
func (r *Reader) keyTraffic(ctx context.Context, query, what string, args []any) ([]KeyTraffic, error) {
	type row struct {
		id, kind, gw, name string
		n, denied          int64
	}
	rows, err := queryRows(ctx, r.ch, what, query, args, func(rows driver.Rows, k *row) error {
		return rows.Scan(&k.id, &k.kind, &k.gw, &k.name, &k.n, &k.denied)
	})
	if err != nil {
		return nil, err
	}
	var out []KeyTraffic
	for _, k := range rows {
		if len(out) == 0 || out[len(out)-1].KeyID != k.id || out[len(out)-1].KeyKind != k.kind {
			out = append(out, KeyTraffic{KeyID: k.id, KeyKind: k.kind, Gateways: map[string]int64{}})
		}
		out[len(out)-1].KeyName = max(out[len(out)-1].KeyName, k.name)
		out[len(out)-1].Gateways[k.gw] += k.n
		out[len(out)-1].Denied += k.denied
	}
	return out, nil
}

// NATQuery bounds the NAT candidates a query returns: an IP needs at least
// MinRequests and at least MinKeys distinct keys or MinUserAgents distinct
// user agents (0 turns a test off).
type NATQuery struct {
	From, To      time.Time
	MinRequests   int64
	MinKeys       int64
	MinUserAgents int64
	Limit         int
}

// IPTraffic returns the NAT candidates in [q.From, q.To) with their
// evidence, most distinct keys first.
func (r *Reader) IPTraffic(ctx context.Context, q NATQuery) ([]IPTraffic, error) {
	off := int64(1) << 62 // a test turned off can never pass
	keys, uas := q.MinKeys, q.MinUserAgents
	if keys <= 0 {
		keys = off
	}
	if uas <= 0 {
		uas = off
	}
	args := append(Range{From: q.From, To: q.To}.args(),
		clickhouse.Named("min_requests", max(0, q.MinRequests)),
		clickhouse.Named("min_keys", keys),
		clickhouse.Named("min_user_agents", uas),
		clickhouse.Named("limit", max(1, q.Limit)))
	return queryRows(ctx, r.ch, "nat ips", qNATIPs, args, func(rows driver.Rows, t *IPTraffic) error {
		return rows.Scan(&t.IP, &t.Requests, &t.Denied, &t.DistinctKeys, &t.DistinctUserAgents)
	})
}

// scanHealth scans a store_health row, its bucket into g.Minute when
// bucketed; a row of the whole range (bucketRange) has no minute.
func scanHealth(rows driver.Rows, g *GatewayHealth, bucketed bool) error {
	var q []float64
	if err := rows.Scan(&g.Minute, &g.Gateway, &g.Requests, &g.Denied, &g.StoreOK, &g.StoreUnavailable, &g.StoreTimeout,
		&g.StoreLocalCache, &g.FailOpen, &g.FailClosed, &g.LocalFallback, &q, &g.LatencyMax); err != nil {
		return err
	}
	if len(q) == 3 {
		g.LatencyP50, g.LatencyP90, g.LatencyP99 = q[0], q[1], q[2]
	}
	g.Minute = g.Minute.UTC()
	if !bucketed {
		g.Minute = time.Time{}
	}
	return nil
}

// bucketRange is store_health's one bucket of the whole range.
const bucketRange = "range"

// GatewayHealth returns each gateway's decisions in [from, to) by store
// status and failure mode.
func (r *Reader) GatewayHealth(ctx context.Context, from, to time.Time) ([]GatewayHealth, error) {
	return queryRows(ctx, r.ch, "gateway health", qStoreHealth, append(Range{From: from, To: to}.args(), clickhouse.Named("bucket", bucketRange)),
		func(rows driver.Rows, g *GatewayHealth) error { return scanHealth(rows, g, false) })
}

// StoreHealth returns each gateway's store health per bucket in rg (only
// rg.Gateway filters).
func (r *Reader) StoreHealth(ctx context.Context, rg Range, bucket string) ([]GatewayHealth, error) {
	if err := checkBuckets(rg, bucket); err != nil {
		return nil, err
	}
	return queryRows(ctx, r.ch, "store health", qStoreHealth, append(rg.args(), clickhouse.Named("bucket", bucket)),
		func(rows driver.Rows, g *GatewayHealth) error { return scanHealth(rows, g, true) })
}

func checkBuckets(rg Range, bucket string) error {
	if !validBucket(bucket) {
		return fmt.Errorf("%w: bucket %q: want minute, hour or day", ErrBadQuery, bucket)
	}
	return checkPoints(rg, bucket)
}

// checkPoints checks rg and that it holds at most maxPoints buckets.
func checkPoints(rg Range, bucket string) error {
	if err := rg.validate(); err != nil {
		return err
	}
	if n := rg.To.Sub(rg.From) / BucketSize(bucket); n > maxPoints {
		return fmt.Errorf("%w: %d %s buckets; use a coarser bucket or a shorter range", ErrBadQuery, n, bucket)
	}
	return nil
}

// FailMinute is a minute in which a gateway failed open or closed.
type FailMinute struct {
	Minute           time.Time `json:"minute"`
	Gateway          string    `json:"gateway"`
	Requests         int64     `json:"requests"`
	FailOpen         int64     `json:"fail_open"`
	FailClosed       int64     `json:"fail_closed"`
	StoreUnavailable int64     `json:"store_unavailable"`
}

// FailMinutes returns the minutes in rg in which a gateway failed open or
// closed (only rg.Gateway filters).
func (r *Reader) FailMinutes(ctx context.Context, rg Range) ([]FailMinute, error) {
	if err := rg.validate(); err != nil {
		return nil, err
	}
	return queryRows(ctx, r.ch, "fail minutes", qFailMinutes, rg.args(), func(rows driver.Rows, m *FailMinute) error {
		return scanAt(rows, &m.Minute, &m.Gateway, &m.Requests, &m.FailOpen, &m.FailClosed, &m.StoreUnavailable)
	})
}

// scanAt scans a row whose first column is a minute or bucket start into
// at, in UTC (the driver answers in the server's time zone), and the rest
// into dest.
func scanAt(rows driver.Rows, at *time.Time, dest ...any) error {
	err := rows.Scan(append([]any{at}, dest...)...)
	*at = at.UTC()
	return err
}
