package gateway

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"
)

// deadlines turns the listener's read and write timeouts into idle
// timeouts for one proxied request. net/http sets them once, as totals
// from the start of the request: an SSE stream was cut mid-stream at the
// write timeout and a slow but active upload got 408 at the read timeout.
// Here every read of the body that makes progress pushes both deadlines
// out again (the response is written after the upload), and every write
// of the response pushes the write deadline out; a stalled transfer is
// still cut after the timeout.
//
// Once the body is read (or when there is none) the read deadline is
// lifted: net/http then only reads to notice the client leaving, and a
// deadline there would cancel a streaming response; the write deadline
// and the upstream's timeout bound the rest.
//
// A deadline only fails a read or write that is attempted: a stream whose
// upstream stops sending attempts none. So an idle timer cancels the
// request when neither direction made progress for the write timeout;
// the upstream's own timeout (shorter, see Validate) bounds the wait for
// its response headers.
//
// The deadlines are wall-clock times on a real connection, so they read
// time.Now, not the gateway's injected clock. Each is pushed at most every
// 1/16 of its timeout, so a busy stream does not reset a timer per write.
// errIdle is the cause of a request canceled for making no progress.
var errIdle = errors.New("no progress within the timeout")

type deadlines struct {
	rc          *http.ResponseController
	read, write time.Duration
	lastRead    atomic.Int64 // unix nanoseconds of the last push
	lastWrite   atomic.Int64
	idle        *time.Timer // nil: not armed (a tunnel)
}

func newDeadlines(w http.ResponseWriter, t Timeouts) *deadlines {
	return &deadlines{rc: http.NewResponseController(w), read: t.Read, write: t.Write}
}

// arm starts the idle timer: cancel ends the request after the write
// timeout without progress. stop disarms it.
func (d *deadlines) arm(cancel func()) (stop func()) {
	// From now on the bounds are this exchange's (a route may set its
	// own), not the listener's totals from the start of the request.
	now := time.Now()
	_ = d.rc.SetReadDeadline(now.Add(d.read))
	_ = d.rc.SetWriteDeadline(now.Add(d.write))
	d.idle = time.AfterFunc(d.write, cancel)
	return func() { d.idle.Stop() }
}

// readProgress is called after a read of the body; eof at its end.
func (d *deadlines) readProgress(eof bool) {
	if eof {
		d.noRead()
		return
	}
	now := time.Now()
	if push(&d.lastRead, now, d.read) {
		_ = d.rc.SetReadDeadline(now.Add(d.read))
	}
	d.wrote(now)
}

// noRead lifts the read deadline: the body is done or there is none.
func (d *deadlines) noRead() { _ = d.rc.SetReadDeadline(time.Time{}) }

// wrote is called before a write of the response.
func (d *deadlines) wrote(now time.Time) {
	if push(&d.lastWrite, now, d.write) {
		_ = d.rc.SetWriteDeadline(now.Add(d.write))
		if d.idle != nil {
			d.idle.Reset(d.write)
		}
	}
}

func push(last *atomic.Int64, now time.Time, timeout time.Duration) bool {
	n := now.UnixNano()
	l := last.Load()
	return n-l >= int64(timeout/16) && last.CompareAndSwap(l, n)
}
