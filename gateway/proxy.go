package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/gateway/bodyscan"
)

// upstream proxies to one service. It survives reloads that leave its
// URL and timeouts alone, keeping its idle connections warm.
type upstream struct {
	name      string
	cfg       Upstream
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	m         *metrics
}

// proxyInfo travels with a proxied request, for Rewrite and ErrorHandler.
type proxyInfo struct {
	route string
	// path is the normalised path the route was chosen by; it is the one
	// forwarded.
	path        string
	peerTrusted bool
	// trustedHops: the peer is a proxy by trusted_hops (see setForwarded).
	trustedHops bool
	strip       headerSet
	body        *bodyReader
	// tokens, on a token route, reads the answer's usage.
	tokens *tokenUse
}

type proxyInfoKey struct{}

func newUpstream(name string, cfg Upstream, m *metrics, log *slog.Logger) *upstream {
	target, _ := url.Parse(cfg.URL) // validated
	u := &upstream{name: name, cfg: cfg, m: m}
	u.transport = &http.Transport{
		Proxy: nil, // never route through the environment's proxy
		DialContext: (&net.Dialer{
			Timeout:   cfg.ConnectTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSHandshakeTimeout: cfg.ConnectTimeout,
		// Past this the client gets 504; the body may then stream as long
		// as the write timeout allows.
		ResponseHeaderTimeout: cfg.Timeout,
		ExpectContinueTimeout: time.Second,
		// Many concurrent requests go to few hosts; the default of 2 idle
		// connections per host would make most requests dial.
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	u.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			info, _ := pr.In.Context().Value(proxyInfoKey{}).(*proxyInfo)
			pr.SetURL(target)
			if info != nil {
				// Exactly the path decided on, never the client's spelling.
				pr.Out.URL.Path, pr.Out.URL.RawPath = joinPath(target.EscapedPath(), info.path)
			}
			if info == nil {
				pr.SetXForwarded()
				return
			}
			setForwarded(pr, info)
		},
		Transport: u.transport,
		ModifyResponse: func(resp *http.Response) error {
			scrubRate(resp.Header) // the gateway's values are the true ones
			if resp.StatusCode != http.StatusSwitchingProtocols && (resp.ContentLength < 0 || len(resp.Trailer) > 0) {
				// Trailers too: ReverseProxy passes on every one the
				// body ends with, declared or not, and the client got
				// the upstream's X-RateLimit-Remaining beside ours. (A
				// 101's body is the tunnel, which ReverseProxy needs
				// unwrapped.)
				scrubRate(resp.Trailer)
				resp.Body = &trailerScrub{ReadCloser: resp.Body, resp: resp}
			}
			if info, _ := resp.Request.Context().Value(proxyInfoKey{}).(*proxyInfo); info != nil && info.tokens != nil {
				info.tokens.onResponse(resp)
			}
			return nil
		},
		ErrorHandler: u.fail,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		// Without a pool every proxied response allocates (and clears) a
		// fresh 32 KiB copy buffer: most of the proxy path's garbage.
		BufferPool: copyBuffers,
	}
	return u
}

// trailerScrub removes the rate-limit headers from its response's
// trailers, which the transport fills in as the body ends: before
// ReverseProxy, having copied the body, sends them on.
type trailerScrub struct {
	io.ReadCloser
	resp *http.Response
}

func (t *trailerScrub) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err != nil {
		scrubRate(t.resp.Trailer)
	}
	return n, err
}

func scrubRate(h http.Header) {
	for _, k := range rateHeaders {
		delete(h, k)
	}
}

// copyBuffers lends ReverseProxy its body copy buffers, shared by every
// upstream. A sync.Pool holds no more than the proxies in flight use, so
// it is bounded by the connection cap.
var copyBuffers = &bufferPool{}

// copyBufferSize is ReverseProxy's own default.
const copyBufferSize = 32 << 10

// bufferPool pools arrays, not slices: a slice put into a sync.Pool would
// allocate its header on every Put.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return buf[:]
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	b.p.Put((*[copyBufferSize]byte)(buf[:copyBufferSize]))
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request, info *proxyInfo) {
	r = r.WithContext(context.WithValue(r.Context(), proxyInfoKey{}, info))
	u.proxy.ServeHTTP(w, r)
}

// fail answers a proxied request that got no response: 504 when the
// upstream was too slow, 502 when it could not be reached or answered
// garbage, 413/408/400 when the client's body was too large, too slow or
// malformed.
func (u *upstream) fail(w http.ResponseWriter, r *http.Request, err error) {
	info, _ := r.Context().Value(proxyInfoKey{}).(*proxyInfo)
	route := ""
	var bodyErr error
	if info != nil {
		route = info.route
		bodyErr = info.body.error()
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge) || errors.As(bodyErr, &tooLarge):
		u.m.upstreamErrors.WithLabelValues(route, "client_body").Inc()
		writeProblem(w, problem{Type: probBodyTooLarge, Status: http.StatusRequestEntityTooLarge, Route: route,
			Detail: "The request body is larger than this gateway accepts."})
	case errors.As(bodyErr, new(*bodyscan.Refusal)):
		refuseBody(w, u.m, route, bodyErr)
	case bodyErr != nil && isTimeout(bodyErr):
		u.m.upstreamErrors.WithLabelValues(route, "client_body").Inc()
		writeProblem(w, problem{Type: probClientTimeout, Status: http.StatusRequestTimeout, Route: route,
			Detail: "The request body could not be read from the client in time."})
	case bodyErr != nil:
		// Malformed chunked framing or a body cut short: the client's
		// fault, and the connection cannot carry another request.
		u.m.upstreamErrors.WithLabelValues(route, "client_body").Inc()
		w.Header()["Connection"] = []string{"close"}
		writeProblem(w, problem{Type: probBadRequest, Status: http.StatusBadRequest, Route: route,
			Detail: "The request body is malformed (e.g. its chunked encoding) or ended early."})
	case errors.Is(context.Cause(r.Context()), errIdle):
		u.m.upstreamErrors.WithLabelValues(route, "idle").Inc()
		writeProblem(w, problem{Type: probClientTimeout, Status: http.StatusRequestTimeout, Route: route,
			Detail: "The request made no progress in time."})
	case errors.Is(r.Context().Err(), context.Canceled):
		// The client went away; nobody reads this. 499 as nginx counts it.
		u.m.upstreamErrors.WithLabelValues(route, "client_gone").Inc()
		w.WriteHeader(499)
	case isTimeout(err):
		u.m.upstreamErrors.WithLabelValues(route, "timeout").Inc()
		writeProblem(w, problem{Type: probUpstreamSlow, Status: http.StatusGatewayTimeout, Route: route, Upstream: u.name,
			Detail: "The upstream service did not answer in time (timeout " + u.cfg.Timeout.String() + ")."})
	default:
		u.m.upstreamErrors.WithLabelValues(route, "unreachable").Inc()
		writeProblem(w, problem{Type: probUpstreamDown, Status: http.StatusBadGateway, Route: route, Upstream: u.name,
			Detail: "The upstream service could not be reached or sent an invalid response."})
	}
}

// refuseBody answers a request whose body the gateway refused (a
// *bodyscan.Refusal), before or while it streamed upstream: after the
// decision, so with its rate-limit headers, and counted by its reason.
func refuseBody(w http.ResponseWriter, m *metrics, route string, err error) {
	var refused *bodyscan.Refusal
	if !errors.As(err, &refused) {
		refused = bodyscan.ErrMalformed
	}
	m.rejected.WithLabelValues(refused.Reason).Inc()
	typ, ok := bodyProblems[refused.Reason]
	if !ok {
		typ = probBadRequest
	}
	writeProblem(w, problem{Type: typ, Status: refused.Status, Detail: refused.Detail, Route: route})
}

// bodyProblems are the problem types of the body refusals that are not
// plain bad requests.
var bodyProblems = map[string]string{
	"ambiguous_key":        probBodyKey,
	"body_too_large":       probBodyTooLarge,
	"unsupported_charset":  probUnsupportedCharset,
	"unsupported_encoding": probUnsupportedEncoding,
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// bodyReader remembers the first error reading the client's body, so a
// failed proxy call can blame the client rather than the upstream.
type bodyReader struct {
	rc  io.ReadCloser
	dl  *deadlines
	mu  sync.Mutex
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 || err == io.EOF {
		b.dl.readProgress(err == io.EOF)
	}
	if err != nil && err != io.EOF {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *bodyReader) Close() error { return b.rc.Close() }

func (b *bodyReader) error() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// progressBody pushes the read deadline out on every read of the client's
// body that makes progress.
type progressBody struct {
	io.ReadCloser
	dl *deadlines
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.dl.readProgress(false)
	}
	return n, err
}
