package main

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestExampleConfig keeps deploy/consumer.example.yaml loadable, and true
// to its word that it spells out the defaults: loaded, it equals the
// defaults with only the two required addresses set.
func TestExampleConfig(t *testing.T) {
	fc, err := loadConfig(filepath.Join("..", "..", "deploy", "consumer.example.yaml"), env(nil))
	if err != nil {
		t.Fatalf("example config: %v", err)
	}
	var want fileConfig
	want.Kafka.Brokers = []string{"127.0.0.1:9092"}
	want.ClickHouse.Addr = "127.0.0.1:9000"
	want = want.WithDefaults()
	// The consumer package's defaults, which the example writes out.
	cc := fc.consumerConfig()
	if cc.Topic != "decisions" || cc.DeadLetterTopic != "decisions-dead-letter" || cc.Group != "edgelimit-consumer" ||
		cc.BatchSize != 50000 || cc.BatchWait.String() != "1s" {
		t.Errorf("example's consumer settings = %+v, want the consumer package's defaults", cc)
	}
	want.Kafka.Topic, want.Kafka.DeadLetterTopic, want.Kafka.Group = cc.Topic, cc.DeadLetterTopic, cc.Group
	want.Batch.Size, want.Batch.Wait = cc.BatchSize, cc.BatchWait
	if diff := cmp.Diff(want, fc); diff != "" {
		t.Errorf("example config differs from the defaults (-defaults +example):\n%s", diff)
	}
}
