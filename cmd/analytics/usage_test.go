package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/gateway/event"
	"github.com/edgelimit/edgelimit/internal/boot"
)

// TestUsageCommand: analytics usage prints a month's statement as CSV,
// JSON and a table that says whether it is complete and sums it; bad
// input is a usage error (exit 2) that says what is wrong, and a key that
// does not exist is one, not an empty statement.
func TestUsageCommand(t *testing.T) {
	conn, addr, db := database(t)
	at := time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC) // 1 December in Berlin
	mustInsert(t, conn, []event.Decision{
		{Time: at.Add(-time.Hour), GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Cost: 4, Allowed: true},
		{Time: at, GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Cost: 4, Allowed: true},
		{Time: at.AddDate(0, 0, 2), GatewayID: "gw-1", KeyID: "k-acme", KeyName: "acme", KeyKind: event.KindAPIKey, Route: "/a", Plan: "pro", Allowed: true},
	})
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"usage"}, args...), getenv, &out)
		return out.String(), err
	}
	out, err := cli("-month", "2026-11", "-tz", "Europe/Berlin", "-key", "acme", "-by", "key,route", "-format", "csv")
	if want := "key_id,key_name,key_kind,route,requests,allowed,denied,allowed_cost,denied_cost,without_store\nk-acme,acme,api_key,/a,1,1,0,4,0,0\n"; err != nil || out != want {
		t.Errorf("usage -format csv = %q, %v; want %q (the 23:30 UTC decision is December's in Berlin)", out, err, want)
	}
	out, err = cli("-month", "2026-11", "-key", "acme", "-key", "k-acme")
	if err != nil || !strings.Contains(out, "complete: data through") || !strings.Contains(out, "total") ||
		!strings.Contains(out, "k-acme  acme      api_key   pro   /a     2         2") {
		t.Errorf("usage (table) = %v\n%s", err, out)
	}
	// Nothing after 2 December is stored: a period past it is not complete.
	if out, err = cli("-from", "2026-12-01", "-to", "2026-12-10"); err != nil || !strings.Contains(out, "INCOMPLETE: no decision after the period's end") {
		t.Errorf("usage of 1 to 10 December = %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-month", "2026-13"}, "2026-13"},
		{[]string{"-month", "2026-11", "-tz", "Nowhere/Zone"}, "time zone"},
		{[]string{"-from", "2026-11-02", "-to", "2026-11-01"}, "not before"},
		{[]string{"-month", "2026-11", "-by", "gateway"}, `by "gateway"`},
		{[]string{"-month", "2026-11", "-key", "nobody"}, `no key "nobody"`},
		{[]string{"-month", "2026-11", "-format", "xml"}, "-format"},
		{[]string{"-month", "2026-11", "-frm", "x"}, "-frm"},
	} {
		_, err := cli(tc.args...)
		if boot.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("usage %s = %v (exit %d), want exit 2 saying %q", strings.Join(tc.args, " "), err, boot.ExitCode(err), tc.says)
		}
	}
}
