package gateway

import (
	"bufio"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// interimWriter is the ResponseWriter the reverse proxy writes to. It
// passes an upstream's interim (1xx) responses to the client without
// committing the final one, which echo's Response would otherwise do on
// the first WriteHeader: the client then got the 1xx and a 200 whatever
// the upstream's final status, and metrics counted 103.
//
// The proxy puts each 1xx's headers into Header() and clears that map
// after WriteHeader; so until the final status, Header() is a map of the
// writer's own, and the rate-limit headers already set on the response
// survive to the final one instead of being cleared or sent on a 1xx.
type interimWriter struct {
	resp  *echo.Response
	dl    *deadlines
	h     http.Header // until the final WriteHeader
	final bool
	// hijacked says the connection became a tunnel.
	hijacked bool
}

func newInterimWriter(resp *echo.Response, dl *deadlines) *interimWriter {
	return &interimWriter{resp: resp, dl: dl, h: http.Header{}}
}

func (w *interimWriter) Header() http.Header {
	if w.final {
		// Trailers are set after the final header, on the real map.
		return w.resp.Header()
	}
	return w.h
}

func (w *interimWriter) WriteHeader(code int) {
	if w.final {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.interim(code)
		return
	}
	w.final = true
	real := w.resp.Header()
	for k, v := range w.h {
		real[k] = v
	}
	w.resp.WriteHeader(code)
}

// interim sends a 1xx with exactly the upstream's headers for it. A 100
// Continue is the upstream's answer to the gateway's Expect, not the
// client's: net/http sends the client its own 100 when the body is first
// read, so the upstream's is dropped rather than sent twice.
func (w *interimWriter) interim(code int) {
	defer clear(w.h)
	if code == http.StatusContinue {
		return
	}
	real := w.resp.Header()
	saved := real.Clone()
	clear(real)
	for k, v := range w.h {
		real[k] = v
	}
	// Below echo, so the response stays uncommitted for the final status.
	w.resp.Writer.WriteHeader(code)
	clear(real)
	for k, v := range saved {
		real[k] = v
	}
}

func (w *interimWriter) Write(b []byte) (int, error) {
	w.dl.wrote(time.Now())
	if !w.final {
		w.WriteHeader(http.StatusOK)
	}
	return w.resp.Write(b)
}

// Hijack takes over the connection for a 101's tunnel. The proxy then
// writes the 101 itself with Header(), which from now on is the response's
// own map, rate-limit headers included.
func (w *interimWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if !w.final {
		w.final = true
		real := w.resp.Header()
		for k, v := range w.h {
			real[k] = v
		}
	}
	conn, brw, err := http.NewResponseController(w.resp).Hijack()
	w.hijacked = err == nil
	return conn, brw, err
}

// Unwrap gives http.ResponseController (the proxy's flushes, a 101's
// hijack) the response underneath.
func (w *interimWriter) Unwrap() http.ResponseWriter { return w.resp }
