package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

// table is a command's result for the table and csv formats; json prints
// the typed result instead.
type table struct {
	header []string
	rows   [][]string
}

// query runs one analyst command: it reads its flags, queries ClickHouse
// and prints the result.
func query(ctx context.Context, cmd string, fs *boot.Flags, args []string, getenv func(string) string, stdout io.Writer) error {
	var (
		from   = fs.String("from", "", "start of the range: now, -1h, -7d, RFC 3339, 2006-01-02[ 15:04] (UTC) or Unix seconds")
		to     = fs.String("to", "now", "end of the range (exclusive), same forms as -from")
		format = fs.String("format", "table", "output: table, csv or json")
		by     = fs.String("by", "rule", "trends: split by rule, route, plan, gateway, key, kind, method, or none")
		bucket = fs.String("bucket", "auto", "trends, key, store-health, histories: minute, hour, day or auto; trends and key also 5m, 15m (and 1m, 1h, 1d)")
		tz     = fs.String("tz", "UTC", "trends, key: the IANA time zone buckets are aligned in, e.g. Europe/Berlin")
		top    = fs.Int("top", 10, "trends: keep the top N series by rejections, sum the rest as (other); 0 keeps all; whatif: keys per list")
		limit  = fs.Int("limit", 20, "top-keys: how many keys")
		ip     = fs.String("ip", "", "nat-ips: that address's (or IPv6 /64's) history")
		rules  = fs.String("rules", "", "whatif: the proposal, a YAML file with plans: (and routes:) in the gateway's syntax; a gateway config file does")
		change = fs.String("change", "", "whatif: one changed rule of a plan in -rules, as YAML: '{plan: pro, name: per_minute, limit: 50, period: 1m}'")
		ran    = fs.String("ran", "", "whatif: the rules that ran (a gateway config file does), replayed first to check the replay against what happened; default -rules when -change is given")
	)
	// The filter flags are the Range's filters: they fill it directly, and
	// -from and -to its bounds below.
	var rg analytics.Range
	fs.StringVar(&rg.Rule, "rule", "", "only decisions whose binding rule is this")
	fs.StringVar(&rg.Route, "route", "", "only this route")
	fs.StringVar(&rg.Plan, "plan", "", "only this plan")
	fs.StringVar(&rg.Gateway, "gateway", "", "only this gateway")
	fs.StringVar(&rg.KeyID, "key", "", "only this key id, or (trends, top-keys) key name (hot-keys: that key's history)")
	fs.StringVar(&rg.KeyKind, "kind", "", "trends, top-keys: only this key kind: api_key, user or ip")
	fs.StringVar(&rg.Method, "method", "", "trends, top-keys: only this HTTP method")

	// analytics key ID [flags] or analytics key [flags] ID.
	var keyArg string
	if cmd == "key" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		keyArg, args = args[0], args[1:]
	}
	if done, err := fs.Parse(args); done {
		return err
	}
	rest := fs.Args()
	if cmd == "key" && keyArg == "" && len(rest) > 0 {
		keyArg, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, rest)
	}
	if cmd == "key" && keyArg == "" {
		return fmt.Errorf("%w: analytics key needs a key id or name: analytics key ID [flags]", errUsage)
	}
	if *format != "table" && *format != "csv" && *format != "json" {
		return fmt.Errorf("%w: -format %q: want table, csv or json", errUsage, *format)
	}
	fc, err := loadConfig(*fs.Config, getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cfg := fc.analyticsConfig().WithDefaults()
	now := time.Now().UTC()
	defFrom := map[string]time.Duration{
		"hot-keys": cfg.Hot.Window, "nat-ips": cfg.NAT.Window, "fail-minutes": 24 * time.Hour, "whatif": 24 * time.Hour,
	}[cmd]
	if defFrom == 0 || (rg.KeyID != "" || *ip != "") && cmd != "whatif" {
		defFrom = time.Hour
	}
	if rg.From, err = analytics.ParseTime(*from, now, now.Add(-defFrom)); err != nil {
		return err
	}
	if rg.To, err = analytics.ParseTime(*to, now, now); err != nil {
		return err
	}
	b := *bucket
	if b == "auto" || b == "" {
		b = analytics.AutoBucket(rg.From, rg.To)
	}
	dim := *by
	if dim == "none" {
		dim = analytics.DimNone
	}
	var wq analytics.WhatIfQuery
	if cmd == "whatif" {
		// A bad proposal is reported before ClickHouse is dialled.
		if wq, err = whatIfQuery(rg, *rules, *change, *ran, *top); err != nil {
			return err
		}
	}

	ch, err := boot.OpenClickHouse(fc.ClickHouse, 30*time.Second)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := boot.PingClickHouse(ctx, ch, fc.ClickHouse); err != nil {
		return err
	}
	r := analytics.NewReader(ch)

	// Each command leaves its typed result in v (json prints it as is);
	// tableOf gives the table and csv formats its rows.
	var v any
	switch cmd {
	case "trends":
		v, err = r.Trends(ctx, analytics.TrendQuery{Range: rg, Bucket: b, TZ: *tz, By: dim, Top: *top})
	case "key":
		var rep analytics.KeyReport
		if rep, err = r.KeyReport(ctx, rg, keyArg, b, *tz); err == nil {
			readKeyDirectives(ctx, fc, &rep, now)
		}
		v = rep
	case "top-keys":
		v, err = r.TopKeys(ctx, rg, *limit)
	case "hot-keys":
		if rg.KeyID != "" {
			v, err = r.KeyHistory(ctx, rg, b)
		} else {
			v, err = r.HotKeys(ctx, cfg.Hot, rg.From, rg.To, 0, nil)
		}
	case "nat-ips":
		if *ip != "" {
			v, err = r.IPHistory(ctx, rg, *ip, b)
		} else {
			v, err = r.NATIPs(ctx, cfg.NAT, rg.From, rg.To, nil)
		}
	case "fail-minutes":
		v, err = r.FailMinutes(ctx, rg)
	case "whatif":
		v, err = r.WhatIf(ctx, wq)
	case "store-health":
		v, err = r.StoreHealth(ctx, rg, b)
	}
	if err != nil {
		return err
	}
	if rep, ok := v.(analytics.WhatIfReport); ok && *format != "json" {
		return renderWhatIf(stdout, *format, rep)
	}
	return render(stdout, *format, tableOf(v, dim), v)
}

// tableOf is a command's result as a table: the columns of each result
// type, in one place.
func tableOf(v any, by string) table {
	switch v := v.(type) {
	case []analytics.TrendPoint:
		// The API's CSV: one definition of a trend's columns.
		return newTable(analytics.TrendHeader(by), v, analytics.TrendPoint.Record)
	case analytics.KeyReport:
		return keyTable(v)
	case []analytics.KeyRejections:
		return newTable([]string{"key_id", "key_name", "key_kind", "requests", "denied", "ratio", "rate_limited", "fail_closed",
			"cost", "cost_allowed", "rules", "plans", "routes", "gateways"}, v, func(k analytics.KeyRejections) []string {
			return []string{k.KeyID, k.KeyName, k.KeyKind, n(k.Requests), n(k.Denied), f(k.Ratio, 4),
				n(k.RateLimited), n(k.FailClosed), n(k.Cost), n(k.CostAllowed),
				strings.Join(k.Rules, ";"), strings.Join(k.Plans, ";"), strings.Join(k.Routes, ";"), n(k.Gateways)}
		})
	case []analytics.HotKey:
		return newTable([]string{"key_id", "key_name", "key_kind", "requests", "rate", "share", "reason", "gateway_shares"}, v, func(h analytics.HotKey) []string {
			return []string{h.KeyID, h.KeyName, h.KeyKind, n(h.Requests), f(h.Rate, 2), f(h.Share, 4), h.Reason, shares(h.Shares)}
		})
	case []analytics.KeyPoint:
		return newTable([]string{"bucket", "gateway", "requests", "denied"}, v, func(p analytics.KeyPoint) []string {
			return []string{ts(p.Bucket), p.Gateway, n(p.Requests), n(p.Denied)}
		})
	case []analytics.NATIP:
		return newTable([]string{"ip", "key", "requests", "denied", "distinct_keys", "distinct_user_agents", "clients", "factor", "reason"}, v, func(x analytics.NATIP) []string {
			return []string{x.IP, x.Key, n(x.Requests), n(x.Denied), n(x.DistinctKeys), n(x.DistinctUserAgents), n(x.Clients), f(x.Factor, 2), x.Reason}
		})
	case []analytics.IPPoint:
		return newTable([]string{"bucket", "requests", "denied", "distinct_keys", "distinct_user_agents"}, v, func(p analytics.IPPoint) []string {
			return []string{ts(p.Bucket), n(p.Requests), n(p.Denied), n(p.DistinctKeys), n(p.DistinctUserAgents)}
		})
	case []analytics.FailMinute:
		return newTable([]string{"minute", "gateway", "requests", "fail_open", "fail_closed", "store_unavailable"}, v, func(m analytics.FailMinute) []string {
			return []string{ts(m.Minute), m.Gateway, n(m.Requests), n(m.FailOpen), n(m.FailClosed), n(m.StoreUnavailable)}
		})
	case []analytics.GatewayHealth:
		return newTable([]string{"bucket", "gateway", "requests", "denied", "store_ok", "store_unavailable", "store_timeout",
			"store_local_cache", "fail_open", "fail_closed", "local_fallback", "p50_us", "p90_us", "p99_us", "max_us"}, v, func(g analytics.GatewayHealth) []string {
			return []string{ts(g.Minute), g.Gateway, n(g.Requests), n(g.Denied), n(g.StoreOK), n(g.StoreUnavailable),
				n(g.StoreTimeout), n(g.StoreLocalCache), n(g.FailOpen), n(g.FailClosed), n(g.LocalFallback),
				f(g.LatencyP50, 0), f(g.LatencyP90, 0), f(g.LatencyP99, 0), f(g.LatencyMax, 0)}
		})
	}
	return table{}
}

// newTable is header over one row per element of xs.
func newTable[T any](header []string, xs []T, row func(T) []string) table {
	t := table{header: header}
	for _, x := range xs {
		t.rows = append(t.rows, row(x))
	}
	return t
}

func render(w io.Writer, format string, t table, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(nonNilJSON(v))
	case "csv":
		return analytics.WriteCSV(w, t.header, t.rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = terminalSafe(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if len(t.rows) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	return tw.Flush()
}

// terminalSafe is s as a table cell on a terminal: key names, routes and
// gateway ids come from traffic and configuration, and a control character
// among them (an escape sequence that recolours, moves the cursor or
// retitles the window; a tab or newline that shifts the table) or an
// invisible formatting one (a bidi override) would act, not show. Such
// characters, bytes that are not UTF-8 and the backslash itself (so the
// escapes cannot be forged) are written as Go escapes; anything else is
// left as it is.
func terminalSafe(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == '\\' || r == utf8.RuneError || !strconv.IsPrint(r) }) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// nonNilJSON makes an empty result print as [] rather than null.
func nonNilJSON(v any) any {
	b, _ := json.Marshal(v)
	if string(b) == "null" {
		return []struct{}{}
	}
	return v
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }
func n(v int64) string      { return strconv.FormatInt(v, 10) }
func f(v float64, prec int) string {
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// readKeyDirectives adds the split and NAT directives in Redis to rep when Redis
// is configured; a Redis that does not answer leaves them unknown, said
// so, rather than failing the whole page.
func readKeyDirectives(ctx context.Context, fc fileConfig, rep *analytics.KeyReport, now time.Time) {
	if !fc.Redis.Set() {
		return
	}
	rdb, err := boot.NewRedis(fc.Redis.Redis, boot.RedisTuning{Timeout: 2 * time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		rep.Directives = "unavailable: " + err.Error()
		return
	}
	defer rdb.Close()
	d, _, err := limiter.NewDirectiveStore(rdb, fc.Redis.Prefix).Load(ctx)
	if err != nil {
		rep.Directives = "unavailable: " + err.Error()
		return
	}
	rep.AddDirectives(d, now)
}

// keyTable is a key's page as one table: a section column (key, total,
// rule, route, gateway, plan, method, split, nat, history) and the counts.
func keyTable(rep analytics.KeyReport) table {
	t := table{header: []string{"section", "name", "requests", "denied", "ratio", "rate_limited", "fail_closed", "cost", "cost_allowed"}}
	for _, k := range rep.Keys {
		t.rows = append(t.rows, []string{"key", k.KeyName + " " + k.KeyKind + ":" + k.KeyID, "", "", "", "", "", "", ""})
	}
	row := func(section string, c analytics.KeyCount) {
		t.rows = append(t.rows, []string{section, c.Name, n(c.Requests), n(c.Denied), f(c.Ratio, 4), n(c.RateLimited), n(c.FailClosed), n(c.Cost), n(c.CostAllowed)})
	}
	if len(rep.Keys) == 0 {
		return t
	}
	row("total", rep.Total)
	for _, s := range []struct {
		name string
		cs   []analytics.KeyCount
	}{{"rule", rep.Rules}, {"route", rep.Routes}, {"gateway", rep.Gateways}, {"plan", rep.Plans}, {"method", rep.Methods}} {
		for _, c := range s.cs {
			row(s.name, c)
		}
	}
	if rep.Directives != "redis" {
		t.rows = append(t.rows, []string{"split", "directives " + rep.Directives, "", "", "", "", "", "", ""})
	} else if len(rep.Splits) == 0 {
		t.rows = append(t.rows, []string{"split", "none", "", "", "", "", "", "", ""})
	}
	for _, s := range rep.Splits {
		t.rows = append(t.rows, []string{"split", shares(s.Shares) + " until " + ts(s.Expires), "", "", "", "", "", "", ""})
	}
	for _, d := range rep.NATs {
		t.rows = append(t.rows, []string{"nat", fmt.Sprintf("limit x%s for ~%d clients until %s", f(d.Factor, 2), d.Clients, ts(d.Expires)),
			"", "", "", "", "", "", ""})
	}
	for _, p := range rep.History {
		t.rows = append(t.rows, []string{"history", p.Bucket.Format(time.RFC3339), n(p.Requests), n(p.Denied), f(p.Ratio, 4),
			n(p.RateLimited), n(p.FailClosed), n(p.Cost), n(p.CostAllowed)})
	}
	return t
}

func shares(s map[string]float64) string {
	if len(s) == 0 {
		return "not split"
	}
	var out []string
	for _, gw := range slices.Sorted(maps.Keys(s)) {
		out = append(out, gw+"="+f(s[gw], 3))
	}
	return strings.Join(out, ";")
}
