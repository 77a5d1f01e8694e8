package boot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kprom"
	"github.com/twmb/franz-go/plugin/kslog"
)

// Kafka is the link to Kafka, the same for every client on it (the
// gateway's publisher, the consumer, its dead-letter producer). Embed it
// inline in a process's kafka section.
type Kafka struct {
	// Brokers are seed brokers, host:port.
	Brokers []string `yaml:"brokers"`
	// TLS secures the connections to the brokers (SSL or SASL_SSL
	// listeners).
	TLS TLS `yaml:"tls"`
	// SASL authenticates to the brokers; none when Mechanism is empty.
	SASL SASL `yaml:"sasl"`
}

// SASL is Kafka's authentication: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
// with a username and password. PLAIN sends the password as it is, so
// Validate refuses it without TLS.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: no SASL.
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	Password  Secret `yaml:"password"`
}

// ApplyEnv overrides k from EDGELIMIT_KAFKA_BROKERS (comma-separated),
// EDGELIMIT_KAFKA_SASL_MECHANISM, _SASL_USERNAME, _SASL_PASSWORD (or
// _SASL_PASSWORD_FILE) and the TLS settings EDGELIMIT_KAFKA_TLS,
// _TLS_CA_FILE, _TLS_CERT_FILE, _TLS_KEY_FILE, _TLS_SERVER_NAME and
// _TLS_MIN_VERSION.
func (k *Kafka) ApplyEnv(e *Env) {
	e.List(&k.Brokers, "EDGELIMIT_KAFKA_BROKERS")
	e.String(&k.SASL.Mechanism, "EDGELIMIT_KAFKA_SASL_MECHANISM")
	e.String(&k.SASL.Username, "EDGELIMIT_KAFKA_SASL_USERNAME")
	e.Secret(&k.SASL.Password, "EDGELIMIT_KAFKA_SASL_PASSWORD")
	k.TLS.applyEnv(e, "EDGELIMIT_KAFKA")
}

// Validate joins every problem with k's security settings (which brokers
// are required is the process's business).
func (k Kafka) Validate() error {
	var errs []error
	for i, b := range k.Brokers {
		errs = append(errs, CheckAddress(fmt.Sprintf("kafka.brokers[%d]", i), b))
	}
	if _, err := k.SASL.mechanism(); err != nil {
		errs = append(errs, err)
	}
	// PLAIN puts the password on the wire as it is: without TLS anyone on
	// the path reads it. SCRAM proves the password without sending it.
	if strings.EqualFold(k.SASL.Mechanism, "PLAIN") && !k.TLS.On() {
		errs = append(errs, errors.New("kafka.sasl: PLAIN sends the password readable to anyone on the network without TLS: "+
			"turn on kafka.tls (EDGELIMIT_KAFKA_TLS=true) or use SCRAM-SHA-256/SCRAM-SHA-512"))
	}
	errs = append(errs, k.TLS.validate("kafka.tls"))
	return errors.Join(errs...)
}

// mechanism is franz-go's SASL mechanism for s, nil when s is off.
func (s SASL) mechanism() (sasl.Mechanism, error) {
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" {
			return nil, errors.New("kafka.sasl: username or password set without a mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return nil, nil
	}
	if s.Username == "" || s.Password == "" {
		return nil, fmt.Errorf("kafka.sasl: %s needs a username and a password (EDGELIMIT_KAFKA_SASL_USERNAME, EDGELIMIT_KAFKA_SASL_PASSWORD)", s.Mechanism)
	}
	switch strings.ToUpper(s.Mechanism) {
	case "PLAIN":
		return plain.Auth{User: s.Username, Pass: string(s.Password)}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: s.Username, Pass: string(s.Password)}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: s.Username, Pass: string(s.Password)}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafka.sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
}

// Opts are the franz-go options of every client on this link: the seed
// brokers, TLS and SASL, and franz-go's own log lines, warnings and errors
// only (its info lines come per connection and per metadata refresh),
// under component=kafka.
func (k Kafka) Opts(log *slog.Logger) ([]kgo.Opt, error) {
	kl := slog.New(atLeast{log.Handler(), slog.LevelWarn}).With("component", "kafka")
	opts := []kgo.Opt{
		kgo.SeedBrokers(k.Brokers...),
		kgo.WithLogger(kslog.New(kl)),
	}
	tc, err := k.TLS.Config()
	if err != nil {
		return nil, fmt.Errorf("kafka.tls: %w", err)
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	m, err := k.SASL.mechanism()
	if err != nil {
		return nil, err
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// link names the brokers in errors, with how they are reached.
func (k Kafka) link() string {
	var how []string
	if k.TLS.On() {
		how = append(how, "tls")
	}
	if k.SASL.Mechanism != "" {
		how = append(how, "sasl "+strings.ToUpper(k.SASL.Mechanism))
	}
	t := strings.Join(k.Brokers, ",")
	if len(how) > 0 {
		t += ", " + strings.Join(how, ", ")
	}
	return "kafka (" + t + ")"
}

// Check connects to the brokers as every client on this link will, within
// CheckTimeout, and asks for the cluster's metadata: a request that a
// SASL listener answers only once authenticated (an ApiVersions ping
// would pass without). It returns a LinkError (see Fatal) or nil.
func (k Kafka) Check(ctx context.Context, log *slog.Logger) error {
	opts, err := k.Opts(log)
	if err != nil {
		return err
	}
	// No retries of a failed dial or request: the first error is the
	// answer, and it must come before the deadline, not instead of it.
	cl, err := kgo.NewClient(append(opts, kgo.RequestRetries(0), kgo.RetryTimeout(CheckTimeout))...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	ctx, cancel := checkContext(ctx)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{} // none: brokers only
	_, err = req.RequestWith(ctx, cl)
	return linkError(k.link(), err, isKafkaAuth)
}

// isKafkaAuth: the broker refused the SASL exchange or the mechanism.
func isKafkaAuth(err error) bool {
	for _, ke := range []error{kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState,
		kerr.ClusterAuthorizationFailed, kerr.TopicAuthorizationFailed} {
		if errors.Is(err, ke) {
			return true
		}
	}
	return false
}

// KafkaMetrics is the option that exports a client's metrics (connections,
// bytes, batches, buffered records) as edgelimit_kafka_* on reg. Give it
// to one long-lived client per registry: a second client would register
// the same names.
func KafkaMetrics(reg prometheus.Registerer) kgo.Opt {
	return kgo.WithHooks(kprom.NewMetrics("edgelimit_kafka", kprom.Registerer(reg)))
}
