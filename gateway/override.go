package gateway

import (
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/edgelimit/edgelimit/gateway/bodyscan"
)

// A POST can name the method it is run as: Laravel and Spring read
// _method from the query, a form or (Laravel) a JSON body; Rails and
// ASP.NET from a form (ASP.NET MVC's field, as its query parameter, is
// X-HTTP-Method-Override); Express's method-override from the query
// (bodyscan.OverrideParams). Whether
// the upstream honours it is not known here, so a POST that names a
// method the gateway limits on another route is refused, rather than
// charged as a POST and run as, say, a DELETE. The override headers
// (X-HTTP-Method-Override, …) are stripped instead: see
// DefaultStripHeaders.

// overridden reports whether a POST's query names, as _method, a method
// whose route at p is not rt.
func (st *state) overridden(r *http.Request, p string, rt *route) bool {
	if r.URL.RawQuery == "" || !isPost(r.Method) {
		return false
	}
	other := false
	bodyscan.EachParam(r.URL.RawQuery, bodyscan.OverrideParams, func(m string) {
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
// *bodyscan.Refusal in place of the scanner.
func (st *state) scanBody(r *http.Request, body io.ReadCloser, p string, rt *route) (io.ReadCloser, error) {
	override := isPost(r.Method) && st.routedElsewhere(p, rt)
	keys := !rt.Exempt && len(st.keyParams) > 0
	if !override && !keys {
		return body, nil
	}
	names := st.bodyNames
	switch {
	case !keys:
		names = bodyscan.OverrideParams
	case !override:
		names = st.keyParams
	}
	var key string
	if keys {
		key, _ = apiKeyOf(r.Header, r.URL.RawQuery, st.keyParams, st.cfg.IgnoreBearer) // one key, or identify refused it
	}
	check := func(name, value string) error {
		switch {
		case override && slices.Contains(bodyscan.OverrideParams, name):
			if st.elsewhere(value, p, rt) {
				return bodyscan.ErrMethodOverride
			}
		case keys && slices.Contains(st.keyParams, name):
			// As oneValue compares keys; a value cut at MaxValue is no
			// key the request was charged to.
			if v := trimCredential(value); v != "" && (v != key || len(value) > bodyscan.MaxValue) {
				if key == "" {
					return bodyscan.ErrKeyOnly
				}
				return bodyscan.ErrKey
			}
		}
		return nil
	}
	return bodyscan.Scan(r.Header, r.Method, body, names, st.cfg.MaxBodyBytes, check)
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
