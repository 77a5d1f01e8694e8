package gateway

import (
	"io"
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
