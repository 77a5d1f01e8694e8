// Command analytics reads the decision rollups in ClickHouse: it flags hot
// keys and NAT-shared IPs and writes split and NAT directives to the
// gateways' Redis, alerts on fleet-wide store trouble, and answers
// analysts through an HTTP API, a dashboard page and CLI subcommands.
//
//	analytics serve        [-config analytics.yaml]   detectors on a schedule, directives, alerts, API + dashboard
//	analytics check        [-config analytics.yaml]   validate, print the effective config (secrets redacted)
//	analytics trends       [-from -1h] [-to now] [-by rule|route|plan|gateway|key] [-bucket auto|minute|hour|day] [-top 10]
//	analytics top-keys     [-from -1h] [-to now] [-limit 20]
//	analytics hot-keys     [-from -1m] [-to now] [-key ID (its history)]
//	analytics nat-ips      [-from -10m] [-to now] [-ip ADDR (its history)]
//	analytics fail-minutes [-from -24h] [-to now]
//	analytics store-health [-from -1h] [-to now] [-bucket ...]
//
// The analyst commands take -format table|csv|json (default table) and the
// filters -rule, -route, -plan, -gateway, -key. Times are now, -1h, -7d,
// RFC 3339, "2006-01-02 15:04" (UTC) or Unix seconds. The hot-keys and
// nat-ips commands run the detectors over the range and write nothing.
//
// Environment overrides: EDGELIMIT_CLICKHOUSE_ADDR, EDGELIMIT_CLICKHOUSE_DATABASE,
// EDGELIMIT_CLICKHOUSE_USER, EDGELIMIT_CLICKHOUSE_PASSWORD, EDGELIMIT_REDIS_ADDR,
// EDGELIMIT_REDIS_CLUSTER_ADDRS, EDGELIMIT_REDIS_PASSWORD, EDGELIMIT_REDIS_PREFIX,
// EDGELIMIT_ANALYTICS_TOKEN, EDGELIMIT_ANALYTICS_LISTEN, EDGELIMIT_ALERTMANAGER_URL,
// EDGELIMIT_ALERT_WEBHOOK_URL, EDGELIMIT_LOG_LEVEL.
//
// serve also answers /metrics, /healthz and /readyz (ClickHouse reachable)
// without the token. It stops on SIGTERM or SIGINT in order: the HTTP
// server drains, the detector finishes its run, then Redis and ClickHouse
// close.
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
	"sync"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/limiter"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "analytics:", err)
		os.Exit(1)
	}
}

const usage = `usage: analytics COMMAND [flags]

commands:
  serve         run the detectors, write directives, post alerts, serve the API and dashboard
  check         validate the configuration and print it (secrets redacted)
  trends        rejections and rejection ratio over time
  top-keys      the keys with the most rejections
  hot-keys      hot keys over a range (or one key's history with -key)
  nat-ips       NAT-shared IPs with their evidence (or one IP's history with -ip)
  fail-minutes  minutes in which gateways failed open or closed
  store-health  store status, failure modes and check latency per gateway

Run "analytics COMMAND -h" for a command's flags.
`

// errUsage is returned for a bad command line.
var errUsage = errors.New("bad usage")

// run runs one subcommand until it is done or ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("analytics "+cmd, flag.ContinueOnError)
	fs.SetOutput(stdout)
	path := fs.String("config", "", "YAML configuration file (optional; the environment can say everything)")
	switch cmd {
	case "serve", "check":
		if err := fs.Parse(args); err != nil {
			return err
		}
		fc, err := loadConfig(*path, getenv)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if cmd == "check" {
			out, err := yaml.Marshal(fc)
			if err != nil {
				return fmt.Errorf("print config: %w", err)
			}
			fmt.Fprintf(stdout, "# configuration is valid\n%s", out)
			return nil
		}
		if err := fc.validateServe(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		return serve(ctx, fc, stdout)
	case "trends", "top-keys", "hot-keys", "nat-ips", "fail-minutes", "store-health":
		return query(ctx, cmd, fs, path, args, getenv, stdout)
	}
	fmt.Fprint(stdout, usage)
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

func openClickHouse(c clickhouseConfig) (driver.Conn, error) {
	opts := &clickhouse.Options{
		Addr:     []string{c.Addr},
		Protocol: clickhouse.Native, // the HTTP protocol does not work with ClickHouse 18.16
		Auth:     clickhouse.Auth{Database: c.Database, Username: c.Username, Password: string(c.Password)},
		// Queries are interactive or on a seconds-long schedule: fail
		// fast rather than pile up behind a dead server.
		DialTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second,
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

func openRedis(rc redisConfig) redis.UniversalClient {
	// Directive writes are a few small transactions every few seconds:
	// default retries are fine (a replayed write is idempotent apart from
	// the version bump), timeouts short so a dead Redis does not stall a
	// run.
	if len(rc.ClusterAddrs) > 0 {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: rc.ClusterAddrs, Username: rc.Username, Password: string(rc.Password),
			DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		})
	}
	return redis.NewClient(&redis.Options{
		Addr: rc.Addr, Username: rc.Username, Password: string(rc.Password), DB: rc.DB,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
	})
}

// serve runs the detector and the HTTP server until ctx ends. Shutdown
// order: stop accepting HTTP and drain it; let the detector finish its run;
// close Redis; close ClickHouse.
func serve(ctx context.Context, fc fileConfig, stdout io.Writer) error {
	level, _ := parseLevel(fc.LogLevel)
	log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: level}))
	cfg := fc.analyticsConfig().WithDefaults()

	ch, err := openClickHouse(fc.ClickHouse)
	if err != nil {
		return err
	}
	defer ch.Close() // last: the detector's final run reads it
	reader := analytics.NewReader(ch)

	deps := analytics.Deps{Reader: reader, Log: log}
	if !fc.DryRun {
		rdb := openRedis(fc.Redis)
		defer rdb.Close()
		deps.Directives = limiter.NewDirectiveStore(rdb, fc.Redis.Prefix)
	} else {
		log.Warn("dry run: directives are computed but not written")
	}
	if cfg.Alerts.AlertmanagerURL != "" || cfg.Alerts.WebhookURL != "" {
		deps.Alerter = analytics.NewAlerter(cfg.Alerts, &http.Client{Timeout: 10 * time.Second}, nil)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	deps.Registry = reg
	det, err := analytics.NewDetector(cfg, deps)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	api, err := analytics.NewAPI(reader, det, string(fc.Token), nil, log)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Ready when ClickHouse answers: every query and detector run needs it.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ch.Ping(pctx); err != nil {
			http.Error(w, "not ready: clickhouse: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.Handle("/", api.Handler())
	ln, err := net.Listen("tcp", fc.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if host, _, _ := net.SplitHostPort(fc.Listen); !isLoopback(host) {
		log.Warn("the API and dashboard listen beyond loopback; they need the token, but put TLS in front", "listen", fc.Listen)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      60 * time.Second, // a year of minutes can take a while
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()

	detCtx, stopDet := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		det.Run(detCtx)
	}()
	log.Info("analytics serving", "listen", ln.Addr().String(), "clickhouse", fc.ClickHouse.Addr,
		"database", fc.ClickHouse.Database, "dry_run", fc.DryRun, "interval", cfg.Interval.String(),
		"alertmanager", cfg.Alerts.AlertmanagerURL != "", "webhook", cfg.Alerts.WebhookURL != "")

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-srvErr:
		runErr = fmt.Errorf("http server: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	cancel()
	stopDet()
	wg.Wait()
	log.Info("analytics stopped")
	return runErr
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
