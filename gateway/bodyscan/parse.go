package bodyscan

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"slices"
	"strings"
	"sync"
)

// A parser reads a body and calls found with each field named one of
// the names it was made for (normalised by ParamName), and its value, cut
// after MaxValue bytes. found must be safe for concurrent use. It fails
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

// trimName drops from a form field's raw name what ParamName drops
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
				if n := ParamName(string(name)); slices.Contains(names, n) {
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
				if len(value) <= 3*MaxValue { // escaped, up to MaxValue+1 decoded
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

// skipBOM drops a UTF-8 byte order mark at the start of a form or JSON:
// body-parser (iconv-lite) and System.Text.Json drop it, so the first
// field's name is read without it there.
func skipBOM(br *bufio.Reader) {
	if b, _ := br.Peek(3); bytes.Equal(b, []byte{0xEF, 0xBB, 0xBF}) {
		_, _ = br.Discard(3)
	}
}

// nonString is what jsonMembers reports for a member that is a number,
// a boolean, an array or an object: a value longer than MaxValue, so
// never the key a request was charged to. Laravel's input() hands such a
// value on, and its token guard looks up 0 or ["key"] as a key.
var nonString = strings.Repeat("?", MaxValue+1)

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
			v, ok := jsonString(br, MaxValue)
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
