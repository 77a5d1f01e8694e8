package bodyscan

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// OverrideParams name the method override parameters, as ParamName
// normalises them. A POST can name the method it is run as: Laravel and
// Spring read _method from the query, a form or (Laravel) a JSON body;
// Rails and ASP.NET from a form (ASP.NET MVC's field, as its query
// parameter, is X-HTTP-Method-Override); Express's method-override from
// the query.
var OverrideParams = []string{"_method", "x-http-method-override"}

// maxOverride bounds the name of a field read from a body: no method is
// longer, nor any name api_key_params sensibly lists.
const maxOverride = 64

// maxName bounds a field's raw name as read from a form: every byte of
// the longest may come percent-escaped.
const maxName = 3 * maxOverride

// MaxValue bounds a field's value as read from a body: a method or an
// API key is shorter; a longer key is read as one the request was not
// charged to.
const MaxValue = 1024

// EachParam calls fn with the decoded value of every query parameter
// named one of names (normalised by ParamName). It splits on ';' as well
// as '&' (Python before 3.9.2 and some Java stacks do) and reads an
// undecodable escape as it stands: no spelling the gateway passes over
// may reach the upstream as one of these parameters.
func EachParam(rawQuery string, names []string, fn func(value string)) {
	for rawQuery != "" {
		var pair string
		if i := strings.IndexAny(rawQuery, "&;"); i >= 0 {
			pair, rawQuery = rawQuery[:i], rawQuery[i+1:]
		} else {
			pair, rawQuery = rawQuery, ""
		}
		name, value, _ := strings.Cut(pair, "=")
		if !slices.Contains(names, ParamName(name)) {
			continue
		}
		fn(unescape(value))
	}
}

// ParamName is a query parameter's name as frameworks look it up:
// percent-decoded, lower-cased (ASP.NET ignores case); as PHP names it,
// leading spaces dropped, cut at a NUL (PHP passes names on as C
// strings), '.', ' ' and '[' made '_', and an array's "name[…]" as name;
// and as Rack 2 (Rails 6 and 7.0) does, brackets around it dropped:
// "[_method]" and "api_key]" are plain parameters there.
func ParamName(raw string) string {
	raw = unescape(raw)
	raw = strings.TrimLeft(raw, " ")
	if i := strings.IndexByte(raw, 0); i >= 0 {
		raw = raw[:i]
	}
	raw = strings.TrimLeft(raw, "[]")
	if i := strings.IndexByte(raw, '['); i > 0 && strings.HasSuffix(raw, "]") {
		raw = raw[:i]
	}
	raw = strings.TrimRight(raw, "]")
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', ' ', '[':
			return '_'
		}
		return unicode.ToLower(r)
	}, raw)
}

// unescape decodes a query or form component as frameworks do: '+' is a
// space, each %XX its byte and (ASP.NET) each %uXXXX its character, and
// an escape that is neither stands as sent. url.QueryUnescape gives up
// on the whole string at one bad escape, where PHP and Python decode the
// rest: "_method%00%zz" was no _method here, "_method" to PHP.
func unescape(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && hexAt(s, i+1, 2) >= 0:
			b = append(b, byte(hexAt(s, i+1, 2)))
			i += 2
		case c == '%' && i+1 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') && hexAt(s, i+2, 4) >= 0:
			b = utf8.AppendRune(b, rune(hexAt(s, i+2, 4)))
			i += 5
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// hexAt is the value of the n hex digits at s[i:], -1 when they are not.
func hexAt(s string, i, n int) int {
	if i+n > len(s) {
		return -1
	}
	v := 0
	for _, c := range []byte(s[i : i+n]) {
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | int(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | int(c-'a'+10)
		case 'A' <= c && c <= 'F':
			v = v<<4 | int(c-'A'+10)
		default:
			return -1
		}
	}
	return v
}
