package analytics

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

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
