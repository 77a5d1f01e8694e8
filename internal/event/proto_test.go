package event

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// mustDecisionDescriptor parses decision.proto, the shipped contract, at
// test time: the generic decoder below knows nothing but that file.
func mustDecisionDescriptor(tb testing.TB) protoreflect.MessageDescriptor {
	tb.Helper()
	return testenv.ProtoMessage(tb, ".", "decision.proto", "Decision")
}

// full sets every field to a non-zero value, so a check over it covers the
// whole message.
func full() Decision {
	d := golden()
	d.Allowed, d.Remaining = true, 41
	d.KeyName = "acme"
	d.Domain = "edge_proxy"
	d.Descriptor = []DescriptorEntry{{Key: "remote_address", Value: "203.0.113.7"}, {Key: "path", Value: "/v1/orders"},
		{Key: "generic_key", Value: ""}, {Key: "", Value: "v"}}
	d.Admin = AdminAction{Action: "reset", Actor: "oncall"}
	d.Accounting = Accounting{RunStart: time.Unix(1_780_000_000, 5).UTC(), Decisions: 1000, Published: 990,
		DroppedBufferFull: 1, DroppedBrokerError: 7, DroppedEncodeError: 1, DroppedClosed: 1, Final: true}
	d.Seq, d.SeqEpoch = 1234, time.Unix(1_780_000_100, 7000).UTC()
	d.NATFactor = 2.5
	d.Split = []SplitShare{{Gateway: "gw-a", Share: 0.75}, {Gateway: "*", Share: 0.25}, {Share: 0}}
	d.Reserved, d.Settled = 4000, 4321
	return d
}

// toDynamic builds the message the .proto describes for d, field by field
// by name, independently of the encoder.
func toDynamic(tb testing.TB, md protoreflect.MessageDescriptor, d Decision) *dynamicpb.Message {
	tb.Helper()
	m := dynamicpb.NewMessage(md)
	set := func(name string, v protoreflect.Value, zero bool) {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			tb.Fatalf("decision.proto has no field %s", name)
		}
		if !zero || fd.HasPresence() {
			m.Set(fd, v)
		}
	}
	str := func(name, s string) { set(name, protoreflect.ValueOfString(s), s == "") }
	i64 := func(name string, v int64) { set(name, protoreflect.ValueOfInt64(v), v == 0) }
	enum := func(name string, v uint8) { set(name, protoreflect.ValueOfEnum(protoreflect.EnumNumber(v)), v == 0) }

	if d.ID != ([16]byte{}) {
		set("id", protoreflect.ValueOfBytes(d.ID[:]), false)
	}
	if !d.Time.IsZero() {
		set("time_unix_nano", protoreflect.ValueOfInt64(d.Time.UnixNano()), false)
	}
	str("gateway_id", d.GatewayID)
	str("key_id", d.KeyID)
	enum("key_kind", uint8(d.KeyKind))
	str("client_ip", d.ClientIP)
	set("user_agent_hash", protoreflect.ValueOfUint64(d.UserAgentHash), d.UserAgentHash == 0)
	str("route", d.Route)
	str("method", d.Method)
	str("plan", d.Plan)
	str("binding_rule", d.BindingRule)
	set("allowed", protoreflect.ValueOfBool(d.Allowed), !d.Allowed)
	i64("limit", d.Limit)
	i64("remaining", d.Remaining)
	i64("cost", d.Cost)
	enum("store_status", uint8(d.StoreStatus))
	enum("mode", uint8(d.Mode))
	i64("check_latency_ns", int64(d.CheckLatency))
	str("key_name", d.KeyName)
	str("domain", d.Domain)
	i64("seq", d.Seq)
	if !d.SeqEpoch.IsZero() {
		i64("seq_epoch_unix_nano", d.SeqEpoch.UnixNano())
	}
	set("nat_factor", protoreflect.ValueOfFloat64(d.NATFactor), d.NATFactor == 0)
	i64("reserved", d.Reserved)
	i64("settled", d.Settled)
	if len(d.Split) > 0 {
		list := m.Mutable(md.Fields().ByName("split")).List()
		for _, sh := range d.Split {
			sm := list.NewElement().Message()
			setPair(sm, "gateway", sh.Gateway, "", "")
			if sh.Share != 0 {
				sm.Set(sm.Descriptor().Fields().ByName("share"), protoreflect.ValueOfFloat64(sh.Share))
			}
			list.Append(protoreflect.ValueOfMessage(sm))
		}
	}
	if len(d.Descriptor) > 0 {
		fd := md.Fields().ByName("descriptor")
		list := m.Mutable(fd).List()
		for _, e := range d.Descriptor {
			em := list.NewElement().Message()
			setPair(em, "key", e.Key, "value", e.Value)
			list.Append(protoreflect.ValueOfMessage(em))
		}
	}
	if d.Admin != (AdminAction{}) {
		fd := md.Fields().ByName("admin")
		setPair(m.Mutable(fd).Message(), "action", d.Admin.Action, "actor", d.Admin.Actor)
	}
	if a := d.Accounting; a != (Accounting{}) {
		am := m.Mutable(md.Fields().ByName("accounting")).Message()
		var start int64
		if !a.RunStart.IsZero() {
			start = a.RunStart.UnixNano()
		}
		for name, v := range map[string]int64{"run_start_unix_nano": start, "decisions": a.Decisions, "published": a.Published,
			"dropped_buffer_full": a.DroppedBufferFull, "dropped_broker_error": a.DroppedBrokerError,
			"dropped_encode_error": a.DroppedEncodeError, "dropped_closed": a.DroppedClosed} {
			if v != 0 {
				am.Set(am.Descriptor().Fields().ByName(protoreflect.Name(name)), protoreflect.ValueOfInt64(v))
			}
		}
		if a.Final {
			am.Set(am.Descriptor().Fields().ByName("final"), protoreflect.ValueOfBool(true))
		}
	}
	return m
}

// setPair sets the string fields a and b of a sub-message, as proto3
// leaves an empty one out.
func setPair(m protoreflect.Message, a, av, b, bv string) {
	for _, f := range [...][2]string{{a, av}, {b, bv}} {
		if f[1] != "" {
			m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(f[0])), protoreflect.ValueOfString(f[1]))
		}
	}
}

func TestProtoCoversEveryField(t *testing.T) {
	md := mustDecisionDescriptor(t)
	m := toDynamic(t, md, full())
	fields := md.Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); !m.Has(fd) {
			t.Errorf("full() leaves %s unset: a field was added to decision.proto without the encoder, toDynamic or full()", fd.Name())
		}
	}
	// And the other way: what Encode writes, the generic decoder knows.
	b, err := Encode(full())
	if err != nil {
		t.Fatal(err)
	}
	got := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatalf("unmarshal Encode(full()) with decision.proto: %v", err)
	}
	if u := got.GetUnknown(); len(u) > 0 {
		t.Errorf("Encode(full()) writes fields decision.proto does not declare: %x", u)
	}
}

// TestProtoAgreesWithCodec checks both directions against a generic decoder
// built from decision.proto: what Encode writes reads back as the right
// message, and what a standard protobuf writer writes, Decode reads.
func TestProtoAgreesWithCodec(t *testing.T) {
	md := mustDecisionDescriptor(t)
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	gives := []Decision{golden(), full(), {}, {Time: time.Unix(0, 0).UTC()},
		{Time: time.Unix(-1, 0).UTC(), Limit: -1, Remaining: -5, Cost: -1, CheckLatency: -1, Allowed: true, Mode: ModeShadow}}
	for i := range 50 {
		d := full()
		d.ID = NewID(now.Add(time.Duration(i) * time.Millisecond))
		d.Time = now.Add(time.Duration(i) * 7 * time.Nanosecond)
		d.Allowed = i%2 == 0
		d.Remaining = int64(i - 25)
		d.KeyKind = KeyKind(i % len(keyKindNames))
		d.Mode = Mode(i % len(modeNames))
		d.StoreStatus = StoreStatus(i % len(storeStatusNames))
		d.UserAgentHash = uint64(i) * 0x9e3779b97f4a7c15
		gives = append(gives, d)
	}
	for i, d := range gives {
		want := toDynamic(t, md, d)
		enc, err := Encode(d)
		if err != nil {
			t.Fatal(err)
		}
		got := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(enc, got); err != nil {
			t.Fatalf("%d: unmarshal Encode(%+v): %v", i, d, err)
		}
		if !proto.Equal(want, got) {
			t.Errorf("%d: decision.proto reads Encode(%+v) as\n%v\nwant\n%v", i, d, got, want)
		}
		// A standard writer emits fields in number order too, so the bytes
		// themselves agree.
		std, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(std, enc) {
			t.Errorf("%d: Encode(%+v) =\n%x\nstandard protobuf writes\n%x", i, d, enc, std)
		}
		wantDecode(t, std, d, fmt.Sprintf("%d: standard encoding", i))
	}
}

// TestProtoEnums ties each Go enum to its .proto enum: same numbers, and the
// text names the consumer stores are the proto names without their prefix,
// lower-cased (UNSPECIFIED reads "unknown").
func TestProtoEnums(t *testing.T) {
	md := mustDecisionDescriptor(t)
	tests := []struct {
		field string
		names []string
	}{
		{field: "key_kind", names: keyKindNames[:]},
		{field: "store_status", names: storeStatusNames[:]},
		{field: "mode", names: modeNames[:]},
	}
	for _, tt := range tests {
		ed := md.Fields().ByName(protoreflect.Name(tt.field)).Enum()
		if ed == nil {
			t.Fatalf("decision.proto field %s is not an enum", tt.field)
		}
		values := ed.Values()
		var got []string
		for i := range values.Len() {
			v := values.Get(i)
			if int(v.Number()) != i {
				t.Errorf("%s.%s = %d, want %d: values are numbered 0, 1, 2, ...", ed.Name(), v.Name(), v.Number(), i)
			}
			name := string(v.Name())
			prefix := strings.ToUpper(tt.field) + "_"
			if !strings.HasPrefix(name, prefix) {
				t.Errorf("%s.%s lacks the prefix %s", ed.Name(), name, prefix)
			}
			name = strings.ToLower(strings.TrimPrefix(name, prefix))
			if name == "unspecified" {
				name = "unknown"
			}
			got = append(got, name)
		}
		if diff := cmp.Diff(tt.names, got); diff != "" {
			t.Errorf("Go names of %s differ from decision.proto's (-go +proto):\n%s", ed.Name(), diff)
		}
	}
}
