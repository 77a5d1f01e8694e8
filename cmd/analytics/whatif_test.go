package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// TestParseProposal: the gateway's own example configuration is a
// proposal as it stands; a fragment with plans: is one too; a changed rule
// lands in its plan; mistakes are named.
func TestParseProposal(t *testing.T) {
	example, err := os.ReadFile("../../deploy/gateway.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := parseProposal(string(example), "{plan: free, name: minute, limit: 50, period: 1m}")
	if err != nil {
		t.Fatalf("parseProposal(gateway.example.yaml) = %v", err)
	}
	wantFree := []limiter.Rule{
		{Name: "minute", Limit: 50, Period: time.Minute},
		{Name: "hour", Limit: 5000, Period: time.Hour},
		{Name: "day", Limit: 50000, Period: 24 * time.Hour},
	}
	if diff := cmp.Diff(wantFree, p.Plans["free"]); diff != "" {
		t.Errorf("plan free (-want +got):\n%s", diff)
	}
	if len(p.Plans) != 5 {
		t.Errorf("plans %v, want the example's 5", slices.Sorted(maps.Keys(p.Plans)))
	}
	// The in-flight rule is not replayed; the token budget is, by the
	// reservations.
	if got := len(p.Plans["llm"]); got != 2 {
		t.Errorf("plan llm replays %d rules, want 2 (not its in-flight rule)", got)
	}
	for name, want := range map[string]analytics.ProposedRoute{"search": {Plan: "search", Cost: 1}, "export": {Cost: 10}, "api": {Cost: 1}} {
		if got := p.Routes[name]; got != want {
			t.Errorf("route %s = %+v, want %+v", name, got, want)
		}
	}
	if _, ok := p.Routes["health"]; ok {
		t.Error("the exempt route health is in the proposal")
	}
	// globex's override of minute applies over the change, as the
	// gateway would apply it to the changed file; acme has none.
	wantGlobex := analytics.ProposedKey{Plan: "free", Rules: slices.Clone(wantFree)}
	wantGlobex.Rules[0].Limit, wantGlobex.Rules[0].Burst = 300, 50
	if diff := cmp.Diff(map[string]analytics.ProposedKey{"globex": wantGlobex}, p.Keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}

	p, err = parseProposal("plans:\n  free:\n    rules:\n      - {name: second, limit: 5, period: 1s, algorithm: sliding_window}\n", "")
	if err != nil || len(p.Plans["free"]) != 1 || p.Plans["free"][0].Algorithm != limiter.SlidingWindow {
		t.Errorf("fragment: %+v, %v", p, err)
	}

	for _, tt := range []struct {
		name, rules, change, want string
	}{
		{"not yaml", "plans: [", "", "rules: yaml"},
		{"no plans", "routes: []\n", "", "no plans: section"},
		{"misspelt field", "listen: x\nplans:\n  free:\n    rules:\n      - {name: m, limt: 5, period: 1m}\n", "", "line 5: field limt not found"},
		{"bad rule", "plans:\n  free:\n    rules:\n      - {name: m, limit: 0, period: 1m}\n", "", "limit 0 must be positive"},
		{"bad period", "plans:\n  free:\n    rules:\n      - {name: m, limit: 1, period: soon}\n", "", "line 4: cannot unmarshal"},
		{"change of unknown plan", "plans:\n  free:\n    rules:\n      - {name: m, limit: 1, period: 1m}\n", "{plan: gold, name: m, limit: 2, period: 1m}", `plan "gold" is not in the proposal`},
		{"override of no rule", "plans:\n  free:\n    rules:\n      - {name: m, limit: 1, period: 1m}\napi_keys:\n  - {id: k, plan: free, sha256: ab, overrides: {h: {limit: 3}}}\n", "", `api_keys[0].overrides.h: plan "free" has no rule "h"`},
		{"bad override", "plans:\n  free:\n    rules:\n      - {name: m, limit: 1, period: 1m}\napi_keys:\n  - {id: k, plan: free, sha256: ab, overrides: {m: {limit: -3}}}\n", "", `key "k" rule 0`},
		{"misspelt change", "plans:\n  free:\n    rules:\n      - {name: m, limit: 1, period: 1m}\n", "{plan: free, name: m, limits: 2}", "change: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseProposal(tt.rules, tt.change)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseProposal = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestWhatIfCommand runs "analytics whatif" against a real ClickHouse:
// one key's 10 requests in a second, all allowed as decided, replayed
// under 4 a second.
func TestWhatIfCommand(t *testing.T) {
	conn, addr, db := database(t)
	start := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	var rows []event.Decision
	for i := range 10 {
		rows = append(rows, event.Decision{Time: start.Add(time.Duration(i) * 100 * time.Millisecond), GatewayID: "gw-a", KeyID: "k1",
			KeyKind: event.KindAPIKey, Route: "api", Method: "GET", Plan: "free", Allowed: true, Cost: 1})
	}
	mustInsert(t, conn, rows)
	rules := writeFile(t, "plans:\n  free:\n    rules:\n      - {name: second, limit: 1, period: 1s, burst: 4}\n")
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	args := []string{"whatif", "-rules", rules, "-from", start.Add(-time.Minute).Format(time.RFC3339), "-to", start.Add(time.Minute).Format(time.RFC3339)}
	var out bytes.Buffer
	if err := run(context.Background(), append(args, "-format", "json"), getenv, &out); err != nil {
		t.Fatalf("whatif: %v\n%s", err, out.String())
	}
	var rep analytics.WhatIfReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	// Burst 4, refilled by 0.1 every 100ms: the first 4 pass, leaving
	// 0.3; the next 6 find 0.4 to 0.9 of a token.
	if want := (analytics.WhatIfCounts{Requests: 10, WouldDeny: 6, NewlyDenied: 6}); rep.Totals != want || rep.KeysNewlyBlocked != 1 {
		t.Errorf("whatif totals %+v, newly blocked %d; want %+v, 1", rep.Totals, rep.KeysNewlyBlocked, want)
	}
	out.Reset()
	if err := run(context.Background(), append(args, "-change", "{plan: free, name: second, limit: 10, period: 1s}"), getenv, &out); err != nil {
		t.Fatalf("whatif -change: %v", err)
	}
	for _, want := range []string{"# per rule", "# keys newly blocked", "# caveat: ", "\nsecond  0 ",
		// -change on -rules: -rules ran, and the replay checks itself on them.
		"# self-check: the rules that ran, replayed, decided 40.00 % of 10 decisions as they were, and denied 6 where 0 were (0 not replayed)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("whatif table lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range [][]string{
		{"whatif"},
		{"whatif", "-rules", "/nonexistent.yaml"},
		{"whatif", "-rules", rules, "-from", "-40d"},
		{"whatif", "-rules", rules, "-format", "xml"},
		{"whatif", "-rules", rules, "-top", "5000"},
	} {
		if err := run(context.Background(), bad, getenv, &out); err == nil {
			t.Errorf("analytics %v: want an error", bad)
		}
	}
}
