package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

type leaser interface {
	allower
	Renew(ctx context.Context, key string, rules []Rule) (Decision, error)
	Release(ctx context.Context, key string, rules []Rule) (Decision, error)
}

// inFlightStores are the stores under the in-flight tests, with a way to
// let time pass (the fake clock, or Redis' own).
func inFlightStores() map[string]func(t *testing.T) (leaser, func(time.Duration)) {
	return map[string]func(t *testing.T) (leaser, func(time.Duration)){
		"memory": func(t *testing.T) (leaser, func(time.Duration)) {
			c := newFakeClock()
			return NewMemory(c.Now, 0), c.Add
		},
		"redis": func(t *testing.T) (leaser, func(time.Duration)) {
			return mustLimiter(t, mustRedis(t), Config{}), time.Sleep
		},
		"redis-cluster": func(t *testing.T) (leaser, func(time.Duration)) {
			return mustLimiter(t, mustCluster(t), Config{}), time.Sleep
		},
	}
}

func lease(r Rule, id uint64) []Rule {
	r.Lease = id
	return []Rule{r}
}

// TestInFlight: an in-flight rule admits at most its limit of leases at
// once, whatever a request costs; a denial says when to come back (a
// second at most) and is not cached; a renewal is admitted at the limit;
// a release frees its slot at once.
func TestInFlight(t *testing.T) {
	ctx := context.Background()
	rule := Rule{Name: "inflight", Limit: 2, Period: time.Hour, Algorithm: InFlight}
	for name, mk := range inFlightStores() {
		t.Run(name, func(t *testing.T) {
			s, _ := mk(t)
			key := uniqueKey(t)
			take := func(id uint64, cost int64) Decision {
				t.Helper()
				d, err := s.Allow(ctx, key, lease(rule, id), cost)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			if d := take(1, 10); !d.Allowed || d.Rules[0].Remaining != 1 {
				t.Fatalf("first of 2 (cost 10: one slot all the same): %+v", d)
			}
			if d := take(2, 1); !d.Allowed || d.Rules[0].Remaining != 0 {
				t.Fatalf("second of 2: %+v", d)
			}
			for range 2 { // the second time the deny cache would answer
				d := take(3, 1)
				if d.Allowed || d.Cached || d.RetryAfter() <= 0 || d.RetryAfter() > time.Second {
					t.Fatalf("third of 2: %+v, want denied by the store, retry within a second", d)
				}
			}
			if d, err := s.Renew(ctx, key, lease(rule, 1)); err != nil || !d.Allowed {
				t.Fatalf("renew a held lease at the limit: %+v, %v", d, err)
			}
			if d, err := s.Release(ctx, key, lease(rule, 1)); err != nil || !d.Allowed || d.Rules[0].Remaining != 1 {
				t.Fatalf("release: %+v, %v", d, err)
			}
			if d := take(3, 1); !d.Allowed {
				t.Fatalf("after a release: %+v", d)
			}
			// Releasing twice frees nothing more.
			for range 2 {
				if _, err := s.Release(ctx, key, lease(rule, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if d := take(4, 1); d.Allowed {
				t.Fatalf("a lease released twice freed two slots: %+v", d)
			}
		})
	}
}

// TestInFlightLeaseReclaimed: a lease its holder stops renewing (the
// gateway died) is reclaimed once its period has passed; one renewed is
// not (the memory store's clock shows it is not reclaimed earlier: see
// TestInFlightReclaimedOnTime).
func TestInFlightLeaseReclaimed(t *testing.T) {
	ctx := context.Background()
	// A lease of 3s renewed every 100ms: only a stall of seconds between
	// two renewals would let it lapse.
	rule := Rule{Name: "inflight", Limit: 1, Period: 3 * time.Second, Algorithm: InFlight}
	for name, mk := range inFlightStores() {
		t.Run(name, func(t *testing.T) {
			s, wait := mk(t)
			key := uniqueKey(t)
			if d, err := s.Allow(ctx, key, lease(rule, 1), 1); err != nil || !d.Allowed {
				t.Fatalf("take: %+v, %v", d, err)
			}
			// Renewed every 100ms for 600ms: held throughout.
			for range 6 {
				wait(100 * time.Millisecond)
				if d, err := s.Renew(ctx, key, lease(rule, 1)); err != nil || !d.Allowed {
					t.Fatalf("renew: %+v, %v", d, err)
				}
				if d, err := s.Allow(ctx, key, lease(rule, 2), 1); err != nil || d.Allowed {
					t.Fatalf("another lease while one is renewed: %+v, %v", d, err)
				}
			}
			// Then no more renewals: reclaimed once its period has passed.
			for waited := time.Duration(0); ; waited += 50 * time.Millisecond {
				d, err := s.Allow(ctx, key, lease(rule, 2), 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					break
				}
				if waited > 10*rule.Period {
					t.Fatalf("a lease not renewed for %v was not reclaimed: %+v", waited, d)
				}
				wait(50 * time.Millisecond)
			}
		})
	}
}

// TestInFlightAllOrNothing: a check that another rule denies takes no
// slot, and one the in-flight rule denies charges no other rule.
func TestInFlightAllOrNothing(t *testing.T) {
	ctx := context.Background()
	inflight := Rule{Name: "inflight", Limit: 1, Period: time.Hour, Algorithm: InFlight}
	bucket := Rule{Name: "minute", Limit: 2, Period: time.Hour}
	for name, mk := range inFlightStores() {
		t.Run(name, func(t *testing.T) {
			s, _ := mk(t)
			key := uniqueKey(t)
			check := func(id uint64, cost int64) Decision {
				t.Helper()
				in := inflight
				in.Lease = id
				d, err := s.Allow(ctx, key, []Rule{bucket, in}, cost)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			if d := check(1, 5); d.Allowed {
				t.Fatalf("cost 5 of a bucket of 2: %+v", d)
			}
			if d := check(2, 1); !d.Allowed {
				t.Fatalf("the bucket's denial took the slot: %+v", d)
			}
			if d := check(3, 1); d.Allowed || d.Rules[0].Remaining != 1 {
				t.Fatalf("the in-flight denial charged the bucket: %+v", d)
			}
		})
	}
}

// TestInFlightRefusesBadInput: a check without a lease, and a renewal
// of another kind of rule, are the caller's mistakes.
func TestInFlightRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	inflight := Rule{Name: "inflight", Limit: 1, Period: time.Hour, Algorithm: InFlight}
	for name, mk := range inFlightStores() {
		s, _ := mk(t)
		if _, err := s.Allow(ctx, "k", []Rule{inflight}, 1); !errors.Is(err, ErrInput) {
			t.Errorf("%s: a check without a lease: %v", name, err)
		}
		if _, err := s.Renew(ctx, "k", []Rule{{Name: "m", Limit: 1, Period: time.Minute}}); !errors.Is(err, ErrInput) {
			t.Errorf("%s: a renewal of a token bucket: %v", name, err)
		}
		if err := (Rule{Name: "x", Limit: MaxInFlight + 1, Period: time.Second, Algorithm: InFlight}).Validate(); err == nil {
			t.Errorf("an in-flight limit above %d was accepted", MaxInFlight)
		}
	}
}

// TestInFlightReclaimedOnTime: on the memory store's clock, a lease is
// held for exactly its period after its last renewal.
func TestInFlightReclaimedOnTime(t *testing.T) {
	ctx := context.Background()
	c := newFakeClock()
	s := NewMemory(c.Now, 0)
	rule := Rule{Name: "inflight", Limit: 1, Period: 3 * time.Second, Algorithm: InFlight}
	if d, _ := s.Allow(ctx, "k", lease(rule, 1), 1); !d.Allowed {
		t.Fatal("take")
	}
	c.Add(2 * time.Second)
	if d, _ := s.Renew(ctx, "k", lease(rule, 1)); !d.Allowed {
		t.Fatal("renew")
	}
	c.Add(3*time.Second - time.Microsecond)
	if d, _ := s.Allow(ctx, "k", lease(rule, 2), 1); d.Allowed {
		t.Fatal("reclaimed before its period after the renewal")
	}
	c.Add(time.Microsecond)
	if d, _ := s.Allow(ctx, "k", lease(rule, 2), 1); !d.Allowed {
		t.Fatal("not reclaimed at its period after the renewal")
	}
}

// TestInFlightUnderASplit: a split's shares of an in-flight rule hold
// their slots with the key's whole: the gateways together never hold more
// than the rule's, a share that gets no unit holds one slot for a lease
// (not for ever), and releases free both.
func TestInFlightUnderASplit(t *testing.T) {
	ctx := context.Background()
	rule := Rule{Name: "inflight", Limit: 4, Period: time.Minute, Algorithm: InFlight}
	for name, mk := range inFlightStores() {
		t.Run(name, func(t *testing.T) {
			s, _ := mk(t)
			key := uniqueKey(t)
			d := splitOf(key, map[string]float64{"a": 0.5, "b": 0.5})
			type held struct {
				key   string
				rules []Rule
			}
			var holds []held
			var id uint64
			take := func(gw string) bool {
				k, rules, ok := d.Split(key, gw, []Rule{rule}, time.Now())
				if !ok {
					t.Fatal("no split")
				}
				id++
				rules[0].Lease = id
				dec, err := s.Allow(ctx, k, rules, 1)
				if err != nil {
					t.Fatal(err)
				}
				if dec.Allowed {
					holds = append(holds, held{k, rules})
				}
				return dec.Allowed
			}
			n := 0
			for range 5 {
				for _, gw := range []string{"a", "b", "c"} {
					if take(gw) {
						n++
					}
				}
			}
			if n != 4 {
				t.Fatalf("the split's gateways held %d slots of the rule's 4", n)
			}
			if k, rules, _ := d.Split(key, "c", []Rule{rule}, time.Now()); rules[0].Period != rule.Period {
				t.Errorf("a gateway the split does not name holds its slot for %v (key %s), want the lease %v", rules[0].Period, k, rule.Period)
			}
			for _, h := range holds {
				if _, err := s.Release(ctx, h.key, h.rules); err != nil {
					t.Fatal(err)
				}
			}
			if !take("a") || !take("b") {
				t.Fatal("after the releases, the shares' slots did not come back")
			}
		})
	}
}
