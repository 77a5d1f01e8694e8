package limiter

import (
	"context"
	"testing"
	"time"
)

// TestReplayMatchesMemory: a replay of checks at recorded times decides
// exactly as a Memory whose clock stood at those times, and Reset starts
// the next key afresh even when its times lie before the last key's.
func TestReplayMatchesMemory(t *testing.T) {
	rules := []Rule{
		{Name: "second", Limit: 3, Period: time.Second},
		{Name: "minute", Limit: 20, Period: time.Minute, Algorithm: SlidingWindow},
		{Name: "audit", Limit: 1, Period: time.Second, Shadow: true},
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := start
	mem := NewMemory(func() time.Time { return clock }, 0)
	rp := NewReplay(0)
	for _, key := range []string{"k:a", "k:b"} {
		rp.Reset()
		mem = NewMemory(func() time.Time { return clock }, 0)
		for i := range 200 {
			at := start.Add(time.Duration(i*i%97) * time.Millisecond * 37).Add(time.Duration(i) * 90 * time.Millisecond)
			if key == "k:b" {
				at = at.Add(-time.Hour) // earlier than every time of k:a
			}
			clock = at
			want, err := mem.Allow(context.Background(), key, rules, int64(1+i%2))
			if err != nil {
				t.Fatal(err)
			}
			got, err := rp.Allow(at, key, rules, int64(1+i%2))
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Binding != want.Binding || got.RetryAfter() != want.RetryAfter() {
				t.Fatalf("%s #%d: Allow = %+v, want %+v", key, i, got, want)
			}
		}
	}
	if _, err := rp.Allow(start, "", rules, 1); err == nil {
		t.Error("Allow with an empty key: want an error")
	}
}

// BenchmarkReplay measures one replayed check of two rules, a new key
// every 1,000 checks.
func BenchmarkReplay(b *testing.B) {
	rules := []Rule{{Name: "second", Limit: 10, Period: time.Second}, {Name: "hour", Limit: 1000, Period: time.Hour}}
	rp := NewReplay(0)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%1000 == 0 {
			rp.Reset()
		}
		i++
		at = at.Add(50 * time.Millisecond)
		if _, err := rp.Allow(at, "k:bench", rules, 1); err != nil {
			b.Fatal(err)
		}
	}
}
