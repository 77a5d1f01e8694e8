package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/boot"
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
	loc, err := analytics.LoadZone(*tz)
	if err != nil {
		return usageErr(err)
	}
	q := analytics.UsageQuery{TZ: *tz, Keys: keys, By: splitList(*by)}
	if q.From, q.To, err = analytics.UsagePeriod(*month, *from, *to, loc, time.Now()); err != nil {
		return usageErr(err)
	}
	fc, err := loadConfig(*fs.Config, getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
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
	return renderUsage(stdout, *format, st)
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
	fmt.Fprintln(w)
	total := analytics.UsageRow{UsageCounts: st.Total}.Record(nil)
	pad := make([]string, len(t.header)-len(total))
	if len(pad) > 0 {
		pad[0] = "total"
	}
	t.rows = append(t.rows, append(pad, total...))
	return render(w, "table", t, nil)
}
