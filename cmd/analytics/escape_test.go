package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/edgelimit/edgelimit/analytics/analyticstest"
)

// TestTableEscapesControlCharacters: key names, routes, plans and gateway
// ids come from traffic and configuration. In the CLI's table output a
// terminal control sequence among them (here one that clears the screen,
// one that retitles the window, a bidi override) or a tab or newline, or a byte that is not UTF-8, must
// show as an escape, not act, and each result stay one line; JSON and CSV
// keep the values as they are, encoded.
func TestTableEscapesControlCharacters(t *testing.T) {
	conn, addr, db := database(t)
	now := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Second)
	const (
		name    = "acme\x1b[2J\x1b]0;owned\x07"
		route   = "/v1/\u202eorders\tx"
		gateway = "gw\r\nfake-row"
	)
	var rows []analyticstest.Decision
	for i := range 20 {
		rows = append(rows, analyticstest.Decision{Time: now.Add(-time.Duration(i) * time.Second), Gateway: gateway,
			KeyID: "k-1", KeyName: name, KeyKind: "api_key", ClientIP: "192.0.2.1", Route: route, Method: "GET",
			Plan: "free\u009b31m\xff", BindingRule: "per_minute", Allowed: i%2 == 0, Limit: 10, Mode: "fail_closed", StoreStatus: "unavailable"})
	}
	mustInsert(t, conn, rows)
	getenv := env(map[string]string{"EDGELIMIT_CLICKHOUSE_ADDR": addr, "EDGELIMIT_CLICKHOUSE_DATABASE": db})
	from, to := now.Add(-15*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339)
	for _, args := range [][]string{
		{"top-keys", "-from", from, "-to", to},
		{"key", "k-1", "-from", from, "-to", to},
		{"fail-minutes", "-from", from, "-to", to},
		{"store-health", "-from", from, "-to", to},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), args, getenv, &out); err != nil {
			t.Fatalf("analytics %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		s := out.String()
		if !utf8.ValidString(s) {
			t.Errorf("analytics %s prints bytes that are not UTF-8:\n%q", args[0], s)
		}
		if i := strings.IndexFunc(s, func(r rune) bool {
			return r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u202e')
		}); i >= 0 {
			t.Errorf("analytics %s prints the control character %q raw:\n%q", args[0], s[i:i+1], s)
		}
		if strings.Contains(s, "\nfake-row") {
			t.Errorf("analytics %s: a gateway id's newline starts a row of its own:\n%s", args[0], s)
		}
		if args[0] == "top-keys" && !strings.Contains(s, `acme\x1b[2J\x1b]0;owned\a`) {
			t.Errorf("analytics top-keys does not show the key name escaped:\n%s", s)
		}
	}
}
