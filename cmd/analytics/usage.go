package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

// keyList is a repeatable -key.
type keyList []string

func (k *keyList) String() string { return strings.Join(*k, ",") }
func (k *keyList) Set(v string) error {
	*k = append(*k, v)
	return nil
}

// usageCmd prints a usage statement: analytics usage -month 2026-11
// [-tz Zone] [-key ID]... [-by key,plan,route,day] [-format table|csv|json].
func usageCmd(ctx context.Context, fs *boot.Flags, args []string, getenv func(string) string, stdout io.Writer) error {
	var keys keyList
	var (
		month  = fs.String("month", "", "the calendar month, YYYY-MM, in -tz (or -from and -to)")
		from   = fs.String("from", "", "start of the period: a date (midnight in -tz), RFC 3339, -30d, now")
		to     = fs.String("to", "", "end of the period, exclusive, same forms (default now)")
		tz     = fs.String("tz", "UTC", "the IANA time zone of -month, of dates, and of the days -by day cuts")
		by     = fs.String("by", "key,plan,route", "split rows by any of key, plan, route, day (comma separated)")
		format = fs.String("format", "table", "output: table, csv or json")
		period = fs.String("period", "", "current: the -key's current calendar window, reconciled with the limiter's count (needs -rules and Redis)")
		rules  = fs.String("rules", "", "with -period current: the gateway's config file (its plans: and api_keys:)")
	)
	fs.Var(&keys, "key", "a key id or an API key's name (repeat for several; none: every key)")
	if done, err := fs.Parse(args); done {
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			err = fmt.Errorf("%w: %w", errUsage, err)
		}
		return err
	}
	if rest := fs.Args(); len(rest) > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, rest)
	}
	if *format != "table" && *format != "csv" && *format != "json" {
		return fmt.Errorf("%w: -format %q: want table, csv or json", errUsage, *format)
	}
	tzSet := false
	fs.Visit(func(f *flag.Flag) { tzSet = tzSet || f.Name == "tz" })
	var cur *currentWindow
	switch *period {
	case "":
	case "current":
		if *month != "" || *from != "" || *to != "" {
			return fmt.Errorf("%w: -period current is the key's window: give no -month, -from or -to", errUsage)
		}
		if len(keys) != 1 {
			return fmt.Errorf("%w: -period current reconciles one key: give exactly one -key (an API key's id)", errUsage)
		}
		c, err := readCurrent(*rules, keys[0])
		if err != nil {
			return err
		}
		if !tzSet {
			*tz = c.cal.Location().String() // the window's own zone
		}
		cur = c
	default:
		return fmt.Errorf("%w: -period %q: the only period is current (or give -month, or -from and -to)", errUsage, *period)
	}
	loc, err := analytics.LoadZone(*tz)
	if err != nil {
		return usageErr(err)
	}
	q := analytics.UsageQuery{TZ: *tz, Keys: keys, By: splitList(*by)}
	if cur == nil {
		if q.From, q.To, err = analytics.UsagePeriod(*month, *from, *to, loc, time.Now()); err != nil {
			return usageErr(err)
		}
	}
	fc, err := loadConfig(*fs.Config, getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if cur != nil {
		if err := cur.count(ctx, fc); err != nil {
			return err
		}
		q.From, q.To = cur.start, cur.at.Truncate(time.Second).Add(time.Second)
	}
	ch, err := boot.OpenClickHouse(fc.ClickHouse, 30*time.Second)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := boot.PingClickHouse(ctx, ch, fc.ClickHouse); err != nil {
		return err
	}
	st, err := analytics.NewReader(ch).Usage(ctx, q)
	if err != nil {
		return usageErr(err)
	}
	if cur != nil {
		st.Reconcile(cur.rule.Name, cur.state.Count, cur.state.Granted, cur.start, cur.end, cur.at)
	}
	return renderUsage(stdout, *format, st)
}

// currentWindow is an API key's calendar rule and, once counted, its
// current window and count in the limiter.
type currentWindow struct {
	id    string
	rules []limiter.Rule // the key's plan's
	rule  limiter.Rule   // its calendar rule
	cal   *limiter.Calendar

	at, start, end time.Time
	state          limiter.RuleState
}

// readCurrent finds key's calendar rule in the gateway config file path:
// key is an api_keys id, its plan's first rule with a calendar the one
// reconciled.
func readCurrent(path, key string) (*currentWindow, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: -period current needs -rules: the gateway's config file, for the key's plan and its calendar rule", errUsage)
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-rules: %w", err)
	}
	var doc struct {
		Plans   map[string]plans.Plan `yaml:"plans"`
		APIKeys []plans.APIKey        `yaml:"api_keys"`
	}
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, fmt.Errorf("%w: -rules %s: %w", errUsage, path, err)
	}
	i := slices.IndexFunc(doc.APIKeys, func(k plans.APIKey) bool { return k.ID == key })
	if i < 0 {
		return nil, fmt.Errorf("%w: -period current: no api_keys entry with id %q in %s (the current window is an API key's, by its id)", errUsage, key, path)
	}
	plan, ok := doc.Plans[doc.APIKeys[i].Plan]
	if !ok {
		return nil, fmt.Errorf("%w: -period current: key %q's plan %q is not in %s", errUsage, key, doc.APIKeys[i].Plan, path)
	}
	cur := &currentWindow{id: key}
	for _, r := range plan.Rules {
		cur.rules = append(cur.rules, r.Limiter())
		if r.Calendar != nil && cur.cal == nil {
			cur.rule, cur.cal = r.Rule, r.Calendar
		}
	}
	if cur.cal == nil {
		return nil, fmt.Errorf("%w: -period current: key %q's plan %q has no calendar rule, so no current window", errUsage, key, doc.APIKeys[i].Plan)
	}
	return cur, nil
}

// count reads the key's state in the limiter's store (fc's Redis), as the
// gateway's key admin API does: the calendar rule's count in the window
// holding the store's time.
func (c *currentWindow) count(ctx context.Context, fc fileConfig) error {
	if !fc.Redis.Set() {
		return fmt.Errorf("%w: -period current reads the limiter's count: configure redis (EDGELIMIT_REDIS_ADDR), with the gateways' prefix", errUsage)
	}
	rdb, err := boot.NewRedis(fc.Redis.Redis, boot.RedisTuning{Timeout: 5 * time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer rdb.Close()
	lim, err := limiter.New(rdb, limiter.Config{Prefix: fc.Redis.Prefix, DenyCache: -1})
	if err != nil {
		return err
	}
	ks, err := lim.Inspect(ctx, limiter.APIKeyKey(c.id), c.rules)
	if err != nil {
		return fmt.Errorf("read key %q in the limiter: %w", c.id, err)
	}
	i := slices.IndexFunc(c.rules, func(r limiter.Rule) bool { return r.Name == c.rule.Name })
	c.state, c.at = ks.Rules[i], ks.Time
	c.start, c.end = c.cal.Bounds(ks.Time)
	return nil
}

// usageErr makes a bad query a bad command line (exit 2).
func usageErr(err error) error {
	if errors.Is(err, analytics.ErrBadQuery) && !errors.Is(err, errUsage) {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return err
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// droppedBy is " (reason n, ...)" of by, reasons sorted; "" for none.
func droppedBy(by map[string]int64) string {
	if len(by) == 0 {
		return ""
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, by[r]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// renderUsage prints st: JSON whole, CSV its rows, a table with the
// period, whether it is complete, the rows and the total.
func renderUsage(w io.Writer, format string, st analytics.UsageStatement) error {
	t := newTable(analytics.UsageHeader(st.By), st.Rows, func(u analytics.UsageRow) []string { return u.Record(st.By) })
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	case "csv":
		return analytics.WriteCSV(w, t.header, t.rows)
	}
	loc, _ := time.LoadLocation(st.TZ)
	fmt.Fprintf(w, "usage from %s to %s (%s), by %s\n", st.From.In(loc).Format(time.RFC3339), st.To.In(loc).Format(time.RFC3339),
		st.TZ, strings.Join(st.By, ", "))
	if st.Complete {
		fmt.Fprintf(w, "complete: data through %s\n", ts(st.DataThrough))
	} else {
		fmt.Fprintf(w, "INCOMPLETE: %s\n", st.Incomplete)
	}
	for _, g := range st.Gateways {
		settled := "settled"
		if !g.Settled {
			settled = "not settled: last report " + ts(g.LastReport)
		}
		fmt.Fprintf(w, "gateway %s (run from %s): %d decision events, %d published, %d dropped%s; %s\n",
			terminalSafe(g.GatewayID), ts(g.RunStart), g.Decisions, g.Published, g.Dropped, droppedBy(g.DroppedBy), settled)
	}
	if len(st.Sequences) > 0 {
		var decided, stored, unnumbered int64
		for _, q := range st.Sequences {
			decided, stored, unnumbered = decided+q.Decided, stored+q.Stored, unnumbered+q.Unnumbered
		}
		fmt.Fprintf(w, "sequence: the store numbered %d decisions in the period; %d are stored, %d missing; %d stored without a number\n",
			decided, stored, st.Missing, unnumbered)
		for _, q := range st.Sequences {
			if q.Missing > 0 {
				fmt.Fprintf(w, "  %s (%s): %d numbered, %d stored, %d missing; %d without a number\n",
					terminalSafe(q.KeyName), q.KeyID, q.Decided, q.Stored, q.Missing, q.Unnumbered)
			}
		}
	}
	for _, r := range st.Reconciled {
		fmt.Fprintf(w, "reconciled: %s's rule %s, window %s to %s: the limiter counted %d (granted %d) at %s; the statement's allowed cost is %d; difference %d\n",
			terminalSafe(r.KeyName), terminalSafe(r.Rule), r.WindowStart.In(loc).Format(time.RFC3339), r.WindowEnd.In(loc).Format(time.RFC3339),
			r.LimiterCount, r.Granted, ts(r.At), r.StatementCost, r.Difference)
	}
	fmt.Fprintln(w)
	total := analytics.UsageRow{UsageCounts: st.Total}.Record(nil)
	pad := make([]string, len(t.header)-len(total))
	if len(pad) > 0 {
		pad[0] = "total"
	}
	t.rows = append(t.rows, append(pad, total...))
	return render(w, "table", t, nil)
}
