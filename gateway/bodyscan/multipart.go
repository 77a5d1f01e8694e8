package bodyscan

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/textproto"
	"slices"
	"strings"
)

// errNoParts: a multipart body holds no delimiter of the boundary read.
var errNoParts = errors.New("no multipart delimiter")

// multipartFields reads the fields named names from a multipart body,
// once by each of the boundaries its Content-Type may name. A body one of
// them reads only part of (a malformed part, no closing delimiter) is
// ErrMalformed, and so is one that none of them reads at all:
// frameworks differ on what they read past a malformed part (PHP skips to
// the next delimiter line), and none of it would be seen here.
func multipartFields(boundaries, names []string) parser {
	return func(r io.Reader, found func(name, value string)) error {
		reads := make([]func(io.Reader) error, len(boundaries))
		for i, b := range boundaries {
			reads[i] = func(r io.Reader) error { return multipartRead(r, b, names, found) }
		}
		errs := fanOut(r, reads)
		none := 0
		for _, err := range errs {
			switch {
			case errors.Is(err, errNoParts):
				none++
			case err != nil:
				return ErrMalformed
			}
		}
		if none == len(errs) {
			return ErrMalformed
		}
		return nil
	}
}

// multipartRead reads the parts of a multipart body with boundary b, and
// calls found with the value of every part named one of names: errNoParts
// when it holds no "--b" at all, and an error when it ends before its
// closing delimiter, holds a malformed part, or holds "--b" anywhere but
// in its delimiters (RFC 2046 §5.1.1: they must not appear inside the
// parts). Frameworks find delimiters differently where that rule is
// broken: PHP ends a part at any "\n--b" and then takes the next line
// that is exactly "--b", even after the closing delimiter; Django splits
// at "--b" mid-line. Each would read parts Go's reader does not.
func multipartRead(r io.Reader, b string, names []string, found func(name, value string)) error {
	dashes := newDelimiters(r, b)
	mr := multipart.NewReader(dashes, b)
	for parts := 0; ; parts++ {
		part, err := mr.NextRawPart()
		if err != nil {
			if _, cerr := io.Copy(io.Discard, dashes); cerr != nil {
				return cerr
			}
			switch {
			case err == io.EOF && dashes.n == parts+1:
				return nil
			case parts == 0 && dashes.n == 0:
				return errNoParts
			case err == io.EOF:
				return errStrayDelimiter
			}
			return err
		}
		for _, n := range append(partNames(part.Header.Get("Content-Disposition")), rackNames(part.Header)...) {
			if n = ParamName(n); slices.Contains(names, n) {
				v, _ := io.ReadAll(io.LimitReader(part, MaxValue+1))
				found(n, string(v))
				break
			}
		}
	}
}

// errStrayDelimiter: a multipart body holds its boundary outside its
// delimiters.
var errStrayDelimiter = errors.New("multipart boundary outside the delimiters")

// delimiters reads a multipart body for a multipart.Reader: it counts
// the occurrences of sub ("--" and the boundary) however the reads split
// them, in memory bounded by sub's length, and fails a part's head
// (from a delimiter to the blank line after it) longer than maxPartHead:
// Go's reader holds up to 10 MiB of it, once per boundary read.
type delimiters struct {
	r    io.Reader
	sub  []byte
	tail []byte // the last len(sub)-1 bytes read
	edge []byte // tail and the start of the next read, reused
	n    int
	head int  // bytes of the head being read; -1 outside one
	nl   byte // how far a blank line is matched: 1 after "\n", 2 after "\n\r"
	err  error
}

// maxPartHead bounds a multipart part's head: Tomcat's limit is 10 KiB,
// busboy's 16 KiB.
const maxPartHead = 64 << 10

// errPartHead: a multipart part's head is longer than maxPartHead.
var errPartHead = errors.New("multipart part head too long")

func newDelimiters(r io.Reader, boundary string) *delimiters {
	return &delimiters{r: r, sub: []byte("--" + boundary), head: -1}
}

func (s *delimiters) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.r.Read(p)
	if n == 0 || len(s.sub) == 0 {
		return n, err
	}
	k := len(s.sub) - 1
	// Those that begin in the tail and end in p; a head begins after the
	// first of them.
	from := -1
	s.edge = append(append(s.edge[:0], s.tail...), p[:min(n, k)]...)
	for i := range len(s.tail) {
		if bytes.HasPrefix(s.edge[i:], s.sub) {
			s.n++
			if from < 0 {
				from = len(s.sub) - (len(s.tail) - i)
			}
		}
	}
	s.n += bytes.Count(p[:n], s.sub)
	if n >= k {
		s.tail = append(s.tail[:0], p[n-k:n]...)
	} else {
		s.tail = append(s.tail, p[:n]...)
		s.tail = append(s.tail[:0], s.tail[max(0, len(s.tail)-k):]...)
	}
	if s.err = s.heads(p[:n], from); s.err != nil {
		return n, s.err
	}
	return n, err
}

// heads follows the part heads in p: from the end of each delimiter (at
// from, when one began in the last read) to the next blank line.
func (s *delimiters) heads(p []byte, from int) error {
	i := 0
	if from >= 0 && s.head < 0 {
		i, s.head, s.nl = from, 0, 0
	}
	for i < len(p) {
		if s.head < 0 {
			j := bytes.Index(p[i:], s.sub)
			if j < 0 {
				return nil
			}
			i += j + len(s.sub)
			s.head, s.nl = 0, 0
			continue
		}
		switch c := p[i]; {
		case c == '\n' && s.nl > 0:
			s.head = -1 // "\n\n" or "\n\r\n": the head is over
		case c == '\n':
			s.nl = 1
		case c == '\r' && s.nl == 1:
			s.nl = 2
		default:
			s.nl = 0
		}
		if s.head >= 0 {
			if s.head++; s.head > maxPartHead {
				return errPartHead
			}
		}
		i++
	}
	return nil
}

// partNames are the names a part's Content-Disposition gives it, by the
// name parameter whatever the disposition type (Go's FormName wants
// "form-data", other parsers do not): Go's reading, and every name
// parameter as split at ';', since PHP and Rack read the last of several,
// which Go refuses as a duplicate.
func partNames(disposition string) []string {
	var names []string
	if _, params, err := mime.ParseMediaType(disposition); err == nil {
		names = append(names, params["name"])
	}
	for _, f := range strings.Split(disposition, ";") {
		if k, v, ok := strings.Cut(f, "="); ok && strings.EqualFold(strings.TrimSpace(k), "name") {
			names = append(names, strings.Trim(strings.TrimSpace(v), `"`))
		}
	}
	return names
}

// rackNames are the names Rack reads from a part's head: by a regular
// expression over its text, not by parameter. Rack 2 (Rails 6 and 7.0)
// takes the last `\s+name="?([^";]*)"?` on the first line holding
// "Content-Disposition:", even inside another header's value; Rack 3 the
// first `;\s+name="?([^";]*)"?` of the header. So `name="a" name=_method`
// and `name=_method"x` are both _method there. Every such name is read.
func rackNames(h textproto.MIMEHeader) []string {
	var names []string
	for k, vs := range h {
		for _, v := range vs {
			line := k + ": " + v
			lower := strings.ToLower(line)
			i := strings.Index(lower, "content-disposition:")
			for i >= 0 {
				j := strings.Index(lower[i:], "name=")
				if j < 0 {
					break
				}
				i += j + len("name=")
				if c := line[i-len("name=")-1]; c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != '\v' && c != '\f' {
					continue // "filename=", or no space before it
				}
				value := strings.TrimPrefix(line[i:], `"`)
				if end := strings.IndexAny(value, `";`); end >= 0 {
					value = value[:end]
				}
				names = append(names, value)
			}
		}
	}
	return names
}
