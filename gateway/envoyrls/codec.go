package envoyrls

import (
	"errors"
	"fmt"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// codec is gRPC's proto codec, except that a request whose string fields
// are not valid UTF-8 is read with those strings repaired instead of
// refused. Envoy copies header bytes into descriptor values as they came
// (HTTP allows bytes 0x80-0xFF in header values) and sends them as they
// are; refused, such a request is a gRPC error, which Envoy's default
// (failure_mode_deny: false) lets through uncounted: any client could walk
// around its limit by adding one such byte to a header a descriptor reads.
type codec struct{}

// maxDepth bounds the nesting the repair walks; Envoy's messages nest a
// few levels.
const maxDepth = 32

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("grpc codec: %T is not a proto message", v)
	}
	return proto.Marshal(m)
}

// sizedRequest is what the ShouldRateLimit handler decodes into: the
// request, unless its message is over max, whose size it then only notes.
type sizedRequest struct {
	req  *rlsv3.RateLimitRequest
	size int
	max  int
}

func (c codec) Unmarshal(data []byte, v any) error {
	if r, ok := v.(*sizedRequest); ok {
		if r.size = len(data); r.size > r.max {
			return nil
		}
		v = r.req
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpc codec: %T is not a proto message", v)
	}
	err := proto.Unmarshal(data, m)
	if err == nil {
		return nil
	}
	fixed, changed, ferr := repairUTF8(nil, data, m.ProtoReflect().Descriptor(), 0)
	if ferr != nil || !changed {
		return err
	}
	return proto.Unmarshal(fixed, m)
}

var errWire = errors.New("malformed protobuf")

// repairUTF8 appends b, a message of type md on the wire, to out with
// every string field that is not valid UTF-8 repaired (see latin1), in
// nested messages too. changed says whether any was.
func repairUTF8(out, b []byte, md protoreflect.MessageDescriptor, depth int) (_ []byte, changed bool, _ error) {
	if depth > maxDepth {
		return nil, false, errWire
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, errWire
		}
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return nil, false, errWire
			}
			out = append(out, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, false, errWire
		}
		out = append(out, b[:n]...)
		b = b[n+m:]
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
			v, changed = latin1(v), true
		case fd.Kind() == protoreflect.MessageKind:
			sub, c, err := repairUTF8(nil, v, fd.Message(), depth+1)
			if err != nil {
				return nil, false, err
			}
			v, changed = sub, changed || c
		}
		out = protowire.AppendBytes(out, v)
	}
	return out, changed, nil
}

// latin1 is b with each byte that is not part of valid UTF-8 read as
// Latin-1 (the HTTP header's historical charset), so values that differ in
// such bytes still differ and count apart.
func latin1(b []byte) []byte {
	out := make([]byte, 0, len(b)+len(b)/2)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, rune(b[0]))
		} else {
			out = append(out, b[:size]...)
		}
		b = b[size:]
	}
	return out
}
