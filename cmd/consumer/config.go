package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/internal/boot"
)

// fileConfig is the consumer's YAML file. Every field is optional; the
// environment overrides addresses and secrets (see ApplyEnv).
type fileConfig struct {
	Kafka      kafkaConfig     `yaml:"kafka"`
	ClickHouse boot.ClickHouse `yaml:"clickhouse"`
	Cluster    clusterConfig   `yaml:"cluster"`
	Batch      batchConfig     `yaml:"batch"`
	Retention  retentionConfig `yaml:"retention"`
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
	boot.Kafka `yaml:",inline"`
	// Topic default "decisions"; DeadLetterTopic default
	// "decisions-dead-letter"; Group default "edgelimit-consumer"
	// (consumer.Config).
	Topic           string `yaml:"topic"`
	DeadLetterTopic string `yaml:"dead_letter_topic"`
	Group           string `yaml:"group"`
	// CreateTopics creates both topics at start if they are missing, with
	// Partitions partitions (default 6) and the broker's replication
	// factor. Default false: production topics belong to whoever runs Kafka.
	CreateTopics bool  `yaml:"create_topics"`
	Partitions   int32 `yaml:"partitions"`
}

// clusterConfig is a ClickHouse cluster: the consumer writes through
// Distributed tables in clickhouse.database and reaches every shard's local
// tables for what a Distributed table cannot do (an abort's DELETE). Empty
// shards: one server, no cluster.
type clusterConfig struct {
	// Shards are one server of each shard, native host:port; each is
	// reached with clickhouse's credentials and TLS.
	Shards []string `yaml:"shards"`
	// Name is the cluster as the servers' remote_servers name it. Required
	// with shards.
	Name string `yaml:"name"`
	// LocalDatabase is the database of the local tables on every shard,
	// not clickhouse.database. Required with shards.
	LocalDatabase string `yaml:"local_database"`
}

// validate joins the problems with a cluster section that names shards.
func (cc clusterConfig) validate(front string) error {
	if len(cc.Shards) == 0 {
		return nil
	}
	errs := []error{
		consumer.CheckIdentifier("cluster.name", cc.Name),
		consumer.CheckIdentifier("cluster.local_database", cc.LocalDatabase),
	}
	if cc.LocalDatabase == front {
		errs = append(errs, fmt.Errorf("cluster.local_database %q is clickhouse.database: the Distributed tables need a database of their own", front))
	}
	return errors.Join(errs...)
}

// shard is clickhouse's configuration for one shard's local database.
func (fc fileConfig) shard(addr string) boot.ClickHouse {
	c := fc.ClickHouse
	c.Addr, c.Database = addr, fc.Cluster.LocalDatabase
	return c
}

type batchConfig struct {
	// Size default 50000 records; Wait default 1s (consumer.Config).
	Size int           `yaml:"size"`
	Wait time.Duration `yaml:"wait"`
}

type retentionConfig struct {
	// RawDays default 30, RollupDays default 400; 0 keeps forever.
	RawDays    *int `yaml:"raw_days"`
	RollupDays *int `yaml:"rollup_days"`
}

// loadConfig reads path (none: defaults only), applies the environment and
// the defaults, and validates (see boot.Load).
func loadConfig(path string, getenv func(string) string) (fileConfig, error) {
	return boot.Load[fileConfig](path, getenv)
}

// ApplyEnv overrides the file with EDGELIMIT_* variables: addresses and
// secrets belong to the environment.
func (fc *fileConfig) ApplyEnv(e *boot.Env) error {
	fc.Kafka.ApplyEnv(e)
	e.String(&fc.Kafka.Topic, "EDGELIMIT_KAFKA_TOPIC")
	e.String(&fc.Kafka.DeadLetterTopic, "EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC")
	e.String(&fc.Kafka.Group, "EDGELIMIT_CONSUMER_GROUP")
	fc.ClickHouse.ApplyEnv(e)
	e.List(&fc.Cluster.Shards, "EDGELIMIT_CLICKHOUSE_SHARDS")
	e.String(&fc.Cluster.Name, "EDGELIMIT_CLICKHOUSE_CLUSTER")
	e.String(&fc.Cluster.LocalDatabase, "EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE")
	e.String(&fc.AdminListen, "EDGELIMIT_CONSUMER_ADMIN_LISTEN")
	e.String(&fc.LogLevel, "EDGELIMIT_LOG_LEVEL")
	e.IntPtr(&fc.Retention.RawDays, "EDGELIMIT_RETENTION_RAW_DAYS")
	e.IntPtr(&fc.Retention.RollupDays, "EDGELIMIT_RETENTION_ROLLUP_DAYS")
	return e.Err()
}

// WithDefaults returns fc with the command's own defaults set; the
// consumer package applies its own.
func (fc fileConfig) WithDefaults() fileConfig {
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
	fc.ClickHouse = fc.ClickHouse.WithDefaults()
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
	return fc
}

// Validate joins every problem with the file.
func (fc fileConfig) Validate() error {
	errs := []error{fc.ClickHouse.Validate(), fc.Cluster.validate(fc.ClickHouse.Database), fc.consumerConfig().Validate(), fc.Kafka.Kafka.Validate()}
	if _, err := boot.ParseLevel(fc.LogLevel); err != nil {
		errs = append(errs, err)
	}
	// boot checks clickhouse.addr and the brokers; the shards are printed
	// by -check and logged at start just the same.
	for i, addr := range fc.Cluster.Shards {
		errs = append(errs, boot.CheckAddress(fmt.Sprintf("cluster.shards[%d]", i), addr))
	}
	if fc.Kafka.Partitions < 0 {
		errs = append(errs, fmt.Errorf("kafka.partitions %d: must be positive", fc.Kafka.Partitions))
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
