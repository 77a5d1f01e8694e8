package event

import (
	"bytes"
	"regexp"
	"testing"
	"time"
)

func TestNewIDOrderedAndUnique(t *testing.T) {
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	seen := make(map[[16]byte]bool, 100_000)
	var prev [16]byte
	for i := range 100_000 {
		now := start.Add(time.Duration(i/10) * time.Millisecond) // 10 ids per ms
		id := NewID(now)
		if seen[id] {
			t.Fatalf("NewID produced duplicate %x at i=%d", id, i)
		}
		seen[id] = true
		if i%10 == 0 && i > 0 && bytes.Compare(prev[:], id[:]) >= 0 {
			t.Fatalf("NewID(%v) = %x, not after previous millisecond's %x", now, id, prev)
		}
		prev = id
		if got := IDTime(id); !got.Equal(now) {
			t.Fatalf("IDTime(NewID(%v)) = %v", now, got)
		}
		if id[6]>>4 != 7 || id[8]>>6 != 2 {
			t.Fatalf("NewID = %x: version %d variant %b, want 7 and 10", id, id[6]>>4, id[8]>>6)
		}
	}
}

func TestFormatID(t *testing.T) {
	id := [16]byte{0x01, 0x93, 0x2c, 0x4e, 0x5a, 0x00, 0x70, 0x01, 0x80, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}
	if got, want := FormatID(id), "01932c4e-5a00-7001-8002-030405060708"; got != want {
		t.Errorf("FormatID(%x) = %q, want %q", id, got, want)
	}
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if s := FormatID(NewID(time.Now())); !re.MatchString(s) {
		t.Errorf("FormatID(NewID) = %q, not a UUIDv7", s)
	}
}
