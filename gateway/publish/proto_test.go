package publish

import (
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestPublishedRecordReadsWithProto reads a published record the way any
// Kafka tool would: a generic protobuf decoder built from the shipped
// decision.proto alone (parsed here, no generated code, nothing from the
// event package's decoder), and the schema version from the record header.
func TestPublishedRecordReadsWithProto(t *testing.T) {
	md := testenv.ProtoMessage(t, "../../internal/event", "decision.proto", "Decision")

	brokers := map[string][]string{"kfake": newCluster(t, 1).ListenAddrs()}
	if os.Getenv("EDGELIMIT_KAFKA_BROKERS") != "" || os.Getenv("EDGELIMIT_REQUIRE_SERVERS") != "" {
		brokers["kafka"] = testenv.KafkaBrokers(t)
	}
	for name, bs := range brokers {
		t.Run(name, func(t *testing.T) {
			topic := fmt.Sprintf("decisions-proto-%d", time.Now().UnixNano())
			testenv.CreateTopics(t, bs, 1, topic)
			p, _ := mustNew(t, Config{Brokers: bs, Topic: topic})
			d := decision(1) // Allowed is false for i%3 == 0; 1 is allowed
			d.UserAgentHash = 0xdeadbeefcafef00d
			d.StoreStatus, d.Mode = event.StoreLocalCache, event.ModeShadow
			p.Publish(d)
			closeWithin(t, p, 10*time.Second)
			r := testenv.Consume(t, bs, topic, 1)[0]

			var version []string
			for _, h := range r.Headers {
				if h.Key == "edgelimit-schema" {
					version = append(version, string(h.Value))
				}
			}
			if len(version) != 1 || version[0] != "2" {
				t.Errorf("record headers %v, want one edgelimit-schema: 2", r.Headers)
			}

			m := dynamicpb.NewMessage(md)
			if err := proto.Unmarshal(r.Value, m); err != nil {
				t.Fatalf("unmarshal record with decision.proto: %v", err)
			}
			if len(m.GetUnknown()) > 0 {
				t.Errorf("record has fields decision.proto does not declare: %x", m.GetUnknown())
			}
			get := func(name string) protoreflect.Value {
				fd := md.Fields().ByName(protoreflect.Name(name))
				if fd == nil {
					t.Fatalf("decision.proto has no field %s", name)
				}
				return m.Get(fd)
			}
			enumName := func(name string) string {
				fd := md.Fields().ByName(protoreflect.Name(name))
				v := fd.Enum().Values().ByNumber(m.Get(fd).Enum())
				if v == nil {
					return fmt.Sprint(m.Get(fd).Enum())
				}
				return string(v.Name())
			}
			for _, c := range []struct {
				field     string
				got, want any
			}{
				{"id", string(get("id").Bytes()), string(d.ID[:])},
				{"time_unix_nano", get("time_unix_nano").Int(), d.Time.UnixNano()},
				{"gateway_id", get("gateway_id").String(), d.GatewayID},
				{"key_id", get("key_id").String(), d.KeyID},
				{"key_kind", enumName("key_kind"), "KEY_KIND_API_KEY"},
				{"client_ip", get("client_ip").String(), d.ClientIP},
				{"user_agent_hash", get("user_agent_hash").Uint(), d.UserAgentHash},
				{"route", get("route").String(), d.Route},
				{"method", get("method").String(), d.Method},
				{"plan", get("plan").String(), d.Plan},
				{"binding_rule", get("binding_rule").String(), d.BindingRule},
				{"allowed", get("allowed").Bool(), true},
				{"limit", get("limit").Int(), d.Limit},
				{"remaining", get("remaining").Int(), d.Remaining},
				{"cost", get("cost").Int(), d.Cost},
				{"store_status", enumName("store_status"), "STORE_STATUS_LOCAL_CACHE"},
				{"mode", enumName("mode"), "MODE_SHADOW"},
				{"check_latency_ns", get("check_latency_ns").Int(), int64(d.CheckLatency)},
			} {
				if c.got != c.want {
					t.Errorf("decision.proto reads %s = %v, want %v", c.field, c.got, c.want)
				}
			}
			// What a Kafka UI would show.
			t.Logf("record as JSON: %s", protojson.Format(m))
		})
	}
}
