package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

// parseProposal reads a what-if proposal in the gateway's own syntax, with
// its own types: the plans: and routes: of a gateway configuration file
// (a whole file does; its other sections are not read), each decoded
// strictly, so a misspelt rule field is an error rather than a default.
// change, when set, is one rule in the same syntax plus the plan it
// changes: {plan: pro, name: per_minute, limit: 50, period: 1m}.
func parseProposal(rules, change string) (analytics.Proposal, error) {
	// Strict below plans: and routes:, with the file's own line numbers;
	// the inline map takes the rest of a gateway file unread.
	var doc struct {
		Plans  map[string]gateway.Plan `yaml:"plans"`
		Routes []gateway.Route         `yaml:"routes"`
		Rest   map[string]yaml.Node    `yaml:",inline"`
	}
	if err := strict([]byte(rules), &doc); err != nil {
		return analytics.Proposal{}, fmt.Errorf("rules: %w", err)
	}
	if doc.Plans == nil {
		return analytics.Proposal{}, errors.New("rules: no plans: section (the gateway's syntax: plans: {NAME: {rules: [...]}})")
	}
	plans, routes := doc.Plans, doc.Routes
	p := analytics.Proposal{Plans: map[string][]limiter.Rule{}, Routes: map[string]analytics.ProposedRoute{}}
	for name, plan := range plans {
		rs := make([]limiter.Rule, 0, len(plan.Rules))
		for _, r := range plan.Rules {
			rs = append(rs, r.Rule)
		}
		p.Plans[name] = rs
	}
	// The gateway's defaults: a route is named by its prefix and costs 1.
	for _, rt := range (gateway.Config{Routes: routes}).WithDefaults().Routes {
		if rt.Exempt {
			continue // never limited, never in the decisions
		}
		p.Routes[rt.Name] = analytics.ProposedRoute{Plan: rt.Plan, Cost: rt.Cost}
	}
	if strings.TrimSpace(change) != "" {
		var c struct {
			Plan         string `yaml:"plan"`
			gateway.Rule `yaml:",inline"`
		}
		if err := strict([]byte(change), &c); err != nil {
			return analytics.Proposal{}, fmt.Errorf("change: %w", err)
		}
		var err error
		if p, err = p.Apply(analytics.RuleChange{Plan: c.Plan, Rule: c.Rule.Rule}); err != nil {
			return analytics.Proposal{}, err
		}
	}
	return p, p.Validate()
}

func strict(b []byte, dst any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// whatIf runs "analytics whatif": it replays the stored decisions of a
// range through a proposal and prints how they would have been decided.
func whatIf(ctx context.Context, fs *boot.Flags, args []string, getenv func(string) string, stdout io.Writer) error {
	var (
		rulesFile = fs.String("rules", "", "the proposal: a YAML file with plans: (and routes:) in the gateway's syntax; a gateway config file does")
		change    = fs.String("change", "", "one changed rule of a plan in -rules, as YAML: '{plan: pro, name: per_minute, limit: 50, period: 1m}'")
		from      = fs.String("from", "-24h", "start of the range: now, -1h, -7d, RFC 3339, 2006-01-02[ 15:04] (UTC) or Unix seconds")
		to        = fs.String("to", "now", "end of the range (exclusive), same forms as -from")
		plan      = fs.String("plan", "", "replay only this plan's decisions")
		route     = fs.String("route", "", "count only this route's decisions (every route of a key is replayed)")
		key       = fs.String("key", "", "replay only this key id")
		top       = fs.Int("top", 20, "how many keys each key list shows")
		format    = fs.String("format", "table", "output: table, csv or json")
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
	if *rulesFile == "" {
		return fmt.Errorf("%w: -rules FILE is needed: the plans to replay, in the gateway's YAML syntax", errUsage)
	}
	text, err := os.ReadFile(*rulesFile)
	if err != nil {
		return fmt.Errorf("-rules: %w", err)
	}
	p, err := parseProposal(string(text), *change)
	if err != nil {
		return fmt.Errorf("%s: %w", *rulesFile, err)
	}
	now := time.Now().UTC()
	q := analytics.WhatIfQuery{Range: analytics.Range{Plan: *plan, Route: *route, KeyID: *key}, Proposal: p, Top: *top}
	if q.From, err = analytics.ParseTime(*from, now, now.Add(-24*time.Hour)); err != nil {
		return err
	}
	if q.To, err = analytics.ParseTime(*to, now, now); err != nil {
		return err
	}
	if err := q.Validate(); err != nil {
		return err
	}
	fc, err := loadConfig(*fs.Config, getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// A replay streams for minutes at most; the read bound is per read,
	// and the server sends progress while it sorts.
	ch, err := boot.OpenClickHouse(fc.ClickHouse, 30*time.Second)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := boot.PingClickHouse(ctx, ch, fc.ClickHouse); err != nil {
		return err
	}
	rep, err := analytics.NewReader(ch).WhatIf(ctx, q)
	if err != nil {
		return err
	}
	if *format == "json" {
		return render(stdout, *format, table{}, rep)
	}
	return renderWhatIf(stdout, *format, rep)
}

// renderWhatIf prints the report as tables: the totals, per rule, per
// hour, and the key lists, each headed by a line naming it (in csv, a
// row of its own).
func renderWhatIf(w io.Writer, format string, rep analytics.WhatIfReport) error {
	counts := func(c analytics.WhatIfCounts) []string {
		return []string{n(c.Requests), n(c.WasDenied), n(c.WouldDeny), n(c.NewlyDenied), n(c.NewlyAllowed)}
	}
	head := []string{"requests", "was_denied", "would_deny", "newly_denied", "newly_allowed"}
	keys := func(ks []analytics.WhatIfKey) table {
		t := table{header: append([]string{"key_id", "key_kind"}, head...)}
		for _, k := range ks {
			t.rows = append(t.rows, append([]string{k.KeyID, k.KeyKind}, counts(k.WhatIfCounts)...))
		}
		return t
	}
	type section struct {
		title string
		t     table
	}
	sections := []section{
		{fmt.Sprintf("what-if %s to %s: %d decisions read, %d counted, %d kept as decided, %d keys (%d newly blocked, %d newly freed), %v",
			ts(rep.From), ts(rep.To), rep.Read, rep.Counted, rep.Kept, rep.Keys, rep.KeysNewlyBlocked, rep.KeysNewlyFreed, rep.Duration.Round(time.Millisecond)),
			table{header: head, rows: [][]string{counts(rep.Totals)}}},
	}
	rules := table{header: []string{"rule", "was_binding", "would_deny", "shadow_would_deny"}}
	for _, r := range rep.Rules {
		rules.rows = append(rules.rows, []string{r.Rule, n(r.WasBinding), n(r.WouldDeny), n(r.ShadowWouldDeny)})
	}
	hours := table{header: append([]string{"hour"}, head...)}
	for _, h := range rep.Hours {
		hours.rows = append(hours.rows, append([]string{ts(h.Hour)}, counts(h.WhatIfCounts)...))
	}
	sections = append(sections,
		section{"per rule", rules},
		section{"per hour", hours},
		section{"top keys by denials under the proposal", keys(rep.TopKeys)},
		section{"keys newly blocked", keys(rep.NewlyBlocked)},
		section{"keys newly freed", keys(rep.NewlyFreed)})
	for i, s := range sections {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "# %s\n", s.title)
		if err := render(w, format, s.t, nil); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	for _, c := range rep.Caveats {
		fmt.Fprintf(w, "# caveat: %s\n", c)
	}
	return nil
}
