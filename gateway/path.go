package gateway

import (
	"net/url"
	"strings"
	"unicode/utf8"
)

// The gateway decides on one path and forwards exactly that path. A path
// the gateway and an upstream could read differently (an encoded slash, a
// backslash, an overlong UTF-8 sequence, a double encoding) is refused
// with 400 rather than guessed at, as Envoy's
// path_with_escaped_slashes_action: REJECT_REQUEST does: whichever way the
// gateway guessed, some upstream would guess the other way and run a
// handler the route's limits were not meant for.
//
// What normalisation does, once per request (normalizePath):
//   - percent-encoded unreserved characters (ALPHA DIGIT - . _ ~) are
//     decoded, so "%2e%2e" is the dot segment it spells;
//   - other escapes are kept, upper-cased ("%3f" → "%3F");
//   - raw bytes a path may not hold are escaped ('"' → "%22", UTF-8 as
//     %XX);
//   - "." and ".." segments are resolved (".." above the root stays at the
//     root) and empty segments ("//") merged; a trailing slash is kept;
//   - case is kept: routes match case-sensitively, like the upstreams'
//     own routers, unless paths.ignore_case says the upstreams do not.
//
// Refused (errAmbiguousPath): escapes of '/', '\', NUL and control bytes;
// a raw backslash or control byte; an escaped '%' that starts another
// escape ("%252F", decoded twice by some stacks); bytes that are not UTF-8
// once decoded ("%c0%af", an overlong '/' to old decoders); a segment
// ending in '.' that is not a dot segment, or in a space ("export." and
// "export%20" are "export" on Windows stacks); and ';' unless paths.allow_params (Java stacks cut
// ";jsessionid=…" off a segment before routing).

// errAmbiguousPath is a path the gateway refuses to guess at.
type errAmbiguousPath string

func (e errAmbiguousPath) Error() string { return string(e) }

// probBadPath is the problem type of a refused path.
const probBadPath = "urn:edgelimit:problem:ambiguous-path"

// requestPath is the path of r as the client sent it, escapes intact.
// url.URL keeps the raw form in RawPath whenever it is not the default
// encoding of Path, and EscapedPath is that default encoding otherwise.
func requestPath(rawPath, escapedPath string) string {
	if rawPath != "" {
		return rawPath
	}
	return escapedPath
}

// normalizePath returns the one form of the escaped path p that the
// gateway routes on and forwards, or why it refuses p.
func normalizePath(p string, pc PathConfig) (string, error) {
	if plainPath(p) {
		return p, nil // most paths: already normal, no allocation
	}
	return normalizeSlow(p, pc)
}

// plainPath says p is in normal form for sure: only characters kept as
// they are, no escape, no ';', no empty or dot segment and no segment
// ending in '.'. Anything else takes the slow path, which decides.
func plainPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; !(c == '/' || unreserved(c) || strings.IndexByte("!$&'()*+,=:@", c) >= 0) {
			return false
		}
	}
	return !strings.Contains(p, "//") && !strings.Contains(p, "/.") && !strings.Contains(p, "./") && !strings.HasSuffix(p, ".")
}

func normalizeSlow(p string, pc PathConfig) (string, error) {
	if p == "" {
		return "/", nil
	}
	if p[0] != '/' {
		return "", errAmbiguousPath("the path must start with /")
	}
	var b strings.Builder
	b.Grow(len(p))
	decoded := make([]byte, 0, len(p)) // for the UTF-8 check
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%':
			if i+2 >= len(p) || !ishex(p[i+1]) || !ishex(p[i+2]) {
				return "", errAmbiguousPath("a '%' that starts no escape")
			}
			d := unhex(p[i+1])<<4 | unhex(p[i+2])
			i += 2
			switch {
			case d == '/' || d == '\\':
				return "", errAmbiguousPath("an encoded slash or backslash")
			case d < 0x20 || d == 0x7f:
				return "", errAmbiguousPath("an encoded NUL or control character")
			case d == '%' && i+2 < len(p) && ishex(p[i+1]) && ishex(p[i+2]):
				return "", errAmbiguousPath("a double-encoded escape")
			case unreserved(d):
				b.WriteByte(d)
			default:
				writeEscape(&b, d)
			}
			decoded = append(decoded, d)
		case c == '\\':
			return "", errAmbiguousPath("a backslash")
		case c < 0x20 || c == 0x7f:
			return "", errAmbiguousPath("a control character")
		case c == ';' && !pc.AllowParams:
			return "", errAmbiguousPath("a ';' path parameter")
		case c == '/' || c == ';' || unreserved(c) || strings.IndexByte("!$&'()*+,=:@", c) >= 0:
			b.WriteByte(c)
			decoded = append(decoded, c)
		default:
			writeEscape(&b, c)
			decoded = append(decoded, c)
		}
	}
	if !utf8.Valid(decoded) {
		return "", errAmbiguousPath("bytes that are not UTF-8")
	}
	return resolveSegments(b.String())
}

// resolveSegments resolves dot segments and merges empty ones in an
// escaped path that starts with '/'.
func resolveSegments(p string) (string, error) {
	trailing := strings.HasSuffix(p, "/")
	var out []string
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		last := i == len(segs)-1
		switch {
		case s == "":
			continue
		case s == ".":
			trailing = trailing || last
		case s == "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			trailing = trailing || last
		case strings.HasSuffix(paramless(s), "."):
			return "", errAmbiguousPath("a segment ending in '.'")
		case strings.HasSuffix(paramless(s), "%20"):
			// Windows trims trailing spaces from a name as it trims dots.
			return "", errAmbiguousPath("a segment ending in a space")
		default:
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return "/", nil
	}
	n := "/" + strings.Join(out, "/")
	if trailing {
		n += "/"
	}
	return n, nil
}

// paramless is a segment without its ";params".
func paramless(seg string) string {
	if i := strings.IndexByte(seg, ';'); i >= 0 {
		return seg[:i]
	}
	return seg
}

// routePath is the path routes match: the normalised path without
// ";params" (when they are allowed), lower-cased under ignore_case.
func routePath(p string, pc PathConfig) string {
	if pc.AllowParams && strings.IndexByte(p, ';') >= 0 {
		segs := strings.Split(p, "/")
		for i, s := range segs {
			segs[i] = paramless(s)
		}
		p = strings.Join(segs, "/")
	}
	if pc.IgnoreCase {
		p = strings.ToLower(p)
	}
	return p
}

// joinPath puts the normalised path p below an upstream's escaped base
// path, and returns it decoded too, for URL.Path and URL.RawPath.
func joinPath(base, p string) (decoded, escaped string) {
	escaped = strings.TrimSuffix(base, "/") + p
	// Both halves are valid escaped paths (a URL's EscapedPath and
	// normalizePath's result), so unescaping cannot fail.
	decoded, _ = url.PathUnescape(escaped)
	return decoded, escaped
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

func writeEscape(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}
