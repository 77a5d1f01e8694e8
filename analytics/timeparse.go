package analytics

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseTime reads a time as analysts type it, relative to now:
//
//	""                    def
//	now                   now
//	-1h, -30m, now-2h     now minus a Go duration (also d for days: -7d)
//	2026-11-29T12:00:00Z  RFC 3339
//	2026-11-29 12:00      a UTC date and time (seconds optional)
//	2026-11-29            a UTC date at midnight
//	1795985791            Unix seconds
func ParseTime(s string, now, def time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return def, nil
	case s == "now":
		return now, nil
	case strings.HasPrefix(s, "now-") || strings.HasPrefix(s, "-"):
		d, err := parseDuration(strings.TrimPrefix(strings.TrimPrefix(s, "now"), "-"))
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: time %q: %v", ErrBadQuery, s, err)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t.UTC(), nil
		}
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%w: time %q: want now, -1h, RFC 3339, 2006-01-02[ 15:04[:05]] or Unix seconds", ErrBadQuery, s)
}

// parseDuration is time.ParseDuration with d for days.
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bad days %q", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return d, nil
}

// AutoBucket picks the finest bucket that keeps a range under about 500
// points: minute up to 8 hours, hour up to 20 days, day beyond.
func AutoBucket(from, to time.Time) string {
	switch span := to.Sub(from); {
	case span <= 8*time.Hour:
		return BucketMinute
	case span <= 20*24*time.Hour:
		return BucketHour
	}
	return BucketDay
}
