package gateway

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
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
// Serve the Server's listener through it: srv.Serve(g.Listener(ln)).
func (g *Gateway) Listener(ln net.Listener) net.Listener { return framingListener{ln} }

type framingListener struct{ net.Listener }

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &framingConn{Conn: c}, nil
}

// framingConn scans what is read for header blocks that hold both a
// Content-Length and a Transfer-Encoding line. It does not know where
// heads end and bodies begin, so a body could look like such a block;
// that only costs the connection's keep-alive (and a 400 for a chunked
// request on it), never a request that is framed one way.
type framingConn struct {
	net.Conn
	tail  []byte // the end of the last read, for lines split across reads
	cl    bool   // the current block has a Content-Length line
	te    bool   // and a Transfer-Encoding line
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

// probMethodNotAllowed is the problem type of CONNECT.
const probMethodNotAllowed = "urn:edgelimit:problem:method-not-allowed"

// guard answers, before echo, what is wrong with a request as a message
// rather than as a call: CONNECT (echo's router has no path to match in
// an authority-form target and would answer 404), a target without a path
// ("GET a:b", "GET *"; an absolute URI's empty path is "/"), a chunked
// request whose head also had a Content-Length, and an HTTP/1.0 request
// with a Transfer-Encoding, which RFC 9112 §6.1 says to treat as faulty
// framing even with a Content-Length (400 each, and the connection
// closed).
func (g *Gateway) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect:
			w.Header()["Allow"] = []string{"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"}
			writeProblem(w, problem{Type: probMethodNotAllowed, Status: http.StatusMethodNotAllowed,
				Detail: "This gateway is not a forward proxy: CONNECT is not served."})
		case mixedFraming(r) && len(r.TransferEncoding) > 0:
			g.m.rejected.WithLabelValues("mixed_framing").Inc()
			w.Header()["Connection"] = []string{"close"}
			writeProblem(w, problem{Type: probBadRequest, Status: http.StatusBadRequest,
				Detail: "The request has both Content-Length and Transfer-Encoding."})
		case r.URL.Opaque != "" || r.URL.Path != "" && r.URL.Path[0] != '/':
			// "GET a:b", "GET *": no path to route on.
			g.m.rejected.WithLabelValues("bad_path").Inc()
			writeProblem(w, problem{Type: probBadPath, Status: http.StatusBadRequest,
				Detail: "The request target must be a path, or an absolute URI with one."})
		case !r.ProtoAtLeast(1, 1) && sawTransferEncoding(r):
			g.m.rejected.WithLabelValues("http10_transfer_encoding").Inc()
			w.Header()["Connection"] = []string{"close"}
			writeProblem(w, problem{Type: probBadRequest, Status: http.StatusBadRequest,
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
