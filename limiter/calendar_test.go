package limiter

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

// TestCalendarBounds: the window holding an instant, against calendar
// dates written out by hand, across month ends, DST changes, Feb 29 and
// year ends.
func TestCalendarBounds(t *testing.T) {
	ny, berlin, howe := mustZone(t, "America/New_York"), mustZone(t, "Europe/Berlin"), mustZone(t, "Australia/Lord_Howe")
	utc := time.UTC
	type window struct{ start, end time.Time }
	tests := []struct {
		name               string
		unit               Unit
		zone, start        string
		give               time.Time
		wantStart, wantEnd time.Time
	}{
		{"month end, last instant", Month, "", "", time.Date(2026, 1, 31, 23, 59, 59, 999999999, utc),
			time.Date(2026, 1, 1, 0, 0, 0, 0, utc), time.Date(2026, 2, 1, 0, 0, 0, 0, utc)},
		{"month start, first instant", Month, "", "", time.Date(2026, 2, 1, 0, 0, 0, 0, utc),
			time.Date(2026, 2, 1, 0, 0, 0, 0, utc), time.Date(2026, 3, 1, 0, 0, 0, 0, utc)},
		{"month in New York is UTC-5 in winter", Month, "America/New_York", "", time.Date(2026, 2, 1, 4, 59, 59, 0, utc),
			time.Date(2026, 1, 1, 0, 0, 0, 0, ny), time.Date(2026, 2, 1, 0, 0, 0, 0, ny)},
		{"billing day 15 across the spring DST change", Month, "America/New_York", "15 00:00", time.Date(2026, 3, 15, 3, 59, 59, 0, utc),
			time.Date(2026, 2, 15, 0, 0, 0, 0, ny), time.Date(2026, 3, 15, 0, 0, 0, 0, ny)},
		{"billing day 15, just after", Month, "America/New_York", "15", time.Date(2026, 3, 15, 4, 0, 0, 0, utc),
			time.Date(2026, 3, 15, 0, 0, 0, 0, ny), time.Date(2026, 4, 15, 0, 0, 0, 0, ny)},
		{"spring-forward day is 23 hours", Day, "America/New_York", "", time.Date(2026, 3, 8, 12, 0, 0, 0, ny),
			time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{"fall-back day is 25 hours", Day, "America/New_York", "", time.Date(2026, 11, 1, 23, 59, 0, 0, ny),
			time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 11, 2, 0, 0, 0, 0, ny)},
		{"a start time the DST change skips falls an hour later", Day, "America/New_York", "02:30", time.Date(2026, 3, 8, 7, 0, 0, 0, utc),
			time.Date(2026, 3, 7, 2, 30, 0, 0, ny), time.Date(2026, 3, 8, 7, 30, 0, 0, utc)},
		{"a start time the DST change repeats is its first", Day, "America/New_York", "01:30", time.Date(2026, 11, 1, 6, 0, 0, 0, utc),
			time.Date(2026, 11, 1, 5, 30, 0, 0, utc), time.Date(2026, 11, 2, 1, 30, 0, 0, ny)},
		{"day from 06:00 in Berlin, before it", Day, "Europe/Berlin", "06:00", time.Date(2026, 6, 10, 5, 59, 0, 0, berlin),
			time.Date(2026, 6, 9, 6, 0, 0, 0, berlin), time.Date(2026, 6, 10, 6, 0, 0, 0, berlin)},
		{"half-hour DST in Lord Howe", Day, "Australia/Lord_Howe", "", time.Date(2026, 10, 4, 12, 0, 0, 0, howe),
			time.Date(2026, 10, 4, 0, 0, 0, 0, howe), time.Date(2026, 10, 5, 0, 0, 0, 0, howe)},
		{"Feb 29 is in February's window", Month, "", "", time.Date(2028, 2, 29, 23, 59, 59, 0, utc),
			time.Date(2028, 2, 1, 0, 0, 0, 0, utc), time.Date(2028, 3, 1, 0, 0, 0, 0, utc)},
		{"the 31st or last, in February of a leap year", Month, "", "31 or last", time.Date(2028, 3, 1, 0, 0, 0, 0, utc),
			time.Date(2028, 2, 29, 0, 0, 0, 0, utc), time.Date(2028, 3, 31, 0, 0, 0, 0, utc)},
		{"the 30th or last, January to February", Month, "", "30 or last", time.Date(2027, 2, 1, 0, 0, 0, 0, utc),
			time.Date(2027, 1, 30, 0, 0, 0, 0, utc), time.Date(2027, 2, 28, 0, 0, 0, 0, utc)},
		{"last day of every month", Month, "Europe/Berlin", "last 12:00", time.Date(2027, 3, 1, 0, 0, 0, 0, berlin),
			time.Date(2027, 2, 28, 12, 0, 0, 0, berlin), time.Date(2027, 3, 31, 12, 0, 0, 0, berlin)},
		{"year end", Year, "", "", time.Date(2026, 12, 31, 23, 59, 59, 999999999, utc),
			time.Date(2026, 1, 1, 0, 0, 0, 0, utc), time.Date(2027, 1, 1, 0, 0, 0, 0, utc)},
		{"year end in Tokyo comes first", Year, "Asia/Tokyo", "", time.Date(2026, 12, 31, 15, 0, 0, 0, utc),
			time.Date(2027, 1, 1, 0, 0, 0, 0, mustZone(t, "Asia/Tokyo")), time.Date(2028, 1, 1, 0, 0, 0, 0, mustZone(t, "Asia/Tokyo"))},
		{"tax year from April 6", Year, "Europe/London", "04-06", time.Date(2027, 1, 10, 0, 0, 0, 0, utc),
			time.Date(2026, 4, 6, 0, 0, 0, 0, mustZone(t, "Europe/London")), time.Date(2027, 4, 6, 0, 0, 0, 0, mustZone(t, "Europe/London"))},
		{"year from Feb 29 or last, in a common year", Year, "", "02-29 or last", time.Date(2027, 3, 1, 0, 0, 0, 0, utc),
			time.Date(2027, 2, 28, 0, 0, 0, 0, utc), time.Date(2028, 2, 29, 0, 0, 0, 0, utc)},
		{"ISO week over the year end", Week, "", "", time.Date(2026, 1, 1, 12, 0, 0, 0, utc),
			time.Date(2025, 12, 29, 0, 0, 0, 0, utc), time.Date(2026, 1, 5, 0, 0, 0, 0, utc)},
		{"week from Sunday 06:00, on Sunday before it", Week, "America/New_York", "sun 06:00", time.Date(2026, 3, 8, 5, 0, 0, 0, ny),
			time.Date(2026, 3, 1, 6, 0, 0, 0, ny), time.Date(2026, 3, 8, 6, 0, 0, 0, ny)},
		{"week across the epoch", Week, "", "", time.Date(1970, 1, 1, 0, 0, 0, 0, utc),
			time.Date(1969, 12, 29, 0, 0, 0, 0, utc), time.Date(1970, 1, 5, 0, 0, 0, 0, utc)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCalendar(tt.unit, tt.zone, tt.start)
			if err != nil {
				t.Fatalf("ParseCalendar: %v", err)
			}
			start, end := c.Bounds(tt.give)
			if got, want := (window{start, end}), (window{tt.wantStart, tt.wantEnd}); !got.start.Equal(want.start) || !got.end.Equal(want.end) {
				t.Errorf("%v: Bounds(%v) = [%v, %v), want [%v, %v)", c, tt.give, start.In(c.loc), end.In(c.loc), want.start, want.end)
			}
			b := c.bounds(tt.give)
			if b[1] != start.UnixMicro() || b[2] != end.UnixMicro() || b[0] >= b[1] || b[3] <= b[2] {
				t.Errorf("bounds(%v) = %v, want the window [%d, %d) between its neighbours", tt.give, b, start.UnixMicro(), end.UnixMicro())
			}
			if ps, pe := c.Bounds(time.UnixMicro(b[1] - 1)); ps.UnixMicro() != b[0] || pe.UnixMicro() != b[1] {
				t.Errorf("the previous window is [%v, %v), bounds say it starts at %v", ps, pe, time.UnixMicro(b[0]))
			}
		})
	}
}

// TestCalendarWindowsTile: over years of random instants in zones with and
// without DST, every window holds its instant, starts on its anchor's wall
// time (a skipped start time an hour on), and ends where the next begins.
func TestCalendarWindowsTile(t *testing.T) {
	cals := []*Calendar{
		MustCalendar(Day, "America/New_York", "02:30"), MustCalendar(Week, "Europe/Berlin", "sunday 23:30"),
		MustCalendar(Month, "America/Sao_Paulo", "31 or last 00:00"), MustCalendar(Month, "Pacific/Chatham", "15 02:45"),
		MustCalendar(Year, "Asia/Kolkata", "02-29 or last"), MustCalendar(Month, "", "last"),
	}
	r := rand.New(rand.NewPCG(1, 2))
	lo, hi := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2032, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for _, c := range cals {
		for range 2000 {
			at := time.Unix(lo+r.Int64N(hi-lo), 0)
			start, end := c.Bounds(at)
			if at.Before(start) || !at.Before(end) {
				t.Fatalf("%v: Bounds(%v) = [%v, %v): does not hold it", c, at, start, end)
			}
			if s2, _ := c.Bounds(end); !s2.Equal(end) {
				t.Fatalf("%v: the window after [%v, %v) starts at %v", c, start, end, s2)
			}
			if d := end.Sub(start); d > c.span() || d < 22*time.Hour {
				t.Fatalf("%v: window [%v, %v) is %v long, span %v", c, start, end, d, c.span())
			}
			ls := start.In(c.loc)
			if wall := time.Duration(ls.Hour())*time.Hour + time.Duration(ls.Minute())*time.Minute; wall != c.clock && wall != c.clock+time.Hour {
				t.Fatalf("%v: window starts at %v, not at %v", c, ls, c.clock)
			}
		}
	}
}

func TestParseCalendarErrors(t *testing.T) {
	tests := []struct {
		unit        Unit
		zone, start string
		want        string
	}{
		{Month, "America/New_Yrok", "", `unknown time zone "America/New_Yrok"`},
		{Month, "Local", "", `unknown time zone "Local"`},
		{Month, "", "31", `not every month has a 31st: write "31 or last"`},
		{Month, "", "29 09:00", `not every month has a 29th`},
		{Month, "", "32", `want a day of the month, 1 to 31`},
		{Year, "", "02-29", `not every year has February 29: write "02-29 or last"`},
		{Year, "", "04-31", `April has 30 days, not 31`},
		{Week, "", "someday", `unknown weekday "someday"`},
		{Day, "", "24:00", `time of day "24:00"`},
		{Day, "", "15 00:00", `a day starts at a time of day only`},
		{"fortnight", "", "", `unknown unit "fortnight"`},
		{"", "", "", `no unit`},
	}
	for _, tt := range tests {
		_, err := ParseCalendar(tt.unit, tt.zone, tt.start)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseCalendar(%q, %q, %q) = %v, want an error saying %q", tt.unit, tt.zone, tt.start, err, tt.want)
		}
	}
}

func TestCalendarRuleValidate(t *testing.T) {
	month := MustCalendar(Month, "America/New_York", "15")
	tests := []struct {
		name string
		give Rule
		want string // "" for valid
	}{
		{"valid", Rule{Name: "m", Limit: 100000, Calendar: month}, ""},
		{"fixed window named", Rule{Name: "m", Limit: 10, Calendar: month, Algorithm: FixedWindow}, ""},
		{"burst", Rule{Name: "m", Limit: 10, Calendar: month, Burst: 20}, "has no burst"},
		{"period", Rule{Name: "m", Limit: 10, Calendar: month, Period: time.Hour}, "has no period"},
		{"sliding window of a month", Rule{Name: "m", Limit: 10, Calendar: month, Algorithm: SlidingWindow}, "no sliding window of a calendar month"},
		{"token bucket", Rule{Name: "m", Limit: 10, Calendar: month, Algorithm: TokenBucket}, "does not apply"},
		{"fixed window without a calendar", Rule{Name: "m", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}, "needs a calendar"},
		{"not parsed", Rule{Name: "m", Limit: 10, Calendar: &Calendar{unit: Month}}, "without ParseCalendar"},
		{"limit above 2^32", Rule{Name: "m", Limit: 1<<32 + 1, Calendar: month}, "above"},
	}
	for _, tt := range tests {
		err := tt.give.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidRule)):
			t.Errorf("%s: Validate() = %v, want ErrInvalidRule saying %q", tt.name, err, tt.want)
		}
	}
}

// TestCalendarSpan: Window() is the longest a window gets, DST included.
func TestCalendarSpan(t *testing.T) {
	tests := []struct {
		give *Calendar
		want time.Duration
	}{
		{MustCalendar(Day, "", ""), 24 * time.Hour},
		{MustCalendar(Day, "America/New_York", ""), 25 * time.Hour},
		{MustCalendar(Day, "Australia/Lord_Howe", ""), 24*time.Hour + 30*time.Minute},
		{MustCalendar(Day, "Antarctica/Troll", ""), 26 * time.Hour},
		{MustCalendar(Week, "Asia/Tokyo", ""), 7 * 24 * time.Hour},
		{MustCalendar(Month, "", ""), 31 * 24 * time.Hour},
		{MustCalendar(Year, "Europe/Berlin", ""), 366*24*time.Hour + time.Hour},
	}
	for _, tt := range tests {
		if got := (Rule{Name: "r", Limit: 1, Calendar: tt.give}).Window(); got != tt.want {
			t.Errorf("%v: Window() = %v, want %v", tt.give, got, tt.want)
		}
	}
}
