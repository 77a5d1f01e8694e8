package bodyscan

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Scan returns body wrapped in a scanner that reads it for the fields
// named names (normalised by ParamName), as the frameworks behind the
// gateway would read them, and ends the body with check's *Refusal for
// the first field it refuses. A body of a type no framework reads fields
// from is returned as it is. One the scan could not read to its end is
// refused as well: what the scan could not read, the upstream may. A
// body that cannot be read at all (two Content-Types, a charset or a
// coding the scanner does not read) is refused at once, a *Refusal in
// place of the scanner. Decoded, it is read up to maxBytes.
func Scan(h http.Header, method string, body io.ReadCloser, names []string, maxBytes int64, check func(name, value string) error) (io.ReadCloser, error) {
	types := h.Values("Content-Type")
	if len(types) > 1 && slices.ContainsFunc(types[1:], func(t string) bool { return t != types[0] }) {
		// One field (RFC 9110 §8.3), read here as the first; gunicorn's
		// WSGI environ keeps the last, Kestrel and Puma join them.
		return body, errContentTypes
	}
	contentType := h.Get("Content-Type")
	if contentType == "" && !strings.EqualFold(method, http.MethodPost) {
		return body, nil // only a POST is read as a form without a type (Rack)
	}
	parsers := bodyParsers(contentType, names)
	if len(parsers) == 0 {
		return body, nil
	}
	if err := checkCharset(contentType); err != nil {
		return body, err
	}
	decode, err := decoder(h.Values("Content-Encoding"), maxBytes)
	if err != nil {
		return body, err
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

// bodyScanner passes a body through while a scan reads it, and holds
// its last scanHold bytes back until the scan is done: the whole of a
// short body, and for a longer one what follows its last fields. PHP and
// Rails read a form only once the whole body is in, but Go's json.Decoder
// and multipart reader, and Jackson, stop at the end of the value or the
// closing delimiter: holding back only the last byte (a trailing newline,
// an epilogue, a gzip trailer) let such an upstream run the request with
// a key the scan then refused. The scan runs in a goroutine reading a
// pipe the scanner writes each chunk to, so memory stays bounded whatever
// the body's size; it ends when the body ends or is closed. Its error, a
// *Refusal, takes the held bytes' place.
type bodyScanner struct {
	body    io.ReadCloser
	pw      *io.PipeWriter
	done    chan error   // the scan's verdict
	pending bytes.Buffer // the held-back bytes
	eof     bool         // the body ended and the scan found nothing
	err     error
}

// scanHold is how much of a scanned body's end is held back until the
// scan's verdict: far more than follows the fields of any body a client
// sends, little beside the connection's own buffers.
const scanHold = 64 << 10

func newBodyScanner(body io.ReadCloser, scan func(io.Reader) error) *bodyScanner {
	pr, pw := io.Pipe()
	s := &bodyScanner{body: body, pw: pw, done: make(chan error, 1)}
	go func() {
		err := scan(pr)
		// Drain what the scan left, so that writes never block.
		_, _ = io.Copy(io.Discard, pr)
		s.done <- err
	}()
	return s
}

func (s *bodyScanner) Close() error {
	_ = s.pw.CloseWithError(io.ErrClosedPipe)
	return s.body.Close()
}

func (s *bodyScanner) Read(p []byte) (int, error) {
	if len(p) == 0 && s.err == nil {
		return 0, nil
	}
	for s.err == nil {
		if s.eof {
			// The verdict is in and clean: the held bytes go out.
			n, _ := s.pending.Read(p)
			if s.pending.Len() == 0 {
				s.err = io.EOF
			}
			return n, s.err
		}
		if over := s.pending.Len() - scanHold; over > 0 {
			return s.pending.Read(p[:min(len(p), over)])
		}
		// p is free: the body's next chunk is read into it, then held.
		m, err := s.body.Read(p)
		if m > 0 {
			_, _ = s.pw.Write(p[:m])
			_, _ = s.pending.Write(p[:m])
		}
		switch {
		case err == io.EOF:
			_ = s.pw.Close()
			if verdict := <-s.done; verdict != nil {
				var refused *Refusal
				if !errors.As(verdict, &refused) {
					refused = ErrMalformed // what the scan could not read, the upstream may
				}
				s.err = refused
				break
			}
			s.eof = true
		case err != nil:
			s.err = err
			_ = s.pw.CloseWithError(err)
		}
	}
	return 0, s.err
}
