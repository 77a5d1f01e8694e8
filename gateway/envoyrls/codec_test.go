package envoyrls

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends pre-encoded bytes as they are, as Envoy does: its C++
// protobuf writes a string field's bytes without checking their UTF-8,
// which the Go client's codec would refuse to send.
type rawCodec struct{}

func (rawCodec) Name() string                  { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(*rlsv3.RateLimitResponse))
}

// rawRequest encodes a RateLimitRequest for domain with one descriptor of
// one entry, its value's bytes as given.
func rawRequest(domain, key string, value []byte) []byte {
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, key)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendBytes(entry, value)
	d := protowire.AppendTag(nil, 1, protowire.BytesType)
	d = protowire.AppendBytes(d, entry)
	req := protowire.AppendTag(nil, 1, protowire.BytesType)
	req = protowire.AppendString(req, domain)
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	return protowire.AppendBytes(req, d)
}

// TestInvalidUTF8IsCounted: a descriptor value with bytes that are not
// UTF-8 (a header value's obs-text, which Envoy forwards as it came) is
// decided and counted like any other, not refused with a gRPC error that
// Envoy's default failure_mode_deny: false would let through; values that
// differ only in such bytes count apart.
func TestInvalidUTF8IsCounted(t *testing.T) {
	r := startRLS(t, map[string]string{"test.yaml": features}, Config{}, gatewayConfig(), "")
	ask := func(value []byte) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp := &rlsv3.RateLimitResponse{}
		err := r.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName,
			rawRequest("test", "remote_address", value), resp, grpc.ForceCodec(rawCodec{}))
		return resp, err
	}
	// remote_address: 2 a minute per value.
	for _, v := range [][]byte{[]byte("client\xff"), []byte("client\xfe"), []byte("\xc3(")} {
		for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
			resp, err := ask(v)
			if err != nil || resp.GetOverallCode() != want {
				t.Errorf("value %q, request %d: %v, %v; want %v", v, i+1, resp.GetOverallCode(), err, want)
			}
		}
	}
	if got, want := len(r.events.list()), 9; got != want {
		t.Errorf("%d decision events, want %d", got, want)
	}
	// A message that is not protobuf at all is still refused.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := r.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, []byte{0x0a, 0xff}, &rlsv3.RateLimitResponse{}, grpc.ForceCodec(rawCodec{}))
	if err == nil {
		t.Error("a truncated message was answered, want an error")
	}
}
