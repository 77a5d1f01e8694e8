package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// prefetchBytes is how much of a chunked body the gateway reads before it
// decides the request. Chunked framing can break anywhere in a body, and
// once the head is upstream and the caller charged, a break is only a 400
// the caller paid for and a request the upstream began. Read first, a
// body this short that breaks never leaves the gateway and costs the
// caller's limits nothing; a longer one streams as it comes, and breaking
// past this point is charged. A body with a Content-Length cannot break
// (it can only end early, which is the client's leaving).
const prefetchBytes = 64 << 10

// prefetch reads the start of r's chunked body, up to prefetchBytes,
// before the request is decided, and puts it back in front of the rest:
// the problem to refuse the request with (before its decision) when the
// body is malformed within it, makes no progress for idle, or is longer
// than maxBody; nil to go on. It reads nothing of a body the client sends
// only after "100 Continue": reading would ask for it before the decision,
// so a denied client would upload for nothing.
func prefetch(w http.ResponseWriter, r *http.Request, maxBody int64, idle time.Duration) *problem {
	if len(r.TransferEncoding) == 0 || r.Body == nil || r.Body == http.NoBody || upgradeOf(r.Header) != "" || expectsContinue(r.Header) {
		return nil
	}
	_, p := readAhead(w, r, min(prefetchBytes, maxBody), maxBody, idle)
	return p
}

// readAhead reads up to limit bytes of r's body and puts them back in
// front of the rest: the problem to refuse the request with (before its
// decision) when the body is malformed within them, makes no progress
// for idle, or is longer than maxBody; else the bytes read.
func readAhead(w http.ResponseWriter, r *http.Request, limit, maxBody int64, idle time.Duration) ([]byte, *problem) {
	var buf bytes.Buffer
	// Each read gets the whole idle timeout, as the proxied body's do
	// (see deadlines): the listener's is a total from the request's start.
	rc := http.NewResponseController(w)
	n, err := buf.ReadFrom(&idleReader{r: io.LimitReader(r.Body, limit+1), idle: idle, rc: rc})
	switch {
	case err != nil && isTimeout(err):
		return nil, &problem{Type: probClientTimeout, Status: http.StatusRequestTimeout,
			Detail: "The request body could not be read from the client in time."}
	case err != nil:
		return nil, &problem{Type: probBadRequest, Status: http.StatusBadRequest,
			Detail: "The request body's framing is malformed (its chunked encoding), or the body ended early."}
	case n > maxBody:
		return nil, &problem{Type: probBodyTooLarge, Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("The request body is larger than %d bytes.", maxBody)}
	}
	r.Body = &prefetched{Reader: io.MultiReader(bytes.NewReader(buf.Bytes()), r.Body), body: r.Body}
	return buf.Bytes(), nil
}

// prefetchReasons are rejected_total's reasons of prefetch's refusals.
var prefetchReasons = map[int]string{
	http.StatusBadRequest:            "malformed_body",
	http.StatusRequestTimeout:        "client_timeout",
	http.StatusRequestEntityTooLarge: "body_too_large",
}

// expectsContinue says the client waits for "100 Continue" before it
// sends the body.
func expectsContinue(h http.Header) bool {
	for _, v := range h["Expect"] {
		if strings.EqualFold(strings.TrimSpace(v), "100-continue") {
			return true
		}
	}
	return false
}

// prefetched is a body whose start was read ahead, closed as the body.
type prefetched struct {
	io.Reader
	body io.ReadCloser
}

func (p *prefetched) Close() error { return p.body.Close() }

// idleReader sets the connection's read deadline idle ahead before every
// read of r.
type idleReader struct {
	r    io.Reader
	idle time.Duration
	rc   *http.ResponseController
}

func (i *idleReader) Read(p []byte) (int, error) {
	if i.idle > 0 {
		_ = i.rc.SetReadDeadline(time.Now().Add(i.idle))
	}
	return i.r.Read(p)
}
