package event

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// golden is the fixture behind testdata/decision_v2.hex. Changing what it
// encodes to breaks every consumer in the field: add fields, never renumber.
func golden() Decision {
	return Decision{
		ID:            [16]byte{0x01, 0x93, 0x2c, 0x4e, 0x5a, 0x00, 0x70, 0x01, 0x80, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08},
		Time:          time.Date(2024, 11, 20, 10, 30, 15, 123456789, time.UTC),
		GatewayID:     "gw-eu-1",
		KeyID:         "k_9f86d081884c7d65",
		KeyKind:       KindAPIKey,
		ClientIP:      "203.0.113.7",
		UserAgentHash: 0xdeadbeefcafef00d,
		Route:         "/v1/orders/:id",
		Method:        "GET",
		Plan:          "pro",
		BindingRule:   "per_minute",
		Allowed:       false,
		Limit:         100,
		Remaining:     0,
		Cost:          3,
		StoreStatus:   StoreTimeout,
		Mode:          ModeFailClosed,
		CheckLatency:  1500 * time.Microsecond,
	}
}

func TestGolden(t *testing.T) {
	tests := []struct {
		name string
		give Decision
		file string
	}{
		{name: "full", give: golden(), file: "decision_v2.hex"},
		{name: "zero", give: Decision{}, file: "decision_v2_zero.hex"},
		{name: "negative", give: Decision{Time: time.Unix(-1, 0).UTC(), Limit: -1, Remaining: -5, Cost: -1, CheckLatency: -1, Allowed: true, Mode: ModeShadow}, file: "decision_v2_negative.hex"},
		{name: "epoch", give: Decision{Time: time.Unix(0, 0).UTC(), StoreStatus: StoreOK, Mode: ModeEnforced}, file: "decision_v2_epoch.hex"},
		// golden() predates key_name (19): its file is what such a writer
		// sent, and it still reads, with no name.
		{name: "key name", give: withKeyName(golden(), "acme"), file: "decision_v2_key_name.hex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Encode(tt.give)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			path := filepath.Join("testdata", tt.file)
			if *update {
				if err := os.WriteFile(path, []byte(hex.EncodeToString(got)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test -update once to create it): %v", err)
			}
			want, err := hex.DecodeString(strings.TrimSpace(string(raw)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Encode(%s) =\n%x\nwant\n%x", tt.name, got, want)
			}
			wantDecode(t, want, tt.give, "golden "+tt.name)
		})
	}
}

func withKeyName(d Decision, name string) Decision {
	d.KeyName = name
	return d
}

// wantDecode decodes b, what it is called in failures, and wants want.
func wantDecode(t testing.TB, b []byte, want Decision, what string) {
	t.Helper()
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode(%s): %v", what, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Decode(%s) mismatch (-want +got):\n%s", what, diff)
	}
}

func TestGoldenFirstBytes(t *testing.T) {
	// The id field leads every record; pin its first bytes and one whole
	// field (check_latency_ns, 18, sint64 1.5ms) by hand so the golden file
	// cannot silently drift with the encoder.
	b, err := Encode(golden())
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x0a, 16, 0x01, 0x93}
	if latency := []byte{0x90, 0x01, 0xc0, 0x8d, 0xb7, 0x01}; !bytes.Contains(b, latency) {
		t.Errorf("Encode(golden) = % x, want check_latency_ns written as % x", b, latency)
	}
	if !bytes.HasPrefix(b, want) {
		t.Errorf("Encode(golden) starts % x, want % x", b[:len(want)], want)
	}
	if len(b) > 160 {
		t.Errorf("len(Encode(golden)) = %d, want a compact record (<= 160 bytes)", len(b))
	}
	// key_name (19, bytes): tag 0x9a 0x01, length, the name; nothing else
	// changes.
	named, err := Encode(withKeyName(golden(), "acme"))
	if err != nil {
		t.Fatal(err)
	}
	if field := []byte{0x9a, 0x01, 4, 'a', 'c', 'm', 'e'}; !bytes.Contains(named, field) || len(named) != len(b)+len(field) {
		t.Errorf("Encode(golden with key name) = % x, want Encode(golden) and key_name written as % x", named, field)
	}
}

func TestDecodeErrors(t *testing.T) {
	md := mustDecisionDescriptor(t)
	valid, err := Encode(golden())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		give []byte
		want error
	}{
		{name: "version 1 record", give: append([]byte{1}, valid...), want: ErrMalformed},
		{name: "truncated", give: valid[:len(valid)-1], want: ErrMalformed},
		{name: "truncated in id", give: valid[:10], want: ErrMalformed},
		{name: "bad varint", give: []byte{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, want: ErrMalformed},
		{name: "short id", give: []byte{0x0a, 2, 1, 2}, want: ErrMalformed},
		{name: "wrong wire type", give: []byte{0x18, 1}, want: ErrMalformed},
		{name: "field zero", give: []byte{0x00, 1}, want: ErrMalformed},
		{name: "unterminated group", give: []byte{0xa3, 0x01}, want: ErrMalformed},
		{name: "stray end group", give: []byte{0xa4, 0x01}, want: ErrMalformed},
		{name: "mode 300", give: []byte{0x88, 0x01, 0xac, 0x02}, want: ErrMalformed},
		{name: "negative enum", give: []byte{0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, want: ErrMalformed},
		{name: "long string", give: append([]byte{0x1a, 0x81, 0x08}, bytes.Repeat([]byte("a"), 1025)...), want: ErrMalformed},
		// proto3 strings are UTF-8: a standard decoder refuses these too.
		{name: "invalid utf-8", give: []byte{0x42, 3, '/', 0xff, 'a'}, want: ErrNotUTF8},
		{name: "lone surrogate", give: []byte{0x4a, 3, 0xed, 0xa0, 0x80}, want: ErrNotUTF8},
		{name: "invalid utf-8 in a descriptor", give: []byte{0xaa, 0x01, 4, 0x12, 2, 0xc3, 0x28}, want: ErrNotUTF8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.give)
			if !errors.Is(err, tt.want) || !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode(%x) error = %v, want %v and %v", tt.give, err, tt.want, ErrMalformed)
			}
			// A standard decoder of decision.proto refuses it too.
			if err := proto.Unmarshal(tt.give, dynamicpb.NewMessage(md)); err == nil && tt.want == ErrNotUTF8 {
				t.Errorf("decision.proto reads %x, which Decode refuses", tt.give)
			}
		})
	}
}

func TestDecodeLenient(t *testing.T) {
	tests := []struct {
		name string
		give []byte
		want Decision
	}{
		{name: "empty", give: nil, want: Decision{}},
		// Any non-zero varint is true to every protobuf decoder.
		{name: "allowed 2", give: []byte{0x60, 2}, want: Decision{Allowed: true}},
		// A field repeated: the last one wins, as in protobuf.
		{name: "repeated field", give: []byte{0x4a, 1, 'a', 0x4a, 1, 'b'}, want: Decision{Method: "b"}},
		// Zero written explicitly reads as zero.
		{name: "explicit zero", give: []byte{0x68, 0, 0x88, 0x01, 0}, want: Decision{}},
		// A newer writer's enum value survives as a number.
		{name: "new mode", give: []byte{0x88, 0x01, 9}, want: Decision{Mode: 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode(tt.give)
			if err != nil {
				t.Fatalf("Decode(%x): %v", tt.give, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decode(%x) mismatch (-want +got):\n%s", tt.give, diff)
			}
		})
	}
}

func TestCheckVersion(t *testing.T) {
	tests := []struct {
		name string
		give []byte
		ok   bool
	}{
		{name: "this version", give: HeaderValue(), ok: true},
		{name: "missing", give: nil},
		{name: "empty", give: []byte{}},
		{name: "version 1", give: []byte("1")},
		{name: "version 3", give: []byte("3")},
		{name: "padded", give: []byte(" 2")},
		{name: "binary 2", give: []byte{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckVersion(tt.give)
			if tt.ok && err != nil {
				t.Errorf("CheckVersion(%q) = %v, want nil", tt.give, err)
			}
			if !tt.ok && !errors.Is(err, ErrUnknownVersion) {
				t.Errorf("CheckVersion(%q) = %v, want %v", tt.give, err, ErrUnknownVersion)
			}
		})
	}
	if got := string(HeaderValue()); got != "2" {
		t.Errorf("HeaderValue() = %q, want \"2\"", got)
	}
}

func TestDecodeSkipsUnknownFields(t *testing.T) {
	b, err := Encode(golden())
	if err != nil {
		t.Fatal(err)
	}
	// Field 99 as varint, fixed64, bytes, fixed32 and group: a newer
	// writer's additions within this version.
	b = append(b, 0x98, 0x06, 0x05)
	b = append(b, 0x99, 0x06, 1, 2, 3, 4, 5, 6, 7, 8)
	b = append(b, 0x9a, 0x06, 2, 'h', 'i')
	b = append(b, 0x9d, 0x06, 1, 2, 3, 4)
	b = append(b, 0x9b, 0x06, 0x08, 1, 0x9c, 0x06)
	wantDecode(t, b, golden(), "with unknown fields")
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name string
		give Decision
		want error
	}{
		{name: "long route", give: Decision{Route: strings.Repeat("r", MaxFieldLen+1)}, want: ErrFieldTooLong},
		{name: "long key", give: Decision{KeyID: strings.Repeat("k", MaxFieldLen+1)}, want: ErrFieldTooLong},
		{name: "long key name", give: Decision{KeyName: strings.Repeat("k", MaxFieldLen+1)}, want: ErrFieldTooLong},
		{name: "long descriptor value", give: Decision{Descriptor: []DescriptorEntry{{Key: "k", Value: strings.Repeat("v", MaxFieldLen+1)}}}, want: ErrFieldTooLong},
		{name: "too many descriptor entries", give: Decision{Descriptor: make([]DescriptorEntry, MaxDescriptorEntries+1)}, want: ErrFieldTooLong},
		{name: "long admin actor", give: Decision{Admin: AdminAction{Action: "reset", Actor: strings.Repeat("a", MaxFieldLen+1)}}, want: ErrFieldTooLong},
		{name: "invalid utf-8 route", give: Decision{Route: "/a\xff"}, want: ErrNotUTF8},
		{name: "invalid utf-8 descriptor key", give: Decision{Descriptor: []DescriptorEntry{{Key: "k\xc3", Value: "v"}}}, want: ErrNotUTF8},
		{name: "year 3000", give: Decision{Time: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}, want: ErrTimeRange},
		{name: "year 1000", give: Decision{Time: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)}, want: ErrTimeRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("prefix")
			got, err := AppendEncode(dst, tt.give)
			if !errors.Is(err, tt.want) {
				t.Errorf("Encode(%s) error = %v, want %v", tt.name, err, tt.want)
			}
			if string(got) != "prefix" {
				t.Errorf("AppendEncode on error returned %q, want dst unchanged", got)
			}
		})
	}
	// The longest allowed field still encodes.
	if _, err := Encode(Decision{Route: strings.Repeat("r", MaxFieldLen)}); err != nil {
		t.Errorf("Encode(route of MaxFieldLen) = %v, want nil", err)
	}
}

func TestRoundTrip(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 200 {
		d := golden()
		d.ID = NewID(now.Add(time.Duration(i) * time.Millisecond))
		d.Time = now.Add(time.Duration(i) * time.Nanosecond)
		d.Allowed = i%2 == 0
		d.Remaining = int64(i - 100)
		d.KeyKind = KeyKind(i % len(keyKindNames))
		d.Mode = Mode(i % len(modeNames))
		d.StoreStatus = StoreStatus(i % len(storeStatusNames))
		if d.KeyKind == KindAPIKey {
			d.KeyName = fmt.Sprintf("customer-%d", i)
		}
		b, err := Encode(d)
		if err != nil {
			t.Fatal(err)
		}
		wantDecode(t, b, d, fmt.Sprintf("Encode(%+v)", d))
	}
}

// FuzzDecode checks Decode never panics and that whatever it accepts
// survives a round trip through Encode.
func FuzzDecode(f *testing.F) {
	for _, d := range []Decision{golden(), {}, {Allowed: true, Limit: -1}} {
		b, err := Encode(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x9b, 0x06, 0x08, 1, 0x9c, 0x06})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode(%x) error %v does not wrap ErrMalformed", b, err)
			}
			return
		}
		again, err := Encode(d)
		if err != nil {
			t.Fatalf("Encode(Decode(%x)) = %v", b, err)
		}
		wantDecode(t, again, d, fmt.Sprintf("Encode(Decode(%x))", b))
	})
}

func BenchmarkEncode(b *testing.B) {
	d := golden()
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = AppendEncode(buf[:0], d)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkDecode(b *testing.B) {
	enc, err := Encode(golden())
	if err != nil {
		b.Fatal(err)
	}
	var d Decision
	b.ReportAllocs()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if err := DecodeInto(&d, enc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewID(b *testing.B) {
	now := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = NewID(now)
		}
	})
}

// TestDecodeDescriptorBounds: a record cannot carry more descriptor entries
// than a gateway writes, and an entry's own unknown fields are skipped.
func TestDecodeDescriptorBounds(t *testing.T) {
	most := Decision{Domain: "d", Descriptor: make([]DescriptorEntry, MaxDescriptorEntries)}
	b, err := Encode(most)
	if err != nil {
		t.Fatal(err)
	}
	wantDecode(t, b, most, "MaxDescriptorEntries entries")
	over := append(b, 0xaa, 0x01, 0) // one more, empty
	if _, err := Decode(over); !errors.Is(err, ErrMalformed) {
		t.Errorf("Decode(%d entries) = %v, want %v", MaxDescriptorEntries+1, err, ErrMalformed)
	}
	// Entry {key: "k", 9: 1, value: "v"}: field 9 is a newer writer's.
	entry := []byte{0xaa, 0x01, 8, 0x0a, 1, 'k', 0x48, 1, 0x12, 1, 'v'}
	wantDecode(t, entry, Decision{Descriptor: []DescriptorEntry{{Key: "k", Value: "v"}}}, "entry with an unknown field")
	if _, err := Decode([]byte{0xaa, 0x01, 3, 0x0a, 5, 'k'}); !errors.Is(err, ErrMalformed) {
		t.Errorf("Decode(truncated entry) = %v, want %v", err, ErrMalformed)
	}
}
