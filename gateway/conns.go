package gateway

import (
	"net"
	"net/http"
	"sync/atomic"
)

// DefaultMaxConnections caps the traffic listener's open connections.
const DefaultMaxConnections = 10000

// connLimit caps open connections from http.Server's ConnState hook: a
// connection accepted over the cap is closed at once, before a byte of it
// is read, so a flood of idle or slow connections cannot take every file
// descriptor (and the gateway's memory) from the clients that send
// requests. Upgraded connections (tunnels) count until the tunnel ends:
// the proxy hands their slot back, since net/http no longer sees them.
type connLimit struct {
	max     int64
	open    atomic.Int64
	refused func()
}

func (l *connLimit) state(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		if l.open.Add(1) > l.max {
			l.refused()
			_ = c.Close() // net/http then reports StateClosed
		}
	case http.StateClosed:
		l.open.Add(-1)
	}
}

// tunnelClosed hands back the slot of a hijacked connection.
func (l *connLimit) tunnelClosed() { l.open.Add(-1) }
