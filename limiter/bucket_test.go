package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBucketCountsApart: rules of one name in different buckets keep
// states of their own, in Redis and in memory; one bucket twice in a check
// is refused like a duplicate name.
func TestBucketCountsApart(t *testing.T) {
	stores := map[string]allower{
		"memory": NewMemory(time.Now, 0),
		"redis":  mustLimiter(t, mustRedis(t), Config{Prefix: "buckettest"}),
	}
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			key := uniqueKey(t)
			a := Rule{Name: "shown", Limit: 1, Period: time.Hour, Bucket: "a"}
			b := a
			b.Bucket = "b"
			ctx := context.Background()
			for _, tc := range []struct {
				give  []Rule
				allow bool
			}{
				{[]Rule{a}, true},
				{[]Rule{a}, false},
				{[]Rule{b}, true},     // b counts apart from a
				{[]Rule{a, b}, false}, // both spent
				{[]Rule{{Name: "shown", Limit: 1, Period: time.Hour}}, true}, // no bucket: the name's own
			} {
				d, err := s.Allow(ctx, key, tc.give, 1)
				if err != nil {
					t.Fatalf("Allow(%+v): %v", tc.give, err)
				}
				if d.Allowed != tc.allow {
					t.Errorf("Allow(%+v) = %v, want %v", tc.give, d.Allowed, tc.allow)
				}
			}
			if _, err := s.Allow(ctx, key, []Rule{a, {Name: "other", Limit: 1, Period: time.Hour, Bucket: "a"}}, 1); !errors.Is(err, ErrInput) {
				t.Errorf("one bucket twice: %v, want ErrInput", err)
			}
			if _, err := s.Allow(ctx, key, []Rule{{Name: "x", Limit: 1, Period: time.Hour, Bucket: "has}brace"}}, 1); !errors.Is(err, ErrInvalidRule) {
				t.Errorf("bucket with a brace: %v, want ErrInvalidRule", err)
			}
		})
	}
}
