package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Unit is the length of a calendar rule's windows.
type Unit string

// The calendar units.
const (
	Day   Unit = "day"
	Week  Unit = "week"
	Month Unit = "month"
	Year  Unit = "year"
)

// Calendar makes a rule count in fixed calendar windows instead of a
// duration: per day, week, month or year of a time zone, each window
// starting at an anchor (a customer's billing day). The rule then admits
// Limit units per window (plus what Grant added to that window), and a
// window's count starts from zero at its first microsecond. A rule with a
// Calendar has no Period and no Burst, and its Algorithm is FixedWindow.
//
// Windows start at the anchor's wall time in the zone, so a day spans 23
// or 25 hours across a DST change and a month 28 to 31 days. A start time
// a DST change skips (02:30 on a spring-forward day in New York) falls at
// the offset in force before the change (03:30 new time); a start time it
// repeats, at its first occurrence.
//
// The Redis store compares the windows with Redis' clock, never the
// gateway's (see scriptArgs); the memory store with its own.
//
// Make one with ParseCalendar, or decode it from YAML: either way the zone
// is loaded once, not per check. A Calendar is immutable and shared by
// every copy of its rule.
type Calendar struct {
	unit  Unit
	zone  string // as given; "" is UTC
	start string // as given; "" is the unit's default
	loc   *time.Location
	// the anchor: a week's first weekday, a month's day (clamp: a day
	// 29-31 falls on the last day of a shorter month; last: the month's
	// last day), a year's month and day, and every unit's time of day
	weekday time.Weekday
	month   time.Month
	day     int
	last    bool
	clamp   bool
	clock   time.Duration
	// shift moves every boundary by -shift: the windows are those of the
	// calendar at now+shift, moved back to now. Tests set it (see
	// export_test.go) to put a month's end a moment from Redis' now.
	shift time.Duration
	// err is what decoding found wrong, reported by Rule.Validate so the
	// error names the rule.
	err error
}

// ParseCalendar returns the calendar of unit in zone (an IANA name such as
// "America/New_York"; "" or "UTC" for UTC), its windows starting at start:
//
//	day    "HH:MM" (or "HH:MM:SS"): the time of day; default "00:00"
//	week   a weekday and maybe a time, "sunday" or "sun 06:00"; default
//	       "monday 00:00", the ISO week
//	month  a day of the month and maybe a time, "15" or "15 09:30";
//	       default "1 00:00". Not every month has a 29th, 30th or 31st, so
//	       such a day needs "or last" ("31 or last": the 31st, or the last
//	       day of a shorter month); "last" alone is every month's last day
//	year   "MM-DD" and maybe a time, "04-06"; default "01-01 00:00".
//	       "02-29" needs "or last" (Feb 28 in other years)
func ParseCalendar(unit Unit, zone, start string) (*Calendar, error) {
	c := &Calendar{unit: unit, zone: zone, start: start}
	if err := c.parse(); err != nil {
		return nil, err
	}
	return c, nil
}

// MustCalendar is ParseCalendar for tests and constant rules: it panics
// on an error.
func MustCalendar(unit Unit, zone, start string) *Calendar {
	c, err := ParseCalendar(unit, zone, start)
	if err != nil {
		panic(err)
	}
	return c
}

var errCalendar = errors.New("calendar")

func (c *Calendar) parse() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %s: %s", errCalendar, c.describeInput(), fmt.Sprintf(format, args...))
	}
	switch c.unit {
	case Day, Week, Month, Year:
	case "":
		return bad("no unit: want every: day, week, month or year")
	default:
		return bad("unknown unit %q: want day, week, month or year", c.unit)
	}
	switch c.zone {
	case "", "UTC":
		c.loc = time.UTC
	default:
		loc, err := time.LoadLocation(c.zone)
		if err != nil || c.zone == "Local" {
			return bad("unknown time zone %q: want an IANA name such as Europe/Berlin or America/New_York", c.zone)
		}
		c.loc = loc
	}
	fields := strings.Fields(strings.ToLower(c.start))
	// the time of day: the last field when it holds a colon
	if n := len(fields); n > 0 && strings.Contains(fields[n-1], ":") {
		d, ok := parseClock(fields[n-1])
		if !ok {
			return bad("time of day %q: want HH:MM or HH:MM:SS, 00:00 to 23:59:59", fields[n-1])
		}
		c.clock, fields = d, fields[:n-1]
	}
	switch c.unit {
	case Day:
		if len(fields) > 0 {
			return bad("a day starts at a time of day only, e.g. \"06:00\"")
		}
	case Week:
		c.weekday = time.Monday
		if len(fields) > 1 {
			return bad("want a weekday and maybe a time, e.g. \"sunday 06:00\"")
		}
		if len(fields) == 1 {
			wd, ok := weekdays[fields[0]]
			if !ok {
				return bad("unknown weekday %q", fields[0])
			}
			c.weekday = wd
		}
	case Month:
		c.day = 1
		switch {
		case len(fields) == 1 && fields[0] == "last":
			c.last = true
		case len(fields) == 1 || len(fields) == 3 && fields[1] == "or" && fields[2] == "last":
			d, err := strconv.Atoi(fields[0])
			if err != nil || d < 1 || d > 31 {
				return bad("day %q: want a day of the month, 1 to 31, or \"last\"", fields[0])
			}
			c.day, c.clamp = d, len(fields) == 3
			if d > 28 && !c.clamp {
				return bad("not every month has a %s: write %q to start on the %s, or on the last day of a shorter month (Feb 28 or 29, Apr 30...), or \"last\" for every month's last day", ordinal(d), fields[0]+" or last", ordinal(d))
			}
		case len(fields) == 0:
		default:
			return bad("want a day of the month and maybe a time, e.g. \"15 00:00\"")
		}
	case Year:
		c.month, c.day = time.January, 1
		switch {
		case len(fields) == 1 || len(fields) == 3 && fields[1] == "or" && fields[2] == "last":
			m, d, ok := strings.Cut(fields[0], "-")
			mi, err1 := strconv.Atoi(m)
			di, err2 := strconv.Atoi(d)
			if !ok || err1 != nil || err2 != nil || mi < 1 || mi > 12 || di < 1 {
				return bad("date %q: want MM-DD, e.g. \"04-06\"", fields[0])
			}
			c.month, c.day, c.clamp = time.Month(mi), di, len(fields) == 3
			switch most := daysIn(2024, c.month); {
			case di > most:
				return bad("%s has %d days, not %d", c.month, most, di)
			case di > daysIn(2025, c.month) && !c.clamp:
				return bad("not every year has %s %d: write %q to start on it, or on %s %d in other years", c.month, di, fields[0]+" or last", c.month, di-1)
			}
		case len(fields) == 0:
		default:
			return bad("want a date MM-DD and maybe a time, e.g. \"04-06 00:00\"")
		}
	}
	return nil
}

func (c *Calendar) describeInput() string {
	s := string(c.unit)
	if c.start != "" {
		s += " from " + strconv.Quote(c.start)
	}
	if c.zone != "" {
		s += " in " + c.zone
	}
	return s
}

var weekdays = map[string]time.Weekday{}

func init() {
	for d := time.Sunday; d <= time.Saturday; d++ {
		name := strings.ToLower(d.String())
		weekdays[name], weekdays[name[:3]] = d, d
	}
}

func parseClock(s string) (time.Duration, bool) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, false
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || len(p) != 2 || n < 0 || n > []int{23, 59, 59}[i] {
			return 0, false
		}
		v[i] = n
	}
	return time.Duration(v[0])*time.Hour + time.Duration(v[1])*time.Minute + time.Duration(v[2])*time.Second, true
}

func ordinal(d int) string {
	switch {
	case d%10 == 1 && d != 11:
		return strconv.Itoa(d) + "st"
	case d%10 == 2 && d != 12:
		return strconv.Itoa(d) + "nd"
	case d%10 == 3 && d != 13:
		return strconv.Itoa(d) + "rd"
	}
	return strconv.Itoa(d) + "th"
}

// daysIn is the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// UnmarshalYAML reads a calendar from the gateway's configuration, either
// a unit alone ("calendar: month": UTC, the default start) or a mapping
// {every: month, zone: America/New_York, start: "15 00:00"}. What is wrong
// with it is reported by the rule's Validate, which names the rule.
func (c *Calendar) UnmarshalYAML(unmarshal func(any) error) error {
	var unit string
	if err := unmarshal(&unit); err == nil {
		*c = Calendar{unit: Unit(unit)}
	} else {
		var m struct {
			Every string `yaml:"every"`
			Zone  string `yaml:"zone"`
			Start string `yaml:"start"`
		}
		if err := unmarshal(&m); err != nil {
			return err
		}
		*c = Calendar{unit: Unit(m.Every), zone: m.Zone, start: m.Start}
	}
	c.err = c.parse()
	return nil
}

// MarshalYAML writes the calendar as it was configured.
func (c *Calendar) MarshalYAML() (any, error) {
	m := map[string]string{"every": string(c.unit)}
	if c.zone != "" {
		m["zone"] = c.zone
	}
	if c.start != "" {
		m["start"] = c.start
	}
	return m, nil
}

// Unit is the calendar's unit.
func (c *Calendar) Unit() Unit { return c.unit }

// Location is the zone the windows fall in.
func (c *Calendar) Location() *time.Location { return c.loc }

// String describes the calendar for people: "month from the 15th 00:00 in
// America/New_York".
func (c *Calendar) String() string {
	s := string(c.unit)
	hm := fmt.Sprintf("%02d:%02d", int(c.clock.Hours()), int(c.clock.Minutes())%60)
	if sec := int(c.clock.Seconds()) % 60; sec != 0 {
		hm += fmt.Sprintf(":%02d", sec)
	}
	switch c.unit {
	case Day:
		s += " from " + hm
	case Week:
		s += " from " + c.weekday.String() + " " + hm
	case Month:
		switch {
		case c.last:
			s += " from the last day " + hm
		case c.clamp:
			s += " from the " + ordinal(c.day) + " (or a shorter month's last day) " + hm
		default:
			s += " from the " + ordinal(c.day) + " " + hm
		}
	case Year:
		s += fmt.Sprintf(" from %s %d", c.month, c.day)
		if c.clamp {
			s += fmt.Sprintf(" (%s %d in other years)", c.month, c.day-1)
		}
		s += " " + hm
	}
	return s + " in " + c.loc.String()
}

// identity is what tells two calendars' windows apart, for fingerprints.
func (c *Calendar) identity() string {
	return fmt.Sprintf("%s|%s|%s|%d", c.unit, c.loc, c.start, c.shift)
}

// startOf is the start of window k: k counts days, weeks, months or years
// (see index) from the Unix epoch's civil date, in the calendar's zone.
func (c *Calendar) startOf(k int64) time.Time {
	var y, d int
	mo := time.January
	switch c.unit {
	case Day:
		y, d = 1970, 1+int(k)
	case Week:
		// the first anchor weekday on or after Thursday, 1 January 1970
		y, d = 1970, 1+(int(c.weekday)-int(time.Thursday)+7)%7+7*int(k)
	case Month:
		y, mo = int(floorDiv(k, 12)), time.Month(k-12*floorDiv(k, 12)+1)
		d = c.dayOf(y, mo)
	default:
		y, mo = int(k), c.month
		d = c.dayOf(y, mo)
	}
	h, m, s := int(c.clock/time.Hour), int(c.clock/time.Minute)%60, int(c.clock/time.Second)%60
	t := time.Date(y, mo, d, h, m, s, 0, c.loc)
	if t.Hour() != h || t.Minute() != m {
		// A wall time the zone skips: time.Date reads it at the offset
		// after the change, which lands before the change. Read at the
		// offset before it instead, as wall clocks do: 02:30 becomes 03:30.
		_, before := t.Zone()
		_, end := t.ZoneBounds()
		_, after := end.Zone()
		t = t.Add(time.Duration(after-before) * time.Second)
	}
	return t
}

// dayOf is the anchor's day in month mo of year y.
func (c *Calendar) dayOf(y int, mo time.Month) int {
	n := daysIn(y, mo)
	if c.last || (c.clamp && c.day > n) {
		return n
	}
	return c.day
}

// index is about the index of the window holding t: exact, or one off
// when t falls before its day's (month's, year's) anchor.
func (c *Calendar) index(t time.Time) int64 {
	lt := t.In(c.loc)
	y, mo, d := lt.Date()
	days := time.Date(y, mo, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
	switch c.unit {
	case Day:
		return days
	case Week:
		return floorDiv(days-int64((int(c.weekday)-int(time.Thursday)+7)%7), 7)
	case Month:
		return int64(y)*12 + int64(mo) - 1
	default:
		return int64(y)
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// window returns the index of the window holding t (shifted).
func (c *Calendar) window(t time.Time) int64 {
	k := c.index(t)
	for c.startOf(k).After(t) {
		k--
	}
	for !c.startOf(k + 1).After(t) {
		k++
	}
	return k
}

// Bounds returns the window holding t: its first instant and the first
// of the next one.
func (c *Calendar) Bounds(t time.Time) (start, end time.Time) {
	t = t.Add(c.shift)
	k := c.window(t)
	return c.startOf(k).Add(-c.shift), c.startOf(k + 1).Add(-c.shift)
}

// bounds returns, in µs since the epoch, the starts of the window before
// the one holding t, of that window, and of the two after it: what a
// store whose clock is near t needs to find its own window.
func (c *Calendar) bounds(t time.Time) [4]int64 {
	t = t.Add(c.shift)
	k := c.window(t)
	var b [4]int64
	for i := range b {
		b[i] = c.startOf(k - 1 + int64(i)).Add(-c.shift).UnixMicro()
	}
	return b
}

// span is the longest a window can be: the unit's longest in civil days,
// plus the most the zone's offset moves within a year (a DST change:
// usually an hour). RateLimit-Policy advertises it as the window (see
// Rule.Window), so that Limit per span never promises more than a window
// admits.
func (c *Calendar) span() time.Duration {
	days := map[Unit]int{Day: 1, Week: 7, Month: 31, Year: 366}[c.unit]
	// The offsets through a year, every ten days; the zone's rules are
	// the same from year to year for all but a few zones.
	lo, hi := 0, 0
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 37; i++ {
		_, off := base.AddDate(0, 0, 10*i).In(c.loc).Zone()
		if i == 0 || off < lo {
			lo = off
		}
		if i == 0 || off > hi {
			hi = off
		}
	}
	return time.Duration(days)*24*time.Hour + time.Duration(hi-lo)*time.Second
}

// Shifted returns c with every window moved earlier by d: its window
// holding t is c's window holding t+d, moved back by d, so lengths (a 23
// hour day, a 29 day February) are kept. Tests use it to put a boundary a
// moment away on a clock they cannot set, Redis' TIME; configuration
// cannot set it.
func (c *Calendar) Shifted(d time.Duration) *Calendar {
	s := *c
	s.shift = d.Truncate(time.Microsecond)
	return &s
}
