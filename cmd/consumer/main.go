// Command consumer moves decision events from Kafka into ClickHouse: it
// applies the schema migrations, then consumes the decisions topic as a
// group, inserting batches and committing offsets only after ClickHouse
// accepted them. See consumer/schema.md for the tables.
//
//	consumer [-config consumer.yaml]          run
//	consumer [-config consumer.yaml] -check   validate, print the effective config (secrets redacted), exit
//	consumer [-config consumer.yaml] -migrate-only   apply the migrations and exit
//	consumer -version                         print the version, exit
//
// Environment overrides (a secret X can also be read from the file named
// by X_FILE): EDGELIMIT_KAFKA_BROKERS, EDGELIMIT_KAFKA_TOPIC,
// EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC, EDGELIMIT_CONSUMER_GROUP,
// EDGELIMIT_CLICKHOUSE_ADDR, EDGELIMIT_CLICKHOUSE_DATABASE,
// EDGELIMIT_CLICKHOUSE_USER, EDGELIMIT_CLICKHOUSE_PASSWORD,
// EDGELIMIT_CLICKHOUSE_SHARDS, EDGELIMIT_CLICKHOUSE_CLUSTER and
// EDGELIMIT_CLICKHOUSE_LOCAL_DATABASE (a cluster), EDGELIMIT_KAFKA_SASL_* and EDGELIMIT_{KAFKA,CLICKHOUSE}_TLS_* (see
// docs/security.md), EDGELIMIT_RETENTION_RAW_DAYS, EDGELIMIT_RETENTION_ROLLUP_DAYS,
// EDGELIMIT_CONSUMER_ADMIN_LISTEN, EDGELIMIT_LOG_LEVEL.
//
// SIGTERM or SIGINT stops it in order: the consumer inserts and commits
// what it holds and leaves the group, then the admin listener stops, then
// the ClickHouse connection closes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/internal/boot"
)

func main() { boot.Main("consumer", run) }

// stopTimeout bounds the shutdown. It is longer than the consumer's own
// ShutdownTimeout (15s), which bounds its final insert and commit.
const stopTimeout = 30 * time.Second

// run consumes until ctx ends, then shuts down in order.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := boot.NewFlags("consumer", "YAML configuration file (optional; the environment can say everything)", stdout)
	check := fs.Bool("check", false, "validate the configuration, print it with secrets redacted, and exit")
	migrateOnly := fs.Bool("migrate-only", false, "apply the ClickHouse migrations and exit")
	if done, err := fs.Parse(args); done {
		return err
	}
	fc, err := loadConfig(*fs.Config, getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if *check {
		return boot.PrintYAML(stdout, "configuration is valid", fc)
	}
	log, err := boot.NewLogger(stdout, fc.LogLevel)
	if err != nil {
		return err
	}
	reg := boot.NewRegistry()

	ch, err := boot.OpenClickHouse(fc.ClickHouse, 0)
	if err != nil {
		return err
	}
	// Closed last: the consumer's final insert needs it.
	defer ch.Close()
	// Wrong credentials or an untrusted certificate end the start here,
	// named; a server still coming up is retried below.
	checkClickHouse := func() error { return boot.PingClickHouse(ctx, ch, fc.ClickHouse) }
	checkKafka := func() error { return fc.Kafka.Check(ctx, log) }
	if err := checkClickHouse(); boot.Fatal(err) {
		return err
	} else if err != nil {
		log.Warn("ClickHouse not reachable at start; the consumer keeps trying", "error", err.Error())
	}
	if err := checkKafka(); boot.Fatal(err) {
		return err
	} else if err != nil {
		log.Warn("Kafka not reachable at start; the consumer keeps trying", "error", err.Error())
	}

	cfg := fc.consumerConfig()
	for _, addr := range fc.Cluster.Shards {
		sc := fc.shard(addr)
		sh, err := boot.OpenClickHouse(sc, 0)
		if err != nil {
			return err
		}
		defer sh.Close()
		if err := boot.PingClickHouse(ctx, sh, sc); boot.Fatal(err) {
			return err
		}
		cfg.Shards = append(cfg.Shards, sh)
	}
	if *fc.Migrate || *migrateOnly {
		if err := retry(ctx, log, "migrate", checkClickHouse, func() error { return migrate(ctx, fc, ch, cfg) }); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		log.Info("schema migrated", "database", fc.ClickHouse.Database, "shards", len(cfg.Shards))
	}
	if *migrateOnly {
		return nil
	}
	if fc.Kafka.CreateTopics {
		if err := retry(ctx, log, "create topics", checkKafka, func() error {
			return createTopics(ctx, fc.Kafka, log)
		}); err != nil {
			return fmt.Errorf("create topics: %w", err)
		}
	} else if err := retry(ctx, log, "check topics", checkKafka, func() error {
		// A misspelt topic would leave the consumer ready, idle and silent;
		// a missing dead-letter topic would block the first partition that
		// meets a poison record. Until both exist, say so and wait.
		return checkTopics(ctx, fc.Kafka, log)
	}); err != nil {
		return fmt.Errorf("check topics: %w", err)
	}

	opts, err := fc.Kafka.Opts(log)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// The same options serve the dead-letter producer: one link.
	cfg.Opts = append(opts, boot.KafkaMetrics(reg))
	c, err := consumer.New(cfg, ch, reg, log)
	if err != nil {
		return err
	}

	var ready atomic.Bool
	actors := []boot.Actor{boot.Func("consumer", func(ctx context.Context) error {
		ready.Store(true)
		defer ready.Store(false)
		return c.Run(ctx) // returns after the final insert, commit and group leave
	})}
	if fc.AdminListen != "off" {
		notReady := errors.New("not consuming")
		admin, ln, err := boot.Listen("admin", fc.AdminListen, boot.NewServer(boot.Admin{
			Registry: reg,
			Ready: func(context.Context) error {
				if !ready.Load() {
					return notReady
				}
				return nil
			},
		}.Handler(), log))
		if err != nil {
			return err
		}
		log.Info("admin listening", "addr", ln.Addr().String())
		actors = append(actors, admin)
	}

	log.Info("consumer starting", "brokers", cfg.Brokers, "topic", cfg.Topic, "group", cfg.Group,
		"clickhouse", fc.ClickHouse.Addr, "database", fc.ClickHouse.Database, "version", boot.Version)
	err = boot.Run(ctx, log, stopTimeout, actors...)
	log.Info("consumer stopped")
	return err
}

// migrate applies the migrations to ch's database, or on a cluster to every
// shard's local database and then puts the Distributed tables in front of
// them in ch's.
func migrate(ctx context.Context, fc fileConfig, ch driver.Conn, cfg consumer.Config) error {
	if len(cfg.Shards) == 0 {
		return consumer.Migrate(ctx, ch, cfg.Retention)
	}
	for i, sh := range cfg.Shards {
		if err := consumer.Migrate(ctx, sh, cfg.Retention); err != nil {
			return fmt.Errorf("shard %s: %w", fc.Cluster.Shards[i], err)
		}
	}
	return consumer.CreateDistributed(ctx, ch, fc.Cluster.Name, fc.Cluster.LocalDatabase)
}

// retry runs fn until it succeeds or ctx ends, backing off up to 10s: at
// start, ClickHouse or Kafka may still be coming up. A schema newer than
// this consumer does not get older by waiting: that error returns at once;
// and so does recheck's (the link's start check, run after each failure)
// when it is a configuration problem: a server that was down at start
// may come up refusing the credentials or the certificate, which no
// retry fixes.
func retry(ctx context.Context, log *slog.Logger, what string, recheck, fn func() error) error {
	wait := 200 * time.Millisecond
	for {
		err := fn()
		if err == nil || errors.Is(err, consumer.ErrSchemaNewer) {
			return err
		}
		if cerr := recheck(); boot.Fatal(cerr) {
			return cerr
		}
		log.Warn(what+" failed; retrying", "error", err.Error(), "retry_in_ms", wait.Milliseconds())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// createTopics creates the decisions and dead-letter topics if missing.
func createTopics(ctx context.Context, kc kafkaConfig, log *slog.Logger) error {
	return withAdmin(ctx, kc, log, func(ctx context.Context, adm *kadm.Client, topics []string) error {
		resp, err := adm.CreateTopics(ctx, kc.Partitions, -1, nil, topics...)
		if err != nil {
			return err
		}
		for _, r := range resp {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				return fmt.Errorf("topic %s: %w", r.Topic, r.Err)
			}
		}
		return nil
	})
}

// checkTopics returns an error naming the first of the decisions and
// dead-letter topics that does not exist or cannot be described.
func checkTopics(ctx context.Context, kc kafkaConfig, log *slog.Logger) error {
	return withAdmin(ctx, kc, log, func(ctx context.Context, adm *kadm.Client, topics []string) error {
		details, err := adm.ListTopics(ctx, topics...)
		if err != nil {
			return err
		}
		for _, name := range topics {
			switch d, ok := details[name]; {
			case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
				return fmt.Errorf("kafka topic %q does not exist: create it, fix the name, or set kafka.create_topics", name)
			case d.Err != nil:
				return fmt.Errorf("kafka topic %q: %w", name, d.Err)
			}
		}
		return nil
	})
}

// withAdmin runs fn, within 30s, with an admin client on kc's link and the
// decisions and dead-letter topics' names.
func withAdmin(ctx context.Context, kc kafkaConfig, log *slog.Logger, fn func(context.Context, *kadm.Client, []string) error) error {
	opts, err := kc.Opts(log)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	// The consumer package's defaults, which it applies to its own Config.
	topic, dead := kc.Topic, kc.DeadLetterTopic
	if topic == "" {
		topic = "decisions"
	}
	if dead == "" {
		dead = "decisions-dead-letter"
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return fn(cctx, kadm.NewClient(cl), []string{topic, dead})
}
