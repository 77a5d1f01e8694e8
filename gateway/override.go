package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
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

// methodParam is the override parameter Laravel reads from JSON bodies.
const methodParam = "_method"

// maxOverride bounds the name of a field read from a body: no method is
// longer, nor any name api_key_params sensibly lists.
const maxOverride = 64

// maxName bounds a field's raw name as read from a form: every byte of
// the longest may come percent-escaped.
const maxName = 3 * maxOverride

// maxValue bounds a field's value as read from a body: a method or an
// API key is shorter; a longer key is read as one the request was not
// charged to.
const maxValue = 1024

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

// scanBody wraps a request's body in a scanner when the gateway must
// read it before the upstream runs it; otherwise it returns body as it is.
// It reads the body of
//   - a POST to p where some method is not rt's, for a _method naming
//     another route's method: only there can an override matter;
//   - a request charged to its caller (rt is not exempt), for an API key
//     other than the one decided: Laravel's input(), PHP's $_REQUEST and
//     Rails' params serve a form or JSON field as the query's, whatever
//     the method, and the decision was made before the body came.
//
// A body it must read but cannot decode is refused at once, a
// *bodyRefusal in place of the scanner.
func (st *state) scanBody(r *http.Request, body io.ReadCloser, p string, rt *route) (io.ReadCloser, error) {
	override := isPost(r.Method) && st.routedElsewhere(p, rt)
	keys := !rt.Exempt && len(st.keyParams) > 0
	if !override && !keys {
		return body, nil
	}
	names := st.bodyNames
	switch {
	case !keys:
		names = overrideParams
	case !override:
		names = st.keyParams
	}
	types := r.Header.Values("Content-Type")
	if len(types) > 1 && slices.ContainsFunc(types[1:], func(t string) bool { return t != types[0] }) {
		// One field (RFC 9110 §8.3), read here as the first; gunicorn's
		// WSGI environ keeps the last, Kestrel and Puma join them.
		return body, errContentTypes
	}
	contentType := r.Header.Get("Content-Type")
	if contentType == "" && !isPost(r.Method) {
		return body, nil // only a POST is read as a form without a type (Rack)
	}
	parsers := bodyParsers(contentType, names)
	if len(parsers) == 0 {
		return body, nil
	}
	if err := checkCharset(contentType); err != nil {
		return body, err
	}
	decode, err := decoder(r.Header.Values("Content-Encoding"), st.cfg.MaxBodyBytes)
	if err != nil {
		return body, err
	}
	var key string
	if keys {
		key, _ = apiKeyOf(r.Header, r.URL.RawQuery, st.keyParams, st.cfg.IgnoreBearer) // one key, or identify refused it
	}
	check := func(name, value string) error {
		switch {
		case override && slices.Contains(overrideParams, name):
			if st.elsewhere(value, p, rt) {
				return errMethodOverride
			}
		case keys && slices.Contains(st.keyParams, name):
			// As oneValue compares keys; a value cut at maxValue is no
			// key the request was charged to.
			if v := trimCredential(value); v != "" && (v != key || len(value) > maxValue) {
				if key == "" {
					return errBodyKeyOnly
				}
				return errBodyKey
			}
		}
		return nil
	}
	return newBodyScanner(body, func(r io.Reader) error {
		var mu sync.Mutex
		var refused error
		err := decode(r, func(d io.Reader) error {
			return parseEach(d, parsers, func(name, value string) {
				mu.Lock()
				defer mu.Unlock()
				if refused == nil {
					refused = check(name, value)
				}
			})
		})
		mu.Lock()
		defer mu.Unlock()
		if refused != nil {
			return refused
		}
		return err
	}), nil
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

// A parser reads a body and calls found with each field named one of
// the names it was made for (normalised by paramName), and its value, cut
// after maxValue bytes. found must be safe for concurrent use. It fails
// only when the body cannot be read to its end.
type parser func(r io.Reader, found func(name, value string)) error

// bodyParsers returns what reads the fields named names from a body of
// this content type, as each framework would read it, none for types no
// framework reads a form or JSON from. Rack parses a POST without a
// Content-Type as a form, and so does this; Laravel reads JSON from any
// type holding "/json" or "+json", PHP the form of the same request.
func bodyParsers(contentType string, names []string) []parser {
	if strings.TrimSpace(contentType) == "" {
		return []parser{formFields(names)}
	}
	var out []parser
	if bs := boundaries(contentType); len(bs) > 0 {
		out = append(out, multipartFields(bs, names))
	}
	if lower := strings.ToLower(contentType); strings.Contains(lower, "/json") || strings.Contains(lower, "+json") {
		out = append(out, jsonFields(names))
	}
	if formType(contentType) {
		out = append(out, formFields(names))
	}
	return out
}

// formType says a body of this content type is read as a form: a
// urlencoded one, or one unreadable here, perhaps not to the upstream
// (the most lenient reading). A type without parameters is checked
// without mime.ParseMediaType, whose map is the only allocation of a
// body that is not read.
func formType(contentType string) bool {
	const form = "application/x-www-form-urlencoded"
	if !strings.Contains(contentType, ";") {
		mt := strings.TrimSpace(contentType)
		return strings.EqualFold(mt, form) || !isMediaType(mt)
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err != nil || mt == form
}

// isMediaType says mt is a token, or two joined by '/', as
// mime.ParseMediaType takes a type.
func isMediaType(mt string) bool {
	typ, sub, slash := strings.Cut(mt, "/")
	return isToken(typ) && (!slash || isToken(sub))
}

// isToken says s is an RFC 2045 token: ASCII, no controls, spaces or
// tspecials.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?=`, c) >= 0 {
			return false
		}
	}
	return s != ""
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

// formFields reads the fields named names from a urlencoded body, read
// as eachParam reads a query, in bounded memory. Any bytes are a form.
func formFields(names []string) parser {
	return func(r io.Reader, found func(name, value string)) error {
		br := bufio.NewReader(r)
		skipBOM(br)
		var name, value []byte
		inValue := false
		flush := func() {
			if len(name) <= maxName {
				if n := paramName(string(name)); slices.Contains(names, n) {
					found(n, unescape(string(value)))
				}
			}
			name, value, inValue = name[:0], value[:0], false
		}
		for {
			c, err := br.ReadByte()
			if err != nil {
				flush()
				return nil
			}
			switch {
			case c == '&' || c == ';':
				flush()
			case c == '=' && !inValue:
				inValue = true
			case inValue:
				if len(value) <= 3*maxValue { // escaped, up to maxValue+1 decoded
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
}

// parseEach reads a body with each of parsers (bodyParsers returns at
// most three), all fed its bytes as they come, and returns the first
// parser's error.
func parseEach(r io.Reader, parsers []parser, found func(name, value string)) error {
	if len(parsers) == 1 {
		return parsers[0](r, found)
	}
	reads := make([]func(io.Reader) error, len(parsers))
	for i, parse := range parsers {
		reads[i] = func(r io.Reader) error { return parse(r, found) }
	}
	return errors.Join(fanOut(r, reads)...)
}

// fanOut reads r with each of reads, each in its own goroutine reading
// its own pipe, so memory stays bounded, and returns their errors; a
// failure reading r is every read's.
func fanOut(r io.Reader, reads []func(io.Reader) error) []error {
	errs := make([]error, len(reads))
	var wg sync.WaitGroup
	pws := make([]*io.PipeWriter, len(reads))
	ws := make([]io.Writer, len(reads))
	for i, read := range reads {
		pr, pw := io.Pipe()
		pws[i], ws[i] = pw, pw
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = read(pr)
			// Drain what the read left, so that the copy never blocks.
			if _, err := io.Copy(io.Discard, pr); err != nil && errs[i] == nil {
				errs[i] = err
			}
		}()
	}
	_, err := io.Copy(io.MultiWriter(ws...), r)
	for _, pw := range pws {
		_ = pw.CloseWithError(err)
	}
	wg.Wait()
	return errs
}

// errNoParts: a multipart body holds no delimiter of the boundary read.
var errNoParts = errors.New("no multipart delimiter")

// multipartFields reads the fields named names from a multipart body,
// once by each of the boundaries its Content-Type may name. A body one of
// them reads only part of (a malformed part, no closing delimiter) is
// errBodyMalformed, and so is one that none of them reads at all:
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
				return errBodyMalformed
			}
		}
		if none == len(errs) {
			return errBodyMalformed
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
			if n = paramName(n); slices.Contains(names, n) {
				v, _ := io.ReadAll(io.LimitReader(part, maxValue+1))
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

// jsonFields reads the top-level string members of a JSON object named
// names (in any case: ASP.NET binds JSON so), as Laravel reads its JSON
// input. It reads byte by byte and keeps only strings short enough to be
// a name or a value read: json.Decoder holds a whole value, so one 10 MiB
// string held twice that per request. Malformed JSON ends the reading
// without an error: Laravel reads no input from it, and the other
// frameworks refuse it.
func jsonFields(names []string) parser {
	return func(r io.Reader, found func(name, value string)) error {
		br := bufio.NewReader(r)
		skipBOM(br)
		// UTF-16 and UTF-32 JSON (RFC 4627 §3: a NUL among the first
		// four bytes, or their BOM): Jackson and System.Text.Json read
		// it, whatever the charset says; read here, it is no object.
		if b, _ := br.Peek(4); bytes.IndexByte(b, 0) >= 0 || bytes.HasPrefix(b, []byte{0xFE, 0xFF}) || bytes.HasPrefix(b, []byte{0xFF, 0xFE}) {
			return errJSONCharset
		}
		jsonMembers(br, func(key, value string) {
			if k := strings.ToLower(key); slices.Contains(names, k) {
				found(k, value)
			}
		})
		return nil
	}
}

// errJSONCharset: a JSON body in UTF-16 or UTF-32.
var errJSONCharset = &bodyRefusal{"unsupported_charset", problem{Type: probUnsupportedCharset, Status: http.StatusUnsupportedMediaType,
	Detail: "The JSON body is in UTF-16 or UTF-32, which this gateway does not read, and it must read this body; send UTF-8."}}

// skipBOM drops a UTF-8 byte order mark at the start of a form or JSON:
// body-parser (iconv-lite) and System.Text.Json drop it, so the first
// field's name is read without it there.
func skipBOM(br *bufio.Reader) {
	if b, _ := br.Peek(3); bytes.Equal(b, []byte{0xEF, 0xBB, 0xBF}) {
		_, _ = br.Discard(3)
	}
}

// nonString is what jsonMembers reports for a member that is a number,
// a boolean, an array or an object: a value longer than maxValue, so
// never the key a request was charged to. Laravel's input() hands such a
// value on, and its token guard looks up 0 or ["key"] as a key.
var nonString = strings.Repeat("?", maxValue+1)

// jsonMembers calls member with each top-level member of the JSON object
// br holds but null ones: a string's value, nonString for others.
func jsonMembers(br *bufio.Reader, member func(key, value string)) {
	if c, ok := jsonNext(br); !ok || c != '{' {
		return
	}
	for {
		c, ok := jsonNext(br)
		if !ok || c != '"' {
			return // '}' of an empty object, or not JSON
		}
		key, ok := jsonString(br, maxName)
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
			v, ok := jsonString(br, maxValue)
			if !ok {
				return
			}
			member(key, v)
		} else {
			if c != 'n' { // null names nothing
				member(key, nonString)
			}
			if !jsonSkip(br, c) {
				return
			}
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
// it is at most bound bytes, and cut after bound+1 when longer.
func jsonString(br *bufio.Reader, bound int) (string, bool) {
	raw := []byte{'"'}
	rawBound := 6*bound + 2 // each byte may come as a \u escape
	escaped := false
	for {
		c, err := br.ReadByte()
		if err != nil {
			return "", false
		}
		if len(raw) <= rawBound {
			raw = append(raw, c)
		}
		switch {
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			var s string
			if len(raw) > rawBound {
				return string(raw[1 : bound+2]), true
			}
			if json.Unmarshal(raw, &s) != nil {
				return "", true
			}
			return s[:min(len(s), bound+1)], true
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
			if _, ok := jsonString(br, 0); !ok {
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

// bodyScanner passes a body through while a scan reads it, and holds
// its last scanHold bytes back until the scan is done: the whole of a
// short body, and for a longer one what follows its last fields. PHP and
// Rails read a form only once the whole body is in, but Go's json.Decoder
// and multipart reader, and Jackson, stop at the end of the value or the
// closing delimiter: holding back only the last byte (a trailing newline,
// an epilogue, a gzip trailer) let such an upstream run the request with
// a key the scan then refused. The scan runs in a goroutine reading a
// pipe the scanner writes each chunk to, so memory stays bounded whatever
// the body's size; it ends when the body ends or is closed. Its error, a
// *bodyRefusal, takes the held bytes' place.
type bodyScanner struct {
	body    io.ReadCloser
	pw      *io.PipeWriter
	done    chan error   // the scan's verdict
	pending bytes.Buffer // the held-back bytes
	eof     bool         // the body ended and the scan found nothing
	err     error
}

// scanHold is how much of a scanned body's end is held back until the
// scan's verdict: far more than follows the fields of any body a client
// sends, little beside the connection's own buffers.
const scanHold = 64 << 10

func newBodyScanner(body io.ReadCloser, scan func(io.Reader) error) *bodyScanner {
	pr, pw := io.Pipe()
	s := &bodyScanner{body: body, pw: pw, done: make(chan error, 1)}
	go func() {
		err := scan(pr)
		// Drain what the scan left, so that writes never block.
		_, _ = io.Copy(io.Discard, pr)
		s.done <- err
	}()
	return s
}

func (s *bodyScanner) Read(p []byte) (int, error) {
	if len(p) == 0 && s.err == nil {
		return 0, nil
	}
	for s.err == nil {
		if s.eof {
			// The verdict is in and clean: the held bytes go out.
			n, _ := s.pending.Read(p)
			if s.pending.Len() == 0 {
				s.err = io.EOF
			}
			return n, s.err
		}
		if over := s.pending.Len() - scanHold; over > 0 {
			return s.pending.Read(p[:min(len(p), over)])
		}
		// p is free: the body's next chunk is read into it, then held.
		m, err := s.body.Read(p)
		if m > 0 {
			_, _ = s.pw.Write(p[:m])
			_, _ = s.pending.Write(p[:m])
		}
		switch {
		case err == io.EOF:
			_ = s.pw.Close()
			if verdict := <-s.done; verdict != nil {
				var refused *bodyRefusal
				if !errors.As(verdict, &refused) {
					refused = errBodyMalformed // what the scan could not read, the upstream may
				}
				s.err = refused
				break
			}
			s.eof = true
		case err != nil:
			s.err = err
			_ = s.pw.CloseWithError(err)
		}
	}
	return 0, s.err
}

func (s *bodyScanner) Close() error {
	_ = s.pw.CloseWithError(io.ErrClosedPipe)
	return s.body.Close()
}
