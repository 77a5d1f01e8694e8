package bodyscan

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// checkCharset refuses a body the gateway reads whose Content-Type names
// a charset other than an ASCII superset: Tomcat, Jetty, ASP.NET Core and
// Django decode a form's bytes (escapes decoded first) in its charset, so
// "%00_%00m%00e%00t%00h%00o%00d" with charset=utf-16be, or "+AF8-method"
// in utf-7, is _method there and no name here. Every charset= in the
// type is read, the way lenient parsers find one in a malformed type.
func checkCharset(contentType string) error {
	lower := strings.ToLower(contentType)
	for {
		i := strings.Index(lower, "charset")
		if i < 0 {
			return nil
		}
		lower = strings.TrimLeft(lower[i+len("charset"):], " \t")
		v, ok := strings.CutPrefix(lower, "=")
		if !ok {
			continue
		}
		v = strings.TrimLeft(v, " \t\"'")
		if end := strings.IndexAny(v, ";, \t\"'"); end >= 0 {
			v = v[:end]
		}
		if !asciiSuperset(v) {
			return &Refusal{"unsupported_charset", http.StatusUnsupportedMediaType,
				fmt.Sprintf("The body's charset %q is not one this gateway reads a form or JSON in, and it must read this body; send UTF-8.", v)}
		}
	}
}

// asciiSupersets are the charsets (lower-case, without '-', '_' or
// spaces; a prefix ending in '*') in which each ASCII character is its
// own byte and no other bytes decode to one.
var asciiSupersets = []string{"utf8", "usascii", "ascii", "iso8859*", "latin*", "l1", "windows125*", "cp125*", "koi8*",
	"gbk", "gb2312", "gb18030", "big5*", "eucjp", "euckr", "euccn", "shiftjis", "sjis", "windows31j", "cp932", "ms932", "tis620", "iso646us"}

func asciiSuperset(charset string) bool {
	name := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == ' ' {
			return -1
		}
		return r
	}, charset)
	if name == "" {
		return true // charset= without a value: none
	}
	for _, c := range asciiSupersets {
		if p, ok := strings.CutSuffix(c, "*"); ok && strings.HasPrefix(name, p) || c == name {
			return true
		}
	}
	return false
}

// maxCodings bounds the content codings a body may stack: each costs a
// decoder's memory, and no client applies more than two.
const maxCodings = 4

// maxZstdWindow is the largest zstd window decoded: RFC 9659 §3 has
// encoders stay within 8 MB for HTTP, and decoders may refuse more.
const maxZstdWindow = 8 << 20

// maxBrotliWindowBits is the largest brotli window (4 MiB) decoded: the
// default of the reference encoder's library, Node's zlib and the Go
// encoders. A stream's header names a window of up to 16 MiB, which the
// decoder allocates as soon as a meta-block claims that length.
const maxBrotliWindowBits = 22

// decoder reads a body decoded as its Content-Encoding fields say (the
// codings in the order applied, so undone last first), up to bound decoded
// bytes: Express's body-parser inflates gzip, deflate (a zlib stream) and
// br; ASP.NET Core's decompression middleware gzip, br and deflate (a raw
// one, so both readings of deflate are tried); others inflate zstd. A
// coding not among these is a 415 where the body must be read: passed on
// unread, it would reach an upstream that decodes it unseen.
func decoder(fields []string, bound int64) (func(r io.Reader, read func(io.Reader) error) error, error) {
	var codings []string
	for _, v := range fields {
		for _, c := range strings.Split(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			switch c {
			case "", "identity":
			case "gzip", "x-gzip", "deflate", "br", "zstd":
				codings = append(codings, c)
			default:
				return nil, unsupportedEncoding(fmt.Sprintf("The body's Content-Encoding %q is not one this gateway decodes (gzip, deflate, br, zstd), and it must read this body.", c))
			}
		}
	}
	if len(codings) > maxCodings {
		return nil, unsupportedEncoding(fmt.Sprintf("The body stacks %d content codings; this gateway decodes at most %d.", len(codings), maxCodings))
	}
	if len(codings) == 0 {
		return func(r io.Reader, read func(io.Reader) error) error { return read(r) }, nil
	}
	return func(r io.Reader, read func(io.Reader) error) error {
		return decodeAll(r, codings, func(d io.Reader) error {
			return readToEnd(&limitReader{r: d, n: bound}, read, bound)
		}, bound)
	}, nil
}

// errWindow: a brotli or zstd stream needs a larger window (memory)
// than the gateway gives one request.
var errWindow = unsupportedEncoding(fmt.Sprintf("The body's brotli or zstd window is larger than this gateway decodes (%d MiB brotli, %d MiB zstd).",
	1<<maxBrotliWindowBits>>20, maxZstdWindow>>20))

// decodeAll undoes codings on r, the last applied first, and hands the
// decoded stream to read. Every decoder must read to its end cleanly: a
// stream corrupt or cut short is ErrMalformed.
func decodeAll(r io.Reader, codings []string, read func(io.Reader) error, bound int64) error {
	if len(codings) == 0 {
		return read(r)
	}
	rest := codings[:len(codings)-1]
	// Every layer is bounded, not just the last: a coding can spend
	// input on no output (empty deflate blocks), so an outer layer's
	// bomb could feed an inner one gigabytes that inflate to nothing.
	next := func(d io.Reader) error { return decodeAll(&limitReader{r: d, n: bound}, rest, read, bound) }
	switch codings[len(codings)-1] {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return ErrMalformed
		}
		return next(zr)
	case "deflate":
		zlibbed := func(r io.Reader) error {
			zr, err := zlib.NewReader(r)
			if err != nil {
				return ErrMalformed
			}
			return next(zr)
		}
		raw := func(r io.Reader) error { return next(flate.NewReader(r)) }
		// The upstream reads one of the two; the one that is not this
		// body's coding fails at once. Refused only if neither reads.
		errs := fanOut(r, []func(io.Reader) error{zlibbed, raw})
		if errs[0] == nil || errs[1] == nil {
			return nil
		}
		if errors.Is(errs[0], ErrTooLarge) || errors.Is(errs[1], ErrTooLarge) {
			return ErrTooLarge
		}
		return ErrMalformed
	case "br":
		br := bufio.NewReader(r)
		if b, err := br.Peek(1); err == nil && brotliWindowBits(b[0]) > maxBrotliWindowBits {
			return errWindow
		}
		return next(brotli.NewReader(br))
	default: // zstd
		zr, err := zstd.NewReader(r,
			// Decode in this goroutine, in memory that grows as needed:
			// the defaults start a goroutine per CPU and a 64 MiB window.
			zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			// A frame that says it holds more than bound fails at once
			// (ErrDecoderSizeExceeded), before its window is allocated.
			zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(uint64(bound)+1))
		if err != nil {
			return ErrMalformed
		}
		defer zr.Close()
		return next(zr)
	}
}

// brotliWindowBits is the window (its log2) a brotli stream's first byte
// names (RFC 7932 §9.1); 31 for the large-window extension.
func brotliWindowBits(b byte) int {
	switch {
	case b&1 == 0:
		return 16
	case b>>1&7 != 0:
		return 17 + int(b>>1&7)
	case b>>4&7 == 1:
		return 31
	case b>>4&7 != 0:
		return 8 + int(b>>4&7)
	}
	return 17
}

// readToEnd hands the decoded stream r to read and then reads what read
// left, so that a decoder's error at the very end (a bad checksum, a
// stream cut short, data past its end) is seen whatever read stopped at:
// parsers take any error for the end of the body. bound is r's.
func readToEnd(r *limitReader, read func(io.Reader) error, bound int64) error {
	s := &stickyReader{r: r}
	err := read(s)
	if _, cerr := io.Copy(io.Discard, s); cerr != nil || s.err != nil {
		switch {
		case errors.Is(s.err, ErrTooLarge) || errors.Is(s.err, zstd.ErrDecoderSizeExceeded):
			return ErrTooLarge
		case errors.Is(s.err, zstd.ErrWindowSizeExceeded) && bound < maxZstdWindow:
			return ErrTooLarge // the decoder caps the window at bound: it would hold more
		case errors.Is(s.err, zstd.ErrWindowSizeExceeded):
			return errWindow
		}
		return ErrMalformed
	}
	return err
}

// stickyReader remembers the first error but io.EOF its reader returned.
type stickyReader struct {
	r   io.Reader
	err error
}

func (s *stickyReader) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// limitReader reads at most n bytes from r, and fails with
// ErrTooLarge when r holds more: a body cut at the bound would
// hide from the scan what the upstream inflates past it.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, ErrTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	if l.n -= int64(n); l.n < 0 {
		return n + int(l.n), ErrTooLarge
	}
	return n, err
}
