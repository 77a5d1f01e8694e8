package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway/plans"
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
		Plans   map[string]plans.Plan `yaml:"plans"`
		Routes  []plans.Route         `yaml:"routes"`
		APIKeys []plans.APIKey        `yaml:"api_keys"`
		Rest    map[string]yaml.Node  `yaml:",inline"`
	}
	if err := strict([]byte(rules), &doc); err != nil {
		return analytics.Proposal{}, fmt.Errorf("rules: %w", err)
	}
	if doc.Plans == nil {
		return analytics.Proposal{}, errors.New("rules: no plans: section (the gateway's syntax: plans: {NAME: {rules: [...]}})")
	}
	byName, routes := doc.Plans, doc.Routes
	p := analytics.Proposal{Plans: map[string][]limiter.Rule{}, Routes: map[string]analytics.ProposedRoute{}}
	for name, plan := range byName {
		rs := make([]limiter.Rule, 0, len(plan.Rules))
		for _, r := range plan.Rules {
			if r.InFlight != 0 {
				continue // not replayed: see analytics' caveats
			}
			rs = append(rs, r.Rule)
		}
		p.Plans[name] = rs
	}
	// The gateway's defaults: a route is named by its prefix and costs 1.
	for _, rt := range routes {
		rt = rt.WithDefaults()
		if rt.Exempt {
			continue // never limited, never in the decisions
		}
		p.Routes[rt.Name] = analytics.ProposedRoute{Plan: rt.Plan, Cost: rt.Cost}
	}
	if strings.TrimSpace(change) != "" {
		var c struct {
			Plan       string `yaml:"plan"`
			plans.Rule `yaml:",inline"`
		}
		if err := strict([]byte(change), &c); err != nil {
			return analytics.Proposal{}, fmt.Errorf("change: %w", err)
		}
		var err error
		if p, err = p.Apply(analytics.RuleChange{Plan: c.Plan, Rule: c.Rule.Rule}); err != nil {
			return analytics.Proposal{}, err
		}
	}
	// A key's overrides apply to its plan as changed, as the gateway
	// would apply them to the changed file.
	for i, k := range doc.APIKeys {
		if len(k.Overrides) == 0 || k.ID == "" {
			continue // no rules of its own, or no name in the decisions
		}
		rules := slices.Clone(p.Plans[k.Plan])
		for name, o := range k.Overrides {
			if slices.ContainsFunc(doc.Plans[k.Plan].Rules, func(r plans.Rule) bool { return r.Name == name && r.InFlight != 0 }) {
				continue // not replayed
			}
			j := slices.IndexFunc(rules, func(r limiter.Rule) bool { return r.Name == name })
			if j < 0 {
				return analytics.Proposal{}, fmt.Errorf("rules: api_keys[%d].overrides.%s: plan %q has no rule %q", i, name, k.Plan, name)
			}
			rules[j] = o.Apply(plans.Rule{Rule: rules[j]}).Rule
		}
		if p.Keys == nil {
			p.Keys = map[string]analytics.ProposedKey{}
		}
		p.Keys[k.ID] = analytics.ProposedKey{Plan: k.Plan, Rules: rules}
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

// whatIfQuery reads "analytics whatif"'s proposal (-rules, -change) and
// the rules that ran (-ran; else -rules when -change changes them) into a
// query over rg (only its plan, route and key filters may be set).
func whatIfQuery(rg analytics.Range, rulesFile, change, ranFile string, top int) (analytics.WhatIfQuery, error) {
	if rulesFile == "" {
		return analytics.WhatIfQuery{}, fmt.Errorf("%w: whatif needs -rules FILE: the plans to replay, in the gateway's YAML syntax", errUsage)
	}
	read := func(file, change string) (analytics.Proposal, error) {
		text, err := os.ReadFile(file)
		if err != nil {
			return analytics.Proposal{}, err
		}
		p, err := parseProposal(string(text), change)
		if err != nil {
			return analytics.Proposal{}, fmt.Errorf("%s: %w", file, err)
		}
		return p, nil
	}
	p, err := read(rulesFile, change)
	if err != nil {
		return analytics.WhatIfQuery{}, fmt.Errorf("-rules: %w", err)
	}
	q := analytics.WhatIfQuery{Range: rg, Proposal: p, Top: top}
	if ranFile == "" && strings.TrimSpace(change) != "" {
		ranFile = rulesFile
	}
	if ranFile != "" {
		ran, err := read(ranFile, "")
		if err != nil {
			return analytics.WhatIfQuery{}, fmt.Errorf("-ran: %w", err)
		}
		q.Ran = &ran
	}
	return q, q.Validate()
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
	if c := rep.SelfCheck; c != nil {
		sections = append(sections, section{fmt.Sprintf("self-check: the rules that ran, replayed, decided %.2f %% of %d decisions as they were, and denied %d where %d were (%d not replayed)",
			100*c.Agreement, c.Requests, c.WouldDeny, c.WasDenied, c.NotReplayed), table{header: head, rows: [][]string{counts(c.WhatIfCounts)}}})
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
		fmt.Fprintf(w, "# caveat: %s\n", terminalSafe(c))
	}
	return nil
}
