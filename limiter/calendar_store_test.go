package limiter

import (
	"cmp"
	"context"
	"math/big"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/ratemodel"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// calendarCase is a calendar boundary the stores are driven across: the
// calendar and its windows around the boundary, written out by hand as
// calendar dates (the model's windows: none of the limiter's arithmetic).
// The boundary is starts[1]; each window ends where the next starts.
type calendarCase struct {
	name   string
	cal    *Calendar
	starts []time.Time
}

func calendarCases(t *testing.T) []calendarCase {
	ny, tokyo := mustZone(t, "America/New_York"), mustZone(t, "Asia/Tokyo")
	utc := time.UTC
	return []calendarCase{
		{"month end", MustCalendar(Month, "America/New_York", ""), []time.Time{
			time.Date(2026, 1, 1, 0, 0, 0, 0, ny), time.Date(2026, 2, 1, 0, 0, 0, 0, ny), time.Date(2026, 3, 1, 0, 0, 0, 0, ny)}},
		// the window after the boundary is the 23-hour spring-forward day
		{"DST change", MustCalendar(Day, "America/New_York", ""), []time.Time{
			time.Date(2026, 3, 7, 0, 0, 0, 0, ny), time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)}},
		{"Feb 29", MustCalendar(Month, "", "29 or last"), []time.Time{
			time.Date(2028, 1, 29, 0, 0, 0, 0, utc), time.Date(2028, 2, 29, 0, 0, 0, 0, utc), time.Date(2028, 3, 29, 0, 0, 0, 0, utc)}},
		{"year end", MustCalendar(Year, "Asia/Tokyo", ""), []time.Time{
			time.Date(2026, 1, 1, 0, 0, 0, 0, tokyo), time.Date(2027, 1, 1, 0, 0, 0, 0, tokyo), time.Date(2028, 1, 1, 0, 0, 0, 0, tokyo)}},
	}
}

// modelBounds is the window of starts (moved earlier by shift) holding now.
func modelBounds(starts []time.Time, shift time.Duration) func(now int64) (int64, int64) {
	return func(now int64) (int64, int64) {
		for i := len(starts) - 2; i >= 0; i-- {
			if s := starts[i].Add(-shift).UnixMicro(); now >= s {
				return s, starts[i+1].Add(-shift).UnixMicro()
			}
		}
		panic("a decision before the first window")
	}
}

// calendarEvent is a decision or a grant, at the store's time.
type calendarEvent struct {
	at, ns  int64
	cost    int64
	grant   int64 // non-zero: a grant of this many units, not a decision
	allowed bool
	rules   []RuleResult
}

// calendarRules is a plan as sold: a rate beside a calendar quota.
func calendarRules(cal *Calendar) []Rule {
	return []Rule{
		{Name: "rate", Limit: 4000, Period: time.Second, Burst: 60},
		{Name: "quota", Limit: 40, Calendar: cal},
	}
}

// TestCalendarModel drives every store across a calendar boundary (a month
// end, a DST change, Feb 29, a year end), with concurrent callers of random
// costs, and for Redis three limiters standing for three gateways whose
// clocks are seconds apart, and grants (and take-backs) along the way.
// Redis' time cannot be moved, so its calendar is Shifted to put the
// boundary a moment after Redis' now, keeping the windows' real lengths.
// Every decision is replayed through the reference model (the calendar's
// windows as written-out dates, a token bucket for the rate): never more
// than the quota plus its grants in one window, every rule's own verdict
// exact, the full quota again right after the boundary, and ResetAfter the
// time to the window's end, to the microsecond.
func TestCalendarModel(t *testing.T) {
	for _, tc := range calendarCases(t) {
		t.Run(tc.name+"/memory", func(t *testing.T) {
			t.Parallel()
			seed := testenv.Seed(t, "EDGELIMIT_MODEL_SEED")
			var mu sync.Mutex
			clockRand := rand.New(rand.NewPCG(seed, 2))
			now := tc.starts[1].Add(-300 * time.Millisecond)
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				now = now.Add(time.Duration(1 + clockRand.Int64N(int64(100*time.Microsecond))))
				return now
			}
			m := NewMemory(clock, 0)
			end := tc.starts[1].Add(300 * time.Millisecond)
			events := runCalendar(t, seed, tc.cal, []calendarStore{m}, end)
			replayCalendar(t, tc, 0, calendarRules(tc.cal), events)
		})
		for name, mk := range map[string]func(t *testing.T) redis.UniversalClient{
			"redis":   func(t *testing.T) redis.UniversalClient { return mustRedis(t) },
			"cluster": func(t *testing.T) redis.UniversalClient { return mustCluster(t) },
			"sentinel": func(t *testing.T) redis.UniversalClient {
				master, addrs := testenv.RedisSentinel(t)
				rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs})
				mustPing(t, rdb, "redis sentinel")
				return rdb
			},
		} {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				seed := testenv.Seed(t, "EDGELIMIT_MODEL_SEED")
				rdb := mk(t)
				// The boundary 300ms after Redis' now.
				rnow := redisTime(t, rdb)
				shift := tc.starts[1].Sub(rnow.Add(300 * time.Millisecond)).Truncate(time.Microsecond)
				cal := tc.cal.Shifted(shift)
				var stores []calendarStore
				for _, skew := range []time.Duration{-1500 * time.Millisecond, 0, 1200 * time.Millisecond} {
					stores = append(stores, mustLimiter(t, rdb, Config{Now: func() time.Time { return time.Now().Add(skew) }}))
				}
				events := runCalendar(t, seed, cal, stores, tc.starts[1].Add(-shift).Add(300*time.Millisecond))
				replayCalendar(t, tc, shift, calendarRules(cal), events)
			})
		}
	}
}

// calendarStore is a store with grants.
type calendarStore interface {
	allower
	Grant(ctx context.Context, key string, rule Rule, units int64) (GrantResult, error)
}

// runCalendar runs 6 callers on the stores, in turn, until a decision's
// time passes end; one caller now and then grants or takes back units.
func runCalendar(t *testing.T, seed uint64, cal *Calendar, stores []calendarStore, end time.Time) []calendarEvent {
	t.Helper()
	key := uniqueKey(t)
	rules := calendarRules(cal)
	var (
		mu     sync.Mutex
		events []calendarEvent
		done   atomic.Bool
		wg     sync.WaitGroup
	)
	ctx := context.Background()
	for c := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			s := stores[c%len(stores)]
			var mine []calendarEvent
			for n := 0; !done.Load() && n < 100000; n++ {
				if c == 0 && r.IntN(40) == 0 {
					units := 1 + r.Int64N(8)
					if r.IntN(3) == 0 {
						units = -units
					}
					g, err := s.Grant(ctx, key, rules[1], units)
					if err != nil {
						t.Errorf("Grant: %v", err)
						return
					}
					mine = append(mine, calendarEvent{at: g.Time.UnixMicro(), ns: g.Time.UnixNano(), grant: units})
					continue
				}
				cost := 1 + r.Int64N(3)
				d, err := s.Allow(ctx, key, rules, cost)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if d.Reason != "" {
					t.Errorf("Allow(cost %d) = %+v: want a store decision", cost, d)
					return
				}
				// (a cached denial carries the gateway's clock, not the store's)
				if !d.Cached {
					mine = append(mine, calendarEvent{at: d.Time.UnixMicro(), ns: d.Time.UnixNano(), cost: cost, allowed: d.Allowed, rules: d.Rules})
					if !d.Time.Before(end) {
						done.Store(true)
					}
				}
				if _, ok := s.(*Redis); ok {
					time.Sleep(time.Duration(r.Int64N(int64(300 * time.Microsecond))))
				}
			}
			mu.Lock()
			events = append(events, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortStableFunc(events, func(a, b calendarEvent) int { return cmp.Compare(a.ns, b.ns) })
	return events
}

// replayCalendar checks the decisions against the reference model.
func replayCalendar(t *testing.T, tc calendarCase, shift time.Duration, rules []Rule, events []calendarEvent) {
	t.Helper()
	bounds := modelBounds(tc.starts, shift)
	boundary := tc.starts[1].Add(-shift).UnixMicro()
	if len(events) == 0 || events[0].at >= boundary || events[len(events)-1].at < boundary {
		t.Fatalf("%d events, not across the boundary", len(events))
	}
	bucket := ratemodel.NewBucket(modelRule(rules[0]), events[0].at)
	quota := ratemodel.NewFixed(rules[1].Limit, bounds)
	failures := 0
	fail := func(format string, args ...any) {
		t.Helper()
		if failures++; failures <= 5 {
			t.Errorf(format, args...)
		}
	}
	admitted := map[int64]int64{} // window start → units admitted
	granted, peak := map[int64]int64{}, map[int64]int64{}
	writes := 0
	for _, e := range events {
		ws, we := bounds(e.at)
		if e.grant != 0 {
			quota.Grant(e.at, e.grant)
			granted[ws] = max(0, granted[ws]+e.grant)
			peak[ws] = max(peak[ws], granted[ws])
			continue
		}
		rooms := []*big.Rat{bucket.Room(e.at, e.cost), quota.Room(e.at, e.cost)}
		tols := []*big.Rat{tolerance(bucket, e.at, writes), new(big.Rat)}
		for i, rr := range e.rules {
			switch {
			case rr.Allowed && rooms[i].Sign() < 0:
				fail("t=%dµs: %s admitted cost %d, the model has %s too few", e.at-boundary, rr.Rule.Name, e.cost, new(big.Rat).Neg(rooms[i]).FloatString(6))
			case !rr.Allowed && rooms[i].Cmp(tols[i]) >= 0:
				fail("t=%dµs: %s denied cost %d, the model admits it with room %s", e.at-boundary, rr.Rule.Name, e.cost, rooms[i].FloatString(6))
			}
		}
		q := e.rules[1]
		if !q.Allowed && q.RetryAfter != time.Duration(we-e.at)*time.Microsecond {
			fail("t=%dµs: quota RetryAfter %v, want %v, the time to the window's end", e.at-boundary, q.RetryAfter, time.Duration(we-e.at)*time.Microsecond)
		}
		if e.allowed {
			if q.ResetAfter != time.Duration(we-e.at)*time.Microsecond {
				fail("t=%dµs: quota ResetAfter %v, want %v, the time to the window's end", e.at-boundary, q.ResetAfter, time.Duration(we-e.at)*time.Microsecond)
			}
			if want := rules[1].Limit + granted[ws] - admitted[ws] - e.cost; q.Remaining != want {
				fail("t=%dµs: quota Remaining %d, want %d", e.at-boundary, q.Remaining, want)
			}
			bucket.Take(e.at, e.cost)
			quota.Take(e.at, e.cost)
			admitted[ws] += e.cost
			writes++
		}
	}
	// The verdicts held the windows to the quota and its grants; the full
	// quota came back after the boundary, and the callers asked for more.
	for _, s := range tc.starts[:2] {
		ws := s.Add(-shift).UnixMicro()
		if got, lo, hi := admitted[ws], rules[1].Limit, rules[1].Limit+peak[ws]; got < lo || got > hi {
			t.Errorf("window from %v admitted %d units, want the quota %d at least, and at most with its largest grant, %d", s, got, lo, hi)
		}
	}
	t.Logf("%d events; windows admitted %d and %d (granted %d and %d)", len(events),
		admitted[tc.starts[0].Add(-shift).UnixMicro()], admitted[boundary], granted[tc.starts[0].Add(-shift).UnixMicro()], granted[boundary])
}
