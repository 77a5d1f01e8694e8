package boot

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// CheckTimeout bounds each link's start-up check: long enough for a TLS
// handshake and a SCRAM exchange on a slow network, short enough that a
// process that cannot start says so at once.
const CheckTimeout = 5 * time.Second

// The kinds of a failed start-up check (errors.Is). ErrAuth, ErrTLS,
// ErrProtocol and ErrRedirect are configuration problems that waiting will not fix: the
// processes refuse to start on them. ErrUnavailable (refused, timed out,
// anything else) may be a server that is still coming up or down for a
// while; each process decides (the gateway starts and lets its failure
// policy cover, the consumer retries).
var (
	ErrAuth        = errors.New("authentication failed")
	ErrTLS         = errors.New("TLS handshake")
	ErrProtocol    = errors.New("the server dropped the connection (does it require TLS, or SASL?)")
	ErrUnavailable = errors.New("unavailable")
	// ErrRedirect: an HTTP link answered with a redirect, which is not
	// followed; the URL to configure is the one it points to.
	ErrRedirect = errors.New("redirected (not followed: configure the URL it points to)")
)

// LinkError is a failed start-up check of one link: which link, what kind
// of failure, and the driver's own words, in one line such as
//
//	redis (127.0.0.1:6390): authentication failed: WRONGPASS invalid username-password pair
type LinkError struct {
	// Link names the link and its address, such as "redis (127.0.0.1:6390)".
	Link string
	// Kind is one of ErrAuth, ErrTLS, ErrProtocol, ErrRedirect or
	// ErrUnavailable.
	Kind error
	// Err is the driver's error.
	Err error
}

func (e *LinkError) Error() string {
	if errors.Is(e.Kind, ErrProtocol) {
		return e.Link + ": " + e.Kind.Error() + ": " + e.Err.Error()
	}
	return e.Link + ": " + e.Kind.Error() + ": " + rootCause(e.Err)
}

// Unwrap gives errors.Is both the kind and the driver's error.
func (e *LinkError) Unwrap() []error { return []error{e.Kind, e.Err} }

// Fatal reports whether err (from a link check) is a configuration problem
// rather than a server that is not up.
func Fatal(err error) bool {
	return err != nil && !errors.Is(err, ErrUnavailable)
}

// linkError classifies err from checking link; isAuth recognises the
// link's own "wrong credentials" errors. Nil stays nil.
func linkError(link string, err error, isAuth func(error) bool) error {
	if err == nil {
		return nil
	}
	kind := ErrUnavailable
	switch {
	case isTLSError(err),
		// net/http's word for a TLS handshake answered in plain HTTP.
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		kind = ErrTLS
	case isAuth(err):
		kind = ErrAuth
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed),
		// franz-go's reading of a TLS alert sent to a plaintext client.
		strings.Contains(err.Error(), "speaking to a tls endpoint"):
		kind = ErrProtocol
	}
	return &LinkError{Link: link, Kind: kind, Err: err}
}

// isTLSError: the certificate did not verify, the peer refused ours, or
// the server does not speak TLS.
func isTLSError(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &record) || errors.As(err, &alert) {
		return true
	}
	// Some drivers flatten their errors with %v; their text still says.
	s := err.Error()
	return strings.Contains(s, "x509: ") || strings.Contains(s, "tls: ")
}

// rootCause drops the layers drivers add ("dial tcp 127.0.0.1:1: ...",
// "ping: ...") when the cause is a TLS error, whose own text is clearest;
// other errors print whole.
func rootCause(err error) string {
	s := err.Error()
	if i := strings.Index(s, "x509: "); i >= 0 {
		return s[i:]
	}
	if i := strings.Index(s, "tls: "); i >= 0 {
		return s[i:]
	}
	return s
}

// checkContext is ctx bounded by CheckTimeout.
func checkContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, CheckTimeout)
}
