package analytics

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
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

// TrendQuery asks for rejections over time.
type TrendQuery struct {
	Range
	// Bucket is minute, 5m, 15m, hour or day (or 1m, 1h, 1d).
	Bucket string
	// TZ is the IANA time zone buckets are aligned in (an hour in
	// Asia/Kolkata starts at :30 UTC, a day at local midnight); default
	// UTC.
	TZ string
	// By splits the trend: rule, route, plan, gateway, key, kind, method,
	// or "" (one series).
	By string
	// Top keeps the Top series with the most rejections (then requests)
	// and sums the rest into one series named "(other)"; 0 keeps all, and
	// is refused for a split by key (use Top or TopKeys).
	Top int
}

// Validate reports a query that must not run.
func (q TrendQuery) Validate() error {
	_, err := q.normalize()
	return err
}

// normalize validates q and returns it with its bucket's alias resolved
// and its time zone loaded.
func (q TrendQuery) normalize() (TrendQuery, error) {
	if b, ok := bucketAliases[q.Bucket]; ok {
		q.Bucket = b
	}
	if q.Bucket == "" || q.Bucket == "auto" {
		q.Bucket = AutoBucket(q.From, q.To)
	}
	if !slices.Contains([]string{BucketMinute, Bucket5m, Bucket15m, BucketHour, BucketDay}, q.Bucket) {
		return q, fmt.Errorf("%w: bucket %q: want minute (1m), 5m, 15m, hour (1h) or day (1d)", ErrBadQuery, q.Bucket)
	}
	if q.TZ == "" {
		q.TZ = "UTC"
	}
	if _, err := LoadZone(q.TZ); err != nil {
		return q, err
	}
	if err := checkPoints(q.Range, q.Bucket); err != nil {
		return q, err
	}
	if !slices.Contains([]string{DimNone, DimRule, DimRoute, DimPlan, DimGateway, DimKey, DimKind, DimMethod}, q.By) {
		return q, fmt.Errorf("%w: by %q: want rule, route, plan, gateway, key, kind or method", ErrBadQuery, q.By)
	}
	if q.Top < 0 || q.Top > 1000 {
		return q, fmt.Errorf("%w: top %d outside [0, 1000]", ErrBadQuery, q.Top)
	}
	if q.By == DimKey && q.Top == 0 {
		return q, fmt.Errorf("%w: a split by key needs top (at most 1000 series)", ErrBadQuery)
	}
	// Each bucket holds up to top series and (other): refused before
	// ClickHouse works on it when that is more than an answer may hold
	// (a split without top has as many series as the configuration has
	// values, which queryRows bounds).
	if n := int64(q.To.Sub(q.From)/BucketSize(q.Bucket)) * int64(q.Top+1); q.By != DimNone && q.Top > 0 && n > maxRows {
		return q, fmt.Errorf("%w: up to %d points (%s buckets × %d series); use a coarser bucket, a shorter range or a smaller top",
			ErrBadQuery, n, q.Bucket, q.Top+1)
	}
	return q, nil
}

// LoadZone loads an IANA time zone by name ("UTC", "Europe/Berlin"). It
// refuses "Local", whose meaning depends on the machine, and anything Go's
// zone database does not know; the error wraps ErrBadQuery.
func LoadZone(name string) (*time.Location, error) {
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" || name == "" {
		return nil, fmt.Errorf("%w: time zone %q: want an IANA name such as UTC or Europe/Berlin", ErrBadQuery, name)
	}
	return loc, nil
}

// TrendPoint is one bucket of one series. Denied is RateLimited (a limit
// said no: 429) plus FailClosed (the store failed and the policy denied:
// 503).
type TrendPoint struct {
	// Bucket is the bucket's start, in the query's time zone.
	Bucket time.Time `json:"bucket"`
	// Series is the value of the By dimension ("" without one); a key's
	// name when it has one.
	Series      string  `json:"series"`
	Requests    int64   `json:"requests"`
	Denied      int64   `json:"denied"`
	Ratio       float64 `json:"ratio"`
	RateLimited int64   `json:"rate_limited"`
	FailClosed  int64   `json:"fail_closed"`
	Shadow      int64   `json:"shadow"`
	FailOpen    int64   `json:"fail_open"`
	// Cost is the requests' cost, all decisions; CostAllowed the allowed
	// ones'.
	Cost        int64 `json:"cost"`
	CostAllowed int64 `json:"cost_allowed"`
}

// TrendHeader is the header of a trend's table (CSV, the CLI), its series
// column named after by.
func TrendHeader(by string) []string {
	if by == "" {
		by = "series"
	}
	return []string{"bucket", by, "requests", "denied", "ratio", "rate_limited", "fail_closed", "shadow", "fail_open", "cost", "cost_allowed"}
}

// Record is p as a row under TrendHeader (WriteCSV makes it safe for a
// spreadsheet).
func (p TrendPoint) Record() []string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []string{p.Bucket.Format(time.RFC3339), p.Series, i(p.Requests), i(p.Denied), strconv.FormatFloat(p.Ratio, 'f', 4, 64),
		i(p.RateLimited), i(p.FailClosed), i(p.Shadow), i(p.FailOpen), i(p.Cost), i(p.CostAllowed)}
}

// OtherSeries names the series that sums all but the top ones.
const OtherSeries = "(other)"

// Trends returns decisions and rejections per bucket and series.
func (r *Reader) Trends(ctx context.Context, q TrendQuery) ([]TrendPoint, error) {
	q, err := q.normalize()
	if err != nil {
		return nil, err
	}
	loc, _ := LoadZone(q.TZ) // normalize loaded it
	args := append(q.Range.args(), clickhouse.Named("bucket", q.Bucket), clickhouse.Named("by", q.By),
		clickhouse.Named("tz", q.TZ), clickhouse.Named("top", q.Top), clickhouse.Named("top_limit", max(1, q.Top)))
	return queryRows(ctx, r.ch, "trends", qTrends, args, func(rows driver.Rows, p *TrendPoint) error {
		var bucket uint32
		err := rows.Scan(&bucket, &p.Series, &p.Requests, &p.Denied, &p.RateLimited, &p.FailClosed, &p.Shadow, &p.FailOpen,
			&p.Cost, &p.CostAllowed)
		p.Bucket = time.Unix(int64(bucket), 0).In(loc)
		p.Ratio = ratio(p.Denied, p.Requests)
		return err
	})
}

// ratio is part/whole, 0 when whole is not positive.
func ratio(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// KeyRejections is one key's rejections in a range.
type KeyRejections struct {
	KeyIdentity
	Requests int64   `json:"requests"`
	Denied   int64   `json:"denied"`
	Ratio    float64 `json:"ratio"`
	// RateLimited and FailClosed split Denied into 429s and 503s.
	RateLimited int64 `json:"rate_limited"`
	FailClosed  int64 `json:"fail_closed"`
	// Cost and CostAllowed sum the requests' cost, all and allowed.
	Cost        int64    `json:"cost"`
	CostAllowed int64    `json:"cost_allowed"`
	Rules       []string `json:"rules"`
	Plans       []string `json:"plans"`
	Routes      []string `json:"routes"`
	Gateways    int64    `json:"gateways"`
}

// TopKeys returns the limit keys with the most rejections in rg.
func (r *Reader) TopKeys(ctx context.Context, rg Range, limit int) ([]KeyRejections, error) {
	if err := rg.validate(); err != nil {
		return nil, err
	}
	if limit < 1 || limit > 10000 {
		return nil, fmt.Errorf("%w: limit %d outside [1, 10000]", ErrBadQuery, limit)
	}
	return queryRows(ctx, r.ch, "top keys", qTopKeys, append(rg.args(), clickhouse.Named("limit", limit)), func(rows driver.Rows, k *KeyRejections) error {
		err := rows.Scan(&k.KeyID, &k.KeyKind, &k.KeyName, &k.Requests, &k.Denied, &k.FailClosed, &k.Cost, &k.CostAllowed,
			&k.Rules, &k.Plans, &k.Routes, &k.Gateways)
		k.Ratio = ratio(k.Denied, k.Requests)
		k.RateLimited = k.Denied - k.FailClosed
		slices.Sort(k.Rules)
		slices.Sort(k.Plans)
		slices.Sort(k.Routes)
		return err
	})
}

// KeyPoint is one key's decisions in one bucket at one gateway.
type KeyPoint struct {
	Bucket   time.Time `json:"bucket"`
	Gateway  string    `json:"gateway"`
	Requests int64     `json:"requests"`
	Denied   int64     `json:"denied"`
}

// KeyHistory returns rg.KeyID's decisions per bucket and gateway.
func (r *Reader) KeyHistory(ctx context.Context, rg Range, bucket string) ([]KeyPoint, error) {
	if err := checkBuckets(rg, bucket); err != nil {
		return nil, err
	}
	if rg.KeyID == "" {
		return nil, fmt.Errorf("%w: key history needs a key", ErrBadQuery)
	}
	return queryRows(ctx, r.ch, "key history", qKeyHistory, append(rg.args(), clickhouse.Named("bucket", bucket)), func(rows driver.Rows, p *KeyPoint) error {
		return scanAt(rows, &p.Bucket, &p.Gateway, &p.Requests, &p.Denied)
	})
}

// IPPoint is one address's evidence in one bucket.
type IPPoint struct {
	Bucket             time.Time `json:"bucket"`
	Requests           int64     `json:"requests"`
	Denied             int64     `json:"denied"`
	DistinctKeys       int64     `json:"distinct_keys"`
	DistinctUserAgents int64     `json:"distinct_user_agents"`
}

// IPHistory returns ip's evidence per bucket in rg (filters unused). ip is
// an address, or an IPv6 /64 as the NAT query gives it; either way it is
// read as the client the gateway keys (sql/part/client_net.sql): an IPv6
// address as its /64, an IPv4-mapped one as its IPv4 address.
func (r *Reader) IPHistory(ctx context.Context, rg Range, ip, bucket string) ([]IPPoint, error) {
	if err := checkBuckets(rg, bucket); err != nil {
		return nil, err
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return nil, fmt.Errorf("%w: %q is not an IP address", ErrBadQuery, ip)
	}
	if a = a.Unmap().WithZone(""); a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	ip = a.String()
	args := append(rg.args(), clickhouse.Named("bucket", bucket), clickhouse.Named("ip", ip))
	return queryRows(ctx, r.ch, "ip history", qIPHistory, args, func(rows driver.Rows, p *IPPoint) error {
		return scanAt(rows, &p.Bucket, &p.Requests, &p.Denied, &p.DistinctKeys, &p.DistinctUserAgents)
	})
}
