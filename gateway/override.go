package gateway

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// A POST can name the method it is run as: Laravel and Spring read
// _method from the query, a form or (Laravel) a JSON body; Rails and
// ASP.NET from a form (ASP.NET MVC's field, as its query parameter, is
// X-HTTP-Method-Override); Express's method-override from the query. Whether
// the upstream honours it is not known here, so a POST that names a
// method the gateway limits on another route is refused, rather than
// charged as a POST and run as, say, a DELETE. The override headers
// (X-HTTP-Method-Override, …) are stripped instead: see
// DefaultStripHeaders.

// overrideParams name the override parameters, normalised by paramName.
var overrideParams = []string{methodParam, "x-http-method-override"}

// methodParam is the override parameter read from JSON bodies, by Laravel
// as spelled here.
const methodParam = "_method"

// isOverride says a query or form parameter named raw is an override.
func isOverride(raw string) bool { return slices.Contains(overrideParams, paramName(raw)) }

// errMethodOverride ends the body of a POST whose form or JSON names
// another route's method: the upstream never gets the body's last byte,
// and the client gets 400.
var errMethodOverride = errors.New("the body names, as _method, a method limited on another route")

// maxOverride bounds an override parameter's name and value as read from a
// body: no method is longer, and a longer one matches no route's methods.
const maxOverride = 64

// maxName bounds an override parameter's raw name as read from a form:
// every byte of the longest may come percent-escaped.
const maxName = 3 * maxOverride

// overridden reports whether a POST's query names, as _method, a method
// whose route at p is not rt.
func (st *state) overridden(r *http.Request, p string, rt *route) bool {
	if r.URL.RawQuery == "" || !isPost(r.Method) {
		return false
	}
	other := false
	eachParam(r.URL.RawQuery, overrideParams, func(m string) {
		other = other || st.elsewhere(m, p, rt)
	})
	return other
}

// elsewhere says method m is limited at p on a route other than rt.
func (st *state) elsewhere(m, p string, rt *route) bool {
	// Rails, Express and Spring upper-case the value with Unicode's
	// mapping, which makes "optıons" (dotless i) OPTIONS.
	m = strings.ToUpper(strings.TrimSpace(m))
	return m != "" && st.match(m, p) != rt
}

func isPost(method string) bool { return strings.EqualFold(method, http.MethodPost) }

// scanOverride wraps the body of a POST to p when its form or JSON could
// name a method routed elsewhere; otherwise it returns body as it is. Only
// where some method is not rt's at p can an override matter.
func (st *state) scanOverride(r *http.Request, body io.ReadCloser, p string, rt *route) io.ReadCloser {
	if !isPost(r.Method) || !st.routedElsewhere(p, rt) {
		return body
	}
	parsers := bodyParsers(r.Header.Get("Content-Type"))
	if len(parsers) == 0 {
		return body
	}
	parse := decoded(r.Header.Values("Content-Encoding"), st.cfg.MaxBodyBytes, func(r io.Reader, found func(string)) { parseEach(r, parsers, found) })
	return newOverrideScanner(body, parse, func(m string) bool { return st.elsewhere(m, p, rt) })
}

// routedElsewhere says some method at p is not rt's: rt lists its
// methods (others go to another route or to none, which the upstream
// would run all the same), or another route matches p.
func (st *state) routedElsewhere(p string, rt *route) bool {
	if len(rt.methods) > 0 {
		return true
	}
	clean := routePath(p, st.cfg.Paths)
	for _, o := range st.routes {
		if o != rt && o.matchPath(clean) {
			return true
		}
	}
	return false
}

// A parser reads a body and calls found with each override value in it.
type parser func(r io.Reader, found func(string))

// decoded returns parse reading the body decoded as its Content-Encoding
// says, up to max decoded bytes: Express's body-parser inflates gzip and
// deflate bodies (a zlib stream), ASP.NET Core's decompression middleware
// too (deflate a raw one, so both are read). Other codings (br, zstd,
// several) are read as they are, which finds nothing in them.
func decoded(codings []string, max int64, parse parser) parser {
	var cs []string
	for _, v := range codings {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				cs = append(cs, c)
			}
		}
	}
	if len(cs) != 1 {
		return parse
	}
	within := func(r io.Reader, found func(string)) { parse(io.LimitReader(r, max), found) }
	switch cs[0] {
	case "gzip", "x-gzip":
		return func(r io.Reader, found func(string)) {
			if zr, err := gzip.NewReader(r); err == nil {
				within(zr, found)
			}
		}
	case "deflate":
		zlibbed := func(r io.Reader, found func(string)) {
			if zr, err := zlib.NewReader(r); err == nil {
				within(zr, found)
			}
		}
		raw := func(r io.Reader, found func(string)) { within(flate.NewReader(r), found) }
		return func(r io.Reader, found func(string)) { parseEach(r, []parser{zlibbed, raw}, found) }
	}
	return parse
}

// bodyParsers returns what reads override values from a body of this
// content type, as each framework would read it, none for types no
// framework reads _method from. Rack parses a POST without a Content-Type
// as a form, and so does this; Laravel reads JSON from any type holding
// "/json" or "+json", PHP the form of the same request.
func bodyParsers(contentType string) []parser {
	if strings.TrimSpace(contentType) == "" {
		return []parser{formOverrides}
	}
	var out []parser
	for _, b := range boundaries(contentType) {
		out = append(out, func(r io.Reader, found func(string)) { multipartOverrides(r, b, found) })
	}
	if lower := strings.ToLower(contentType); strings.Contains(lower, "/json") || strings.Contains(lower, "+json") {
		out = append(out, jsonOverrides)
	}
	// Unreadable here, perhaps not to the upstream: read it as a form,
	// the most lenient reading.
	if mt, _, err := mime.ParseMediaType(contentType); err != nil || mt == "application/x-www-form-urlencoded" {
		out = append(out, formOverrides)
	}
	return out
}

// boundaries returns the boundaries a multipart Content-Type names, as Go
// reads it and as PHP and Rack do, nil when it is not multipart. Both take
// any type cut at ';' or ',' (Rack's multipart/mixed and /related too) and
// find the boundary by name anywhere: PHP the first "boundary" (case
// first), Rack the last "boundary=". A body scanned with Go's reading only
// could name its parts with a boundary only the upstream reads.
func boundaries(contentType string) []string {
	base, _, _ := strings.Cut(contentType, ";")
	base, _, _ = strings.Cut(base, ",")
	if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(base)), "multipart/") {
		return nil
	}
	var out []string
	add := func(b string) {
		if b != "" && len(out) < 4 && !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	if _, params, err := mime.ParseMediaType(contentType); err == nil {
		add(params["boundary"])
	}
	lower := strings.ToLower(contentType)
	i := strings.Index(contentType, "boundary")
	if i < 0 {
		i = strings.Index(lower, "boundary")
	}
	if i >= 0 {
		if j := strings.IndexByte(contentType[i:], '='); j >= 0 {
			v := contentType[i+j+1:]
			if rest, ok := strings.CutPrefix(v, `"`); ok {
				v, _, _ = strings.Cut(rest, `"`)
			} else if k := strings.IndexAny(v, ",;"); k >= 0 {
				v = v[:k]
			}
			add(v)
		}
	}
	for i := len(lower); i > 0; {
		if i = strings.LastIndex(lower[:i], "boundary="); i < 0 {
			break
		}
		v := strings.TrimPrefix(contentType[i+len("boundary="):], `"`)
		if k := strings.IndexAny(v, `";,`); k >= 0 {
			v = v[:k]
		}
		if v != "" {
			add(v)
			break
		}
	}
	return out
}

// trimName drops from a form field's raw name what paramName drops
// however many there are: leading spaces ('+', "%20"; PHP) and brackets
// (Rack 2), and all but one of its trailing brackets (Rack 2). A run of
// them must not outgrow maxName.
func trimName(name []byte) []byte {
	for {
		if len(name) > 0 && (name[0] == '+' || name[0] == '[' || name[0] == ']') {
			name = name[1:]
		} else if len(name) >= 3 && name[0] == '%' && slices.Contains(nameFill, strings.ToUpper(string(name[1:3]))) {
			name = name[3:]
		} else {
			break
		}
	}
	for {
		end := closing(name)
		if end == 0 || closing(name[:len(name)-end]) == 0 {
			return name
		}
		name = name[:len(name)-end]
	}
}

// nameFill are the escapes trimName drops at a name's start: ' ', '[', ']'.
var nameFill = []string{"20", "5B", "5D"}

// closing is the length of the ']' (raw or escaped) name ends with, or 0.
func closing(name []byte) int {
	switch {
	case bytes.HasSuffix(name, []byte("]")):
		return 1
	case len(name) >= 3 && name[len(name)-3] == '%' && strings.EqualFold(string(name[len(name)-2:]), "5D"):
		return 3
	}
	return 0
}

// cutAtNUL says a raw field name holds a NUL, where PHP ends the name: the
// rest does not matter, however long.
func cutAtNUL(name []byte) bool {
	return bytes.IndexByte(name, 0) >= 0 || bytes.Contains(name, []byte("%00"))
}

// formOverrides calls found with every override value of a urlencoded
// body, read as eachParam reads a query, in bounded memory.
func formOverrides(r io.Reader, found func(string)) {
	br := bufio.NewReader(r)
	var name, value []byte
	inValue := false
	flush := func() {
		if len(name) <= maxName && isOverride(string(name)) {
			found(unescape(string(value)))
		}
		name, value, inValue = name[:0], value[:0], false
	}
	for {
		c, err := br.ReadByte()
		if err != nil {
			flush()
			return
		}
		switch {
		case c == '&' || c == ';':
			flush()
		case c == '=' && !inValue:
			inValue = true
		case inValue:
			if len(value) <= maxOverride {
				value = append(value, c)
			}
		case cutAtNUL(name):
		default:
			if name = trimName(name); len(name) <= maxName {
				name = append(name, c)
			}
		}
	}
}

// parseEach reads a body with each of parsers (bodyParsers returns at
// most six, decoded two), each in its own goroutine reading its own pipe, all fed the
// body's bytes as they come, so memory stays bounded.
func parseEach(r io.Reader, parsers []parser, found func(string)) {
	if len(parsers) == 1 {
		parsers[0](r, found)
		return
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	pws := make([]*io.PipeWriter, len(parsers))
	ws := make([]io.Writer, len(parsers))
	for i, parse := range parsers {
		pr, pw := io.Pipe()
		pws[i], ws[i] = pw, pw
		wg.Add(1)
		go func() {
			defer wg.Done()
			parse(pr, func(v string) {
				mu.Lock()
				defer mu.Unlock()
				found(v)
			})
			// Drain what the parser left, so that the copy never blocks.
			_, _ = io.Copy(io.Discard, pr)
		}()
	}
	_, err := io.Copy(io.MultiWriter(ws...), r)
	for _, pw := range pws {
		_ = pw.CloseWithError(err)
	}
	wg.Wait()
}

// multipartOverrides calls found with the value of every override part.
// It stops at the first malformed part; the rest is left to the upstream.
func multipartOverrides(r io.Reader, boundary string, found func(string)) {
	mr := multipart.NewReader(r, boundary)
	for {
		part, err := mr.NextRawPart()
		if err != nil {
			return
		}
		if slices.ContainsFunc(partNames(part.Header.Get("Content-Disposition")), isOverride) {
			v, _ := io.ReadAll(io.LimitReader(part, maxOverride+1))
			found(string(v))
		}
	}
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

// jsonOverrides calls found with a JSON object's top-level _method
// string, as Laravel reads its JSON input. It reads byte by byte and keeps
// only strings short enough to be the name or a method: json.Decoder
// holds a whole value, so one 10 MiB string held twice that per request.
func jsonOverrides(r io.Reader, found func(string)) {
	br := bufio.NewReader(r)
	if c, ok := jsonNext(br); !ok || c != '{' {
		return
	}
	for {
		c, ok := jsonNext(br)
		if !ok || c != '"' {
			return // '}' of an empty object, or not JSON
		}
		key, ok := jsonString(br)
		if !ok {
			return
		}
		if c, ok = jsonNext(br); !ok || c != ':' {
			return
		}
		if c, ok = jsonNext(br); !ok {
			return
		}
		if c == '"' {
			v, ok := jsonString(br)
			if !ok {
				return
			}
			if key == methodParam {
				found(v)
			}
		} else if !jsonSkip(br, c) {
			return
		}
		if c, ok = jsonNext(br); !ok || c != ',' {
			return
		}
	}
}

// jsonNext reads the next byte that is not JSON white space.
func jsonNext(br *bufio.Reader) (byte, bool) {
	for {
		c, err := br.ReadByte()
		if err != nil {
			return 0, false
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c, true
	}
}

// jsonString reads a JSON string after its opening quote: decoded when
// it is at most maxName bytes as sent, "" when longer.
func jsonString(br *bufio.Reader) (string, bool) {
	raw := []byte{'"'}
	escaped := false
	for {
		c, err := br.ReadByte()
		if err != nil {
			return "", false
		}
		if len(raw) <= maxName {
			raw = append(raw, c)
		}
		switch {
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			var s string
			if len(raw) > maxName || json.Unmarshal(raw, &s) != nil {
				return "", true
			}
			return s, true
		}
	}
}

// jsonSkip reads past the value (not a string) that begins with c,
// leaving the byte that ends a scalar to be read.
func jsonSkip(br *bufio.Reader, c byte) bool {
	depth := 0
	for {
		switch c {
		case '"':
			if _, ok := jsonString(br); !ok {
				return false
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return br.UnreadByte() == nil
			}
			if depth--; depth == 0 {
				return true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return br.UnreadByte() == nil
			}
		}
		var err error
		if c, err = br.ReadByte(); err != nil {
			return false
		}
	}
}

// overrideScanner passes a body through while a parser reads override
// values from it, and holds its last byte back until the parser is done:
// frameworks read a form's _method only once the whole body is in, so an
// upstream that never gets the last byte never runs the request. The
// parser runs in a goroutine reading a pipe the scanner writes each chunk
// to, so memory stays bounded whatever the body's size; it ends when the
// body ends or is closed.
type overrideScanner struct {
	body    io.ReadCloser
	pw      *io.PipeWriter
	done    chan bool // the parser's verdict: an override routed elsewhere
	pending []byte    // the held-back byte, when there is one
	one     [1]byte   // where the next byte goes when p holds only the held one
	eof     bool      // the body ended and the parser found nothing
	err     error
}

func newOverrideScanner(body io.ReadCloser, parse func(io.Reader, func(string)), elsewhere func(string) bool) *overrideScanner {
	pr, pw := io.Pipe()
	s := &overrideScanner{body: body, pw: pw, done: make(chan bool, 1), pending: make([]byte, 0, 1)}
	go func() {
		other := false
		parse(pr, func(m string) { other = other || elsewhere(m) })
		// Drain what the parser left, so that writes never block.
		_, _ = io.Copy(io.Discard, pr)
		s.done <- other
	}()
	return s
}

func (s *overrideScanner) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if s.eof {
		// The verdict is in and clean: the held-back byte goes out.
		n := copy(p, s.pending)
		s.pending, s.err = s.pending[:0], io.EOF
		return n, io.EOF
	}
	held := copy(p, s.pending)
	buf := p[held:]
	if len(buf) == 0 {
		// A one-byte p holds just the held byte: reading the body into
		// p[1:] read nothing, and a reader of one byte at a time never
		// got one (io.ReadAll looped for ever).
		buf = s.one[:]
	}
	m, err := s.body.Read(buf)
	n := 0
	if m > 0 {
		_, _ = s.pw.Write(buf[:m])
		// Out go the byte held before and all new ones but the last.
		n = held + m - 1
		s.pending = append(s.pending[:0], buf[m-1])
	}
	switch {
	case err == io.EOF:
		_ = s.pw.Close()
		if <-s.done {
			s.err = errMethodOverride
			return n, s.err
		}
		s.eof = true
		if n < len(p) {
			n += copy(p[n:], s.pending)
			s.pending, s.err = s.pending[:0], io.EOF
			return n, io.EOF
		}
	case err != nil:
		s.err = err
		_ = s.pw.CloseWithError(err)
	}
	return n, err
}

func (s *overrideScanner) Close() error {
	_ = s.pw.CloseWithError(io.ErrClosedPipe)
	return s.body.Close()
}
