package bodyscan

import (
	"errors"
	"io"
	"mime"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// TestOverrideScanMemory: scanning a JSON body for _method holds no more
// than a few buffers, whatever the size of its values. Before, the
// decoder held each whole top-level value (a 32 MiB string: 32 MiB and a
// copy) for every request in flight.
func TestOverrideScanMemory(t *testing.T) {
	const size = 32 << 20
	body := io.MultiReader(strings.NewReader(`{"a":"`), io.LimitReader(repeatReader('x'), size), strings.NewReader(`","_method":"DELETE"}`))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := newBodyScanner(io.NopCloser(body), refuseField("_method", "DELETE", bodyParsers("application/json", OverrideParams)))
	n, err := io.Copy(io.Discard, s)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMethodOverride) {
		t.Fatalf("scanning %d bytes = %v, want ErrMethodOverride", n, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("scanning a %d MiB JSON value allocated %d KiB, want at most 4 MiB", size>>20, got>>10)
	}
}

// refuseField is a scan that refuses, as a method override, a body
// whose field name holds value.
func refuseField(name, value string, parsers []parser) func(io.Reader) error {
	return func(r io.Reader) error {
		var mu sync.Mutex
		var found bool
		err := parseEach(r, parsers, func(n, v string) {
			mu.Lock()
			defer mu.Unlock()
			found = found || n == name && v == value
		})
		if found {
			return ErrMethodOverride
		}
		return err
	}
}

// repeatReader reads as an endless run of one byte.
type repeatReader byte

func (c repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

// TestOverrideScanOneByteReads: the scanner passes a body through to a
// reader that asks for one byte at a time, as any io.Reader must. Before,
// a one-byte read returned nothing once a byte was held back, for ever.
func TestOverrideScanOneByteReads(t *testing.T) {
	body := "a=1&b=" + strings.Repeat("x", 100)
	s := newBodyScanner(io.NopCloser(strings.NewReader(body)), refuseField("_method", "DELETE", bodyParsers("application/x-www-form-urlencoded", OverrideParams)))
	var got []byte
	var err error
	for range 2 * len(body) { // bounded: a reader that makes no progress fails
		var one [1]byte
		var n int
		n, err = s.Read(one[:])
		got = append(got, one[:n]...)
		if err != nil {
			break
		}
	}
	if string(got) != body || err != io.EOF {
		t.Errorf("one-byte reads got %d bytes, %v; want the %d-byte body and EOF", len(got), err, len(body))
	}
}

// TestFormType: a Content-Type without parameters is read as a form
// exactly where mime.ParseMediaType fails or names a urlencoded form.
func TestFormType(t *testing.T) {
	for _, give := range []string{"", " ", "application/x-www-form-urlencoded", "Application/X-WWW-Form-Urlencoded ", "text/plain",
		"text", "text/", "/plain", "text/plain/x", "a b/c", "a/b,c", "té/x", "a/b\x00", "application/json", `a/"b"`, "a/b="} {
		mt, _, err := mime.ParseMediaType(give)
		if want := err != nil || mt == "application/x-www-form-urlencoded"; formType(give) != want {
			t.Errorf("formType(%q) = %v, want %v (mime: %q, %v)", give, !want, want, mt, err)
		}
	}
}

// TestDelimiters: a multipart body's delimiters are counted, and its part
// heads bounded, however the reads split them.
func TestDelimiters(t *testing.T) {
	const text = "--B\r\nx--B--B\r\n--B--"
	long := "--B\r\nX: " + strings.Repeat("h", maxPartHead) + "\r\n\r\n"
	fits := "--B\r\nX: " + strings.Repeat("h", maxPartHead-20) + "\r\n\r\n" + strings.Repeat("d", 2*maxPartHead) + "\r\n--B--\r\n"
	for _, size := range []int{1, 2, 3, 5, 7, 4096} {
		if _, err := io.Copy(io.Discard, newDelimiters(&chunks{s: long, size: size}, "B")); !errors.Is(err, errPartHead) {
			t.Errorf("reads of %d bytes: a %d-byte head read with %v, want errPartHead", size, len(long), err)
		}
		if _, err := io.Copy(io.Discard, newDelimiters(&chunks{s: fits, size: size}, "B")); err != nil {
			t.Errorf("reads of %d bytes: a head within the bound, then a long part: %v", size, err)
		}
	}
	for size := 1; size <= len(text); size++ {
		s := newDelimiters(&chunks{s: text, size: size}, "B")
		if _, err := io.Copy(io.Discard, s); err != nil || s.n != 4 {
			t.Errorf("reads of %d bytes: %d occurrences, %v; want 4", size, s.n, err)
		}
	}
}

// chunks reads s size bytes at a time.
type chunks struct {
	s    string
	size int
}

func (c *chunks) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.s)
	c.s = c.s[n:]
	return n, nil
}

// TestMultipartHeadMemory: reading a multipart part's head holds no more
// than maxPartHead of it. Before, Go's reader held up to 10 MiB of one
// head, once per boundary the Content-Type may name.
func TestMultipartHeadMemory(t *testing.T) {
	const size = 8 << 20
	body := io.MultiReader(strings.NewReader("--B\r\nContent-Disposition: form-data; name=\"a\"\r\nX: "),
		io.LimitReader(repeatReader('h'), size), strings.NewReader("\r\n\r\n1\r\n--B--\r\n"))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := parseEach(body, bodyParsers("multipart/form-data; boundary=B", OverrideParams), func(string, string) {})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) {
		t.Errorf("reading an %d MiB part head = %v, want ErrMalformed", size>>20, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("reading an %d MiB part head allocated %d KiB, want at most 4 MiB", size>>20, got>>10)
	}
}
