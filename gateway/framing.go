package gateway

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// Listener wraps the traffic listener so the gateway can see what
// net/http hides from handlers: a request head with both Content-Length
// and Transfer-Encoding. net/http drops the Content-Length and reads the
// body chunked, as RFC 9112 §6.1 allows, but keeps the connection; the
// RFC says to close it, because a proxy in front may have framed the
// same bytes by Content-Length, and what follows on the connection is
// then a request that proxy never saw (request smuggling). Such a
// request gets 400 and the connection is closed.
//
// It also turns the answers net/http writes by itself, before any
// handler runs, into problem bodies (see framingConn.Write).
//
// Serve the Server's listener through it: srv.Serve(g.Listener(ln)).
func (g *Gateway) Listener(ln net.Listener) net.Listener { return framingListener{ln, g} }

type framingListener struct {
	net.Listener
	g *Gateway
}

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &framingConn{Conn: c, g: l.g}, nil
}

// framingConn scans what is read for header blocks that hold both a
// Content-Length and a Transfer-Encoding line. It does not know where
// heads end and bodies begin, so a body could look like such a block;
// that only costs the connection's keep-alive (and a 400 for a chunked
// request on it), never a request that is framed one way.
type framingConn struct {
	net.Conn
	g     *Gateway // counts the answers Write rewrites; nil in unit tests
	tail  []byte   // the end of the last read, for lines split across reads
	cl    bool     // the current block has a Content-Length line
	te    bool     // and a Transfer-Encoding line
	mixed atomic.Bool
	// sawTE: some block had a Transfer-Encoding line. net/http drops the
	// header of an HTTP/1.0 request without a trace and frames the body
	// by Content-Length (none: empty), where a proxy in front may have
	// read it chunked.
	sawTE atomic.Bool
}

var (
	lineCL = []byte("\ncontent-length:")
	lineTE = []byte("\ntransfer-encoding:")
)

func (c *framingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.mixed.Load() {
		c.scan(p[:n])
	}
	return n, err
}

// scan looks at each line start ('\n') of what was read: an empty line
// ends a block, a Content-Length or Transfer-Encoding line marks it.
func (c *framingConn) scan(b []byte) {
	buf := append(c.tail, b...)
	keep := max(0, len(buf)-3) // enough to tell an empty line split across reads
	for from := 0; ; {
		j := bytes.IndexByte(buf[from:], '\n')
		if j < 0 {
			break
		}
		i := from + j
		from = i + 1
		rest := buf[i:]
		if len(rest) < len(lineTE) && bytes.IndexByte(rest[1:], '\n') < 0 {
			keep = max(0, i-3) // too short to tell yet: scan it again with more
			break
		}
		prev := i - 1
		if prev >= 0 && buf[prev] == '\r' {
			prev--
		}
		if prev >= 0 && buf[prev] == '\n' {
			c.cl, c.te = false, false // an empty line: the block ended
		}
		c.cl = c.cl || hasPrefixFold(rest, lineCL)
		if hasPrefixFold(rest, lineTE) {
			c.te = true
			c.sawTE.Store(true)
		}
		if c.cl && c.te {
			c.mixed.Store(true)
			return
		}
	}
	c.tail = append(c.tail[:0], buf[keep:]...)
}

// netHTTPErrorHeaders is what follows the status line of every answer
// net/http writes on the connection itself, when it could not read a
// request to hand a handler (src/net/http/server.go, conn.serve).
var netHTTPErrorHeaders = []byte("\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")

// Write sends what net/http writes, except its own plain-text error
// answers, which it writes in one call straight to the connection: a head
// it cannot parse (400, "missing required Host header", a bad header
// line, HTTP/0.9), headers over max_header_bytes (431), a transfer coding
// it does not know (501). Those become problem bodies like every other
// answer of the gateway, and are counted in rejected_total. No handler's
// answer has that shape: net/http gives each a Date header.
func (c *framingConn) Write(p []byte) (int, error) {
	status, text, ok := netHTTPError(p)
	if !ok {
		return c.Conn.Write(p)
	}
	typ, reason, detail := probBadRequest, "malformed_request", "The request could not be read as HTTP/1.1 (a malformed request line or header field)."
	if why, ok := strings.CutPrefix(text, http.StatusText(status)+": "); ok {
		detail = "The request could not be read as HTTP/1.1: " + why + "."
	}
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		typ, reason, detail = probHeadersTooLarge, "headers_too_large", "The request's header fields are larger than this gateway reads."
	case http.StatusNotImplemented:
		typ, reason, detail = probBadRequest, "unsupported_transfer_encoding", "The request's Transfer-Encoding is not one this gateway reads (only chunked is)."
	}
	if c.g != nil {
		c.g.m.rejected.WithLabelValues(reason).Inc()
	}
	body := appendProblem(nil, &problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail})
	out := make([]byte, 0, 192+len(body))
	out = append(out, "HTTP/1.1 "...)
	out = strconv.AppendInt(out, int64(status), 10)
	out = append(out, ' ')
	out = append(out, http.StatusText(status)...)
	out = append(out, "\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	out = append(out, "\r\nContent-Type: application/problem+json\r\n\r\n"...)
	if _, err := c.Conn.Write(append(out, body...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// netHTTPError reads p as one of net/http's own error answers: its status
// and its body after the status code ("Bad Request: missing required
// Host header" for a 400 that says why).
func netHTTPError(p []byte) (status int, text string, ok bool) {
	rest, found := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !found || len(rest) < 4 || rest[3] != ' ' {
		return 0, "", false
	}
	line, body, found := bytes.Cut(rest, netHTTPErrorHeaders)
	if !found || bytes.ContainsAny(line, "\r\n") || bytes.ContainsAny(body, "\r\n") {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(rest[:3]))
	if err != nil || status < 400 || status > 599 {
		return 0, "", false
	}
	text = string(bytes.TrimPrefix(body, rest[:4]))
	return status, text, true
}

// CloseWrite half-closes the connection as the TCP connection would:
// net/http does so before closing after an error answer (e.g. 431), so
// that the client reads the answer instead of a reset.
func (c *framingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps the TCP connection's sendfile path for responses; only
// reads are scanned.
func (c *framingConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

func hasPrefixFold(b, prefix []byte) bool {
	return len(b) >= len(prefix) && bytes.EqualFold(b[:len(prefix)], prefix)
}

// Problem types of the answers the listener and guard give.
const (
	// probMethodNotAllowed is CONNECT's, and TRACE's where no route
	// lists it.
	probMethodNotAllowed = "urn:edgelimit:problem:method-not-allowed"
	// probHeadersTooLarge is a head over max_header_bytes.
	probHeadersTooLarge = "urn:edgelimit:problem:headers-too-large"
)

// guard answers, before echo, what is wrong with a request as a message
// rather than as a call ("OPTIONS *" too, which is none): CONNECT (echo's router has no path to match in
// an authority-form target and would answer 404), a target without a path
// ("GET a:b", "GET *"; an absolute URI's empty path is "/"), a chunked
// request whose head also had a Content-Length, and an HTTP/1.0 request
// with a Transfer-Encoding, which RFC 9112 §6.1 says to treat as faulty
// framing even with a Content-Length (400 each, and the connection
// closed). Each is charged like the handler's refusals (see
// chargeRefused).
func (g *Gateway) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect:
			w.Header()["Allow"] = []string{allowedMethods}
			g.refuse(w, r, g.st.Load(), "", "", problem{Type: probMethodNotAllowed, Status: http.StatusMethodNotAllowed,
				Detail: "This gateway is not a forward proxy: CONNECT is not served."})
		case r.Method == http.MethodOptions && r.RequestURI == "*":
			g.serverOptions(w, r)
		case mixedFraming(r) && len(r.TransferEncoding) > 0:
			w.Header()["Connection"] = []string{"close"}
			g.refuse(w, r, g.st.Load(), "mixed_framing", "", problem{Type: probBadRequest, Status: http.StatusBadRequest,
				Detail: "The request has both Content-Length and Transfer-Encoding."})
		case r.URL.Opaque != "" || r.URL.Path != "" && r.URL.Path[0] != '/':
			// "GET a:b", "GET *": no path to route on.
			g.refuse(w, r, g.st.Load(), "bad_path", "", problem{Type: probBadPath, Status: http.StatusBadRequest,
				Detail: "The request target must be a path, or an absolute URI with one."})
		case !r.ProtoAtLeast(1, 1) && sawTransferEncoding(r):
			w.Header()["Connection"] = []string{"close"}
			g.refuse(w, r, g.st.Load(), "http10_transfer_encoding", "", problem{Type: probBadRequest, Status: http.StatusBadRequest,
				Detail: "An HTTP/1.0 request cannot use Transfer-Encoding."})
		default:
			if r.URL.Path == "" {
				// "GET http://host": an empty path is "/" (RFC 9112
				// §3.2.2); echo's router found no route for it.
				r.URL.Path, r.URL.RawPath = "/", ""
			}
			if mixedFraming(r) {
				// Whatever else came on this connection ends with it.
				w.Header()["Connection"] = []string{"close"}
			}
			next.ServeHTTP(w, r)
		}
	})
}

// serverOptions answers "OPTIONS *", a question about the server rather
// than a resource, as net/http's own handler does (200, no body), but
// charged like guard's refusals: net/http answered it before any handler,
// the one answer of the traffic listener without rate-limit headers, and
// free at line rate (Server sets DisableGeneralOptionsHandler).
func (g *Gateway) serverOptions(w http.ResponseWriter, r *http.Request) {
	if d := g.chargeRefused(w.Header(), r, g.st.Load(), ""); d != nil {
		writeProblem(w, *d)
		return
	}
	w.Header()["Allow"] = []string{allowedMethods}
	w.Header()["Content-Length"] = []string{"0"}
	w.WriteHeader(http.StatusOK)
}

// allowedMethods are the methods the gateway serves on any route: the
// Allow header of its 405s and of "OPTIONS *".
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// isTrace says method is TRACE, or IIS's TRACK, in any case (an upstream
// may upper-case it, see allowsMethod): a server that answers either
// echoes the request back, its Cookie and Authorization included, which
// cross-site tracing turns against the caller. The gateway passes them
// on only on a route that lists them.
func isTrace(method string) bool {
	return strings.EqualFold(method, http.MethodTrace) || strings.EqualFold(method, "TRACK")
}

type framingConnKey struct{}

// connContext gives handlers their connection's framingConn.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if fc, ok := c.(*framingConn); ok {
		return context.WithValue(ctx, framingConnKey{}, fc)
	}
	return ctx
}

// mixedFraming says whether r came on a connection that sent a head with
// both Content-Length and Transfer-Encoding.
func mixedFraming(r *http.Request) bool {
	fc := framingOf(r)
	return fc != nil && fc.mixed.Load()
}

// sawTransferEncoding says whether r came on a connection that sent a
// Transfer-Encoding line. For an HTTP/1.0 request it may have been in an
// earlier request's head on the connection, or look like one in a body:
// either is no HTTP/1.0 client's way, and costs a 400, never a request
// framed two ways.
func sawTransferEncoding(r *http.Request) bool {
	fc := framingOf(r)
	return fc != nil && fc.sawTE.Load()
}

// framingOf is the framingConn r came on; nil when the listener was not
// wrapped by Listener.
func framingOf(r *http.Request) *framingConn {
	fc, _ := r.Context().Value(framingConnKey{}).(*framingConn)
	return fc
}
