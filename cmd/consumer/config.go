package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edgelimit/edgelimit/consumer"
)

// fileConfig is the consumer's YAML file. Every field is optional; the
// environment overrides addresses and secrets (see applyEnv).
type fileConfig struct {
	Kafka      kafkaConfig      `yaml:"kafka"`
	ClickHouse clickhouseConfig `yaml:"clickhouse"`
	Batch      batchConfig      `yaml:"batch"`
	Retention  retentionConfig  `yaml:"retention"`
	// Migrate applies the embedded schema migrations at start; default true.
	Migrate *bool `yaml:"migrate"`
	// AdminListen serves /metrics, /healthz and /readyz; default
	// 127.0.0.1:9091; "off" disables it.
	AdminListen string `yaml:"admin_listen"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
}

type kafkaConfig struct {
	// Brokers are seed brokers, host:port. Required.
	Brokers []string `yaml:"brokers"`
	// Topic default "decisions"; DeadLetterTopic default
	// "decisions-dead-letter"; Group default "edgelimit-consumer".
	Topic           string `yaml:"topic"`
	DeadLetterTopic string `yaml:"dead_letter_topic"`
	Group           string `yaml:"group"`
	// CreateTopics creates both topics at start if they are missing, with
	// Partitions partitions (default 6) and the broker's replication
	// factor. Default false: production topics belong to whoever runs Kafka.
	CreateTopics bool  `yaml:"create_topics"`
	Partitions   int32 `yaml:"partitions"`
}

type clickhouseConfig struct {
	// Addr is the native-protocol address, host:port. Required.
	Addr string `yaml:"addr"`
	// Database default "default"; Username default "default".
	Database string `yaml:"database"`
	Username string `yaml:"username"`
	Password secret `yaml:"password"`
	// Compression of the native protocol: lz4 (default) or none.
	Compression string `yaml:"compression"`
}

type batchConfig struct {
	// Size default 50000 records; Wait default 1s.
	Size int           `yaml:"size"`
	Wait time.Duration `yaml:"wait"`
}

type retentionConfig struct {
	// RawDays default 30, RollupDays default 400; 0 keeps forever.
	RawDays    *int `yaml:"raw_days"`
	RollupDays *int `yaml:"rollup_days"`
}

// secret is a string that prints redacted.
type secret string

func (s secret) MarshalYAML() (any, error) {
	if s == "" {
		return "", nil
	}
	return "REDACTED", nil
}

func (s secret) String() string {
	if s == "" {
		return ""
	}
	return "REDACTED"
}

// loadConfig reads path (none: defaults only), applies the environment and
// defaults, and validates.
func loadConfig(path string, getenv func(string) string) (fileConfig, error) {
	var fc fileConfig
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fc, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true) // a misspelt field is an error, not a silent default
		if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
			return fc, fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := fc.applyEnv(getenv); err != nil {
		return fc, err
	}
	fc.defaults()
	if err := fc.validate(); err != nil {
		return fc, err
	}
	return fc, nil
}

// applyEnv overrides the file with EDGELIMIT_* variables: addresses and
// secrets belong to the environment.
func (fc *fileConfig) applyEnv(getenv func(string) string) error {
	set := func(dst *string, name string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	if v := getenv("EDGELIMIT_KAFKA_BROKERS"); v != "" {
		fc.Kafka.Brokers = strings.Split(v, ",")
	}
	set(&fc.Kafka.Topic, "EDGELIMIT_KAFKA_TOPIC")
	set(&fc.Kafka.DeadLetterTopic, "EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC")
	set(&fc.Kafka.Group, "EDGELIMIT_CONSUMER_GROUP")
	set(&fc.ClickHouse.Addr, "EDGELIMIT_CLICKHOUSE_ADDR")
	set(&fc.ClickHouse.Database, "EDGELIMIT_CLICKHOUSE_DATABASE")
	set(&fc.ClickHouse.Username, "EDGELIMIT_CLICKHOUSE_USER")
	if v := getenv("EDGELIMIT_CLICKHOUSE_PASSWORD"); v != "" {
		fc.ClickHouse.Password = secret(v)
	}
	set(&fc.AdminListen, "EDGELIMIT_CONSUMER_ADMIN_LISTEN")
	set(&fc.LogLevel, "EDGELIMIT_LOG_LEVEL")
	for name, dst := range map[string]**int{
		"EDGELIMIT_RETENTION_RAW_DAYS":    &fc.Retention.RawDays,
		"EDGELIMIT_RETENTION_ROLLUP_DAYS": &fc.Retention.RollupDays,
	} {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s=%q: %w", name, v, err)
			}
			*dst = &n
		}
	}
	return nil
}

func (fc *fileConfig) defaults() {
	if fc.Migrate == nil {
		t := true
		fc.Migrate = &t
	}
	if fc.AdminListen == "" {
		fc.AdminListen = "127.0.0.1:9091"
	}
	if fc.LogLevel == "" {
		fc.LogLevel = "info"
	}
	if fc.ClickHouse.Database == "" {
		fc.ClickHouse.Database = "default"
	}
	if fc.ClickHouse.Username == "" {
		fc.ClickHouse.Username = "default"
	}
	if fc.ClickHouse.Compression == "" {
		fc.ClickHouse.Compression = "lz4"
	}
	if fc.Kafka.Partitions == 0 {
		fc.Kafka.Partitions = 6
	}
	if fc.Retention.RawDays == nil {
		d := 30
		fc.Retention.RawDays = &d
	}
	if fc.Retention.RollupDays == nil {
		d := 400
		fc.Retention.RollupDays = &d
	}
}

func (fc fileConfig) validate() error {
	var errs []error
	if fc.ClickHouse.Addr == "" {
		errs = append(errs, errors.New("clickhouse.addr (or EDGELIMIT_CLICKHOUSE_ADDR) is required"))
	}
	if c := fc.ClickHouse.Compression; c != "lz4" && c != "none" {
		errs = append(errs, fmt.Errorf("clickhouse.compression %q: want lz4 or none", c))
	}
	if _, err := parseLevel(fc.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if fc.Kafka.Partitions < 0 {
		errs = append(errs, fmt.Errorf("kafka.partitions %d: must be positive", fc.Kafka.Partitions))
	}
	if err := fc.consumerConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// consumerConfig is the consumer package's part of the file.
func (fc fileConfig) consumerConfig() consumer.Config {
	cfg := consumer.Config{
		Brokers:         fc.Kafka.Brokers,
		Topic:           fc.Kafka.Topic,
		DeadLetterTopic: fc.Kafka.DeadLetterTopic,
		Group:           fc.Kafka.Group,
		BatchSize:       fc.Batch.Size,
		BatchWait:       fc.Batch.Wait,
	}
	if fc.Retention.RawDays != nil {
		cfg.Retention.RawDays = *fc.Retention.RawDays
	}
	if fc.Retention.RollupDays != nil {
		cfg.Retention.RollupDays = *fc.Retention.RollupDays
	}
	return cfg
}
