// Command consumer moves decision events from Kafka into ClickHouse: it
// applies the schema migrations, then consumes the decisions topic as a
// group, inserting batches and committing offsets only after ClickHouse
// accepted them. See consumer/schema.md for the tables.
//
//	consumer [-config consumer.yaml]          run
//	consumer [-config consumer.yaml] -check   validate, print the effective config (secrets redacted), exit
//	consumer [-config consumer.yaml] -migrate-only   apply the migrations and exit
//
// Environment overrides: EDGELIMIT_KAFKA_BROKERS, EDGELIMIT_KAFKA_TOPIC,
// EDGELIMIT_KAFKA_DEAD_LETTER_TOPIC, EDGELIMIT_CONSUMER_GROUP,
// EDGELIMIT_CLICKHOUSE_ADDR, EDGELIMIT_CLICKHOUSE_DATABASE,
// EDGELIMIT_CLICKHOUSE_USER, EDGELIMIT_CLICKHOUSE_PASSWORD,
// EDGELIMIT_RETENTION_RAW_DAYS, EDGELIMIT_RETENTION_ROLLUP_DAYS,
// EDGELIMIT_CONSUMER_ADMIN_LISTEN, EDGELIMIT_LOG_LEVEL.
//
// SIGTERM or SIGINT stops it in order: the consumer inserts and commits
// what it holds and leaves the group, then the admin listener stops, then
// the ClickHouse connection closes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"

	"github.com/edgelimit/edgelimit/consumer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// run consumes until ctx ends, then shuts down in order.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(stdout)
	path := fs.String("config", "", "YAML configuration file (optional; the environment can say everything)")
	check := fs.Bool("check", false, "validate the configuration, print it with secrets redacted, and exit")
	migrateOnly := fs.Bool("migrate-only", false, "apply the ClickHouse migrations and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fc, err := loadConfig(*path, getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if *check {
		out, err := yaml.Marshal(fc)
		if err != nil {
			return fmt.Errorf("print config: %w", err)
		}
		fmt.Fprintf(stdout, "# configuration is valid\n%s", out)
		return nil
	}
	level, _ := parseLevel(fc.LogLevel)
	log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: level}))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	ch, err := openClickHouse(fc.ClickHouse)
	if err != nil {
		return err
	}
	// Closed last: the consumer's final insert needs it.
	defer ch.Close()

	cfg := fc.consumerConfig()
	if *fc.Migrate || *migrateOnly {
		if err := retry(ctx, log, "migrate", func() error {
			return consumer.Migrate(ctx, ch, cfg.Retention)
		}); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		log.Info("schema migrated", "database", fc.ClickHouse.Database)
	}
	if *migrateOnly {
		return nil
	}
	if fc.Kafka.CreateTopics {
		if err := retry(ctx, log, "create topics", func() error {
			return createTopics(ctx, cfg, fc.Kafka.Partitions)
		}); err != nil {
			return fmt.Errorf("create topics: %w", err)
		}
	}

	c, err := consumer.New(cfg, ch, reg, log)
	if err != nil {
		return err
	}

	var ready atomic.Bool
	admin, err := startAdmin(fc.AdminListen, reg, &ready, log)
	if err != nil {
		return err
	}

	log.Info("consumer starting", "brokers", cfg.Brokers, "topic", cfg.Topic, "group", cfg.Group,
		"clickhouse", fc.ClickHouse.Addr, "database", fc.ClickHouse.Database)
	ready.Store(true)
	runErr := c.Run(ctx) // returns after the final insert, commit and group leave
	ready.Store(false)

	if admin != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := admin.Shutdown(sctx); err != nil {
			log.Warn("admin shutdown", "err", err)
		}
		cancel()
	}
	log.Info("consumer stopped")
	return runErr
}

func openClickHouse(c clickhouseConfig) (driver.Conn, error) {
	opts := &clickhouse.Options{
		Addr:     []string{c.Addr},
		Protocol: clickhouse.Native, // the HTTP protocol does not work with ClickHouse 18.16
		Auth: clickhouse.Auth{
			Database: c.Database,
			Username: c.Username,
			Password: string(c.Password),
		},
		DialTimeout: 5 * time.Second,
	}
	if c.Compression == "lz4" {
		opts.Compression = &clickhouse.Compression{Method: clickhouse.CompressionLZ4}
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse %s: %w", c.Addr, err)
	}
	return conn, nil
}

// retry runs fn until it succeeds or ctx ends, backing off up to 10s: at
// start, ClickHouse or Kafka may still be coming up.
func retry(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	wait := 200 * time.Millisecond
	for {
		err := fn()
		if err == nil {
			return nil
		}
		log.Warn(what+" failed; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// createTopics creates the decisions and dead-letter topics if missing.
func createTopics(ctx context.Context, cfg consumer.Config, partitions int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	topic, dead := cfg.Topic, cfg.DeadLetterTopic
	if topic == "" {
		topic = "decisions"
	}
	if dead == "" {
		dead = "decisions-dead-letter"
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopics(cctx, partitions, -1, nil, topic, dead)
	if err != nil {
		return err
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// startAdmin serves /metrics, /healthz (alive) and /readyz (consuming).
func startAdmin(addr string, reg *prometheus.Registry, ready *atomic.Bool, log *slog.Logger) (*http.Server, error) {
	if addr == "off" {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not consuming", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server", "err", err)
		}
	}()
	log.Info("admin listening", "addr", ln.Addr().String())
	return srv, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return l, fmt.Errorf("log_level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
