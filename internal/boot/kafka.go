package boot

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
	"github.com/twmb/franz-go/plugin/kslog"
)

// Kafka is the link to Kafka. Embed it inline in a process's kafka
// section. TLS and SASL settings belong here (issue 16).
type Kafka struct {
	// Brokers are seed brokers, host:port.
	Brokers []string `yaml:"brokers"`
}

// ApplyEnv overrides k from EDGELIMIT_KAFKA_BROKERS (comma-separated).
func (k *Kafka) ApplyEnv(e *Env) {
	e.List(&k.Brokers, "EDGELIMIT_KAFKA_BROKERS")
}

// Opts are the franz-go options of every client on this link: the seed
// brokers and franz-go's own log lines, warnings and errors only (its info
// lines come per connection and per metadata refresh), under
// component=kafka. Transport security joins them here.
func (k Kafka) Opts(log *slog.Logger) []kgo.Opt {
	kl := slog.New(atLeast{log.Handler(), slog.LevelWarn}).With("component", "kafka")
	return []kgo.Opt{
		kgo.SeedBrokers(k.Brokers...),
		kgo.WithLogger(kslog.New(kl)),
	}
}

// KafkaMetrics is the option that exports a client's metrics (connections,
// bytes, batches, buffered records) as edgelimit_kafka_* on reg. Give it
// to one long-lived client per registry: a second client would register
// the same names.
func KafkaMetrics(reg prometheus.Registerer) kgo.Opt {
	return kgo.WithHooks(kprom.NewMetrics("edgelimit_kafka", kprom.Registerer(reg)))
}
