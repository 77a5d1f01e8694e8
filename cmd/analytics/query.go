package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/boot"
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
		from    = fs.String("from", "", "start of the range: now, -1h, -7d, RFC 3339, 2006-01-02[ 15:04] (UTC) or Unix seconds")
		to      = fs.String("to", "now", "end of the range (exclusive), same forms as -from")
		format  = fs.String("format", "table", "output: table, csv or json")
		by      = fs.String("by", "rule", "trends: split by rule, route, plan, gateway, key, or none")
		bucket  = fs.String("bucket", "auto", "trends, store-health, histories: minute, hour, day or auto")
		top     = fs.Int("top", 10, "trends: keep the top N series by rejections, sum the rest as (other); 0 keeps all; whatif: keys per list")
		limit   = fs.Int("limit", 20, "top-keys: how many keys")
		rule    = fs.String("rule", "", "only decisions whose binding rule is this")
		route   = fs.String("route", "", "only this route")
		plan    = fs.String("plan", "", "only this plan")
		gateway = fs.String("gateway", "", "only this gateway")
		key     = fs.String("key", "", "only this key id (hot-keys: that key's history)")
		ip      = fs.String("ip", "", "nat-ips: that address's (or IPv6 /64's) history")
		rules   = fs.String("rules", "", "whatif: the proposal, a YAML file with plans: (and routes:) in the gateway's syntax; a gateway config file does")
		change  = fs.String("change", "", "whatif: one changed rule of a plan in -rules, as YAML: '{plan: pro, name: per_minute, limit: 50, period: 1m}'")
	)
	if done, err := fs.Parse(args); done {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
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
	if defFrom == 0 || (*key != "" || *ip != "") && cmd != "whatif" {
		defFrom = time.Hour
	}
	rg := analytics.Range{Rule: *rule, Route: *route, Plan: *plan, Gateway: *gateway, KeyID: *key}
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
		if wq, err = whatIfQuery(rg, *rules, *change, *top); err != nil {
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

	var v any
	var t table
	switch cmd {
	case "trends":
		pts, err := r.Trends(ctx, analytics.TrendQuery{Range: rg, Bucket: b, By: dim, Top: *top})
		if err != nil {
			return err
		}
		v, t = pts, trendsTable(pts, dim)
	case "top-keys":
		keys, err := r.TopKeys(ctx, rg, *limit)
		if err != nil {
			return err
		}
		v, t = keys, topKeysTable(keys)
	case "hot-keys":
		if *key != "" {
			h, err := r.KeyHistory(ctx, rg, b)
			if err != nil {
				return err
			}
			v, t = h, keyHistoryTable(h)
			break
		}
		hot, err := r.HotKeys(ctx, cfg.Hot, rg.From, rg.To, 0, nil)
		if err != nil {
			return err
		}
		v, t = hot, hotKeysTable(hot)
	case "nat-ips":
		if *ip != "" {
			h, err := r.IPHistory(ctx, rg, *ip, b)
			if err != nil {
				return err
			}
			v, t = h, ipHistoryTable(h)
			break
		}
		nats, err := r.NATIPs(ctx, cfg.NAT, rg.From, rg.To, nil)
		if err != nil {
			return err
		}
		v, t = nats, natTable(nats)
	case "fail-minutes":
		ms, err := r.FailMinutes(ctx, rg)
		if err != nil {
			return err
		}
		v, t = ms, failTable(ms)
	case "whatif":
		rep, err := r.WhatIf(ctx, wq)
		if err != nil {
			return err
		}
		if *format != "json" {
			return renderWhatIf(stdout, *format, rep)
		}
		v = rep
	case "store-health":
		gh, err := r.StoreHealth(ctx, rg, b)
		if err != nil {
			return err
		}
		v, t = gh, healthTable(gh)
	}
	return render(stdout, *format, t, v)
}

func render(w io.Writer, format string, t table, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(nonNilJSON(v))
	case "csv":
		cw := csv.NewWriter(w)
		cw.Write(t.header)
		cw.WriteAll(t.rows)
		return cw.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if len(t.rows) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	return tw.Flush()
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

func trendsTable(pts []analytics.TrendPoint, by string) table {
	series := by
	if series == "" {
		series = "series"
	}
	t := table{header: []string{"bucket", series, "requests", "denied", "ratio", "shadow", "fail_open", "fail_closed"}}
	for _, p := range pts {
		t.rows = append(t.rows, []string{ts(p.Bucket), p.Series, n(p.Requests), n(p.Denied), f(p.Ratio, 4), n(p.Shadow), n(p.FailOpen), n(p.FailClosed)})
	}
	return t
}

func topKeysTable(keys []analytics.KeyRejections) table {
	t := table{header: []string{"key_id", "key_kind", "requests", "denied", "ratio", "rules", "plans", "routes", "gateways"}}
	for _, k := range keys {
		t.rows = append(t.rows, []string{k.KeyID, k.KeyKind, n(k.Requests), n(k.Denied), f(k.Ratio, 4),
			strings.Join(k.Rules, ";"), strings.Join(k.Plans, ";"), strings.Join(k.Routes, ";"), n(k.Gateways)})
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

func hotKeysTable(hot []analytics.HotKey) table {
	t := table{header: []string{"key_id", "key_kind", "requests", "rate", "share", "reason", "gateway_shares"}}
	for _, h := range hot {
		t.rows = append(t.rows, []string{h.KeyID, h.KeyKind, n(h.Requests), f(h.Rate, 2), f(h.Share, 4), h.Reason, shares(h.Shares)})
	}
	return t
}

func keyHistoryTable(h []analytics.KeyPoint) table {
	t := table{header: []string{"bucket", "gateway", "requests", "denied"}}
	for _, p := range h {
		t.rows = append(t.rows, []string{ts(p.Bucket), p.Gateway, n(p.Requests), n(p.Denied)})
	}
	return t
}

func natTable(nats []analytics.NATIP) table {
	t := table{header: []string{"ip", "key", "requests", "denied", "distinct_keys", "distinct_user_agents", "clients", "factor", "reason"}}
	for _, x := range nats {
		t.rows = append(t.rows, []string{x.IP, x.Key, n(x.Requests), n(x.Denied), n(x.DistinctKeys), n(x.DistinctUserAgents), n(x.Clients), f(x.Factor, 2), x.Reason})
	}
	return t
}

func ipHistoryTable(h []analytics.IPPoint) table {
	t := table{header: []string{"bucket", "requests", "denied", "distinct_keys", "distinct_user_agents"}}
	for _, p := range h {
		t.rows = append(t.rows, []string{ts(p.Bucket), n(p.Requests), n(p.Denied), n(p.DistinctKeys), n(p.DistinctUserAgents)})
	}
	return t
}

func failTable(ms []analytics.FailMinute) table {
	t := table{header: []string{"minute", "gateway", "requests", "fail_open", "fail_closed", "store_unavailable"}}
	for _, m := range ms {
		t.rows = append(t.rows, []string{ts(m.Minute), m.Gateway, n(m.Requests), n(m.FailOpen), n(m.FailClosed), n(m.StoreUnavailable)})
	}
	return t
}

func healthTable(gh []analytics.GatewayHealth) table {
	t := table{header: []string{"bucket", "gateway", "requests", "denied", "store_ok", "store_unavailable", "store_timeout",
		"store_local_cache", "fail_open", "fail_closed", "local_fallback", "p50_us", "p90_us", "p99_us", "max_us"}}
	for _, g := range gh {
		t.rows = append(t.rows, []string{ts(g.Minute), g.Gateway, n(g.Requests), n(g.Denied), n(g.StoreOK), n(g.StoreUnavailable),
			n(g.StoreTimeout), n(g.StoreLocalCache), n(g.FailOpen), n(g.FailClosed), n(g.LocalFallback),
			f(g.LatencyP50, 0), f(g.LatencyP90, 0), f(g.LatencyP99, 0), f(g.LatencyMax, 0)})
	}
	return t
}
