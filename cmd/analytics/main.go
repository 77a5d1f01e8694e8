// Command analytics reads the decision rollups in ClickHouse: it flags hot
// keys and NAT-shared IPs and writes split and NAT directives to the
// gateways' Redis, alerts on fleet-wide store trouble, and answers
// analysts through an HTTP API, a dashboard page and CLI subcommands.
//
//	analytics serve        [-config analytics.yaml]   detectors on a schedule, directives, alerts, API + dashboard
//	analytics check        [-config analytics.yaml]   validate, print the effective config (secrets redacted)
//	analytics trends       [-from -1h] [-to now] [-by rule|route|plan|gateway|key|kind|method] [-bucket auto|minute|5m|15m|hour|day] [-tz UTC] [-top 10]
//	analytics top-keys     [-from -1h] [-to now] [-limit 20]
//	analytics key ID|NAME  [-from -1h] [-to now] [-bucket ...] [-tz UTC]  one key's page (directives from Redis when configured)
//	analytics hot-keys     [-from -1m] [-to now] [-key ID (its history)]
//	analytics nat-ips      [-from -10m] [-to now] [-ip ADDR (its history)]
//	analytics fail-minutes [-from -24h] [-to now]
//	analytics store-health [-from -1h] [-to now] [-bucket ...]
//	analytics whatif       -rules plans.yaml [-change YAML] [-from -24h] [-to now] [-top 10]
//	analytics usage        -month 2026-11 | -from DATE [-to DATE] [-tz UTC] [-key ID|NAME]... [-by key,plan,route,day]
//	analytics version                                  print the version (also -version, and -version on any command)
//
// The analyst commands take -format table|csv|json (default table) and the
// filters -rule, -route, -plan, -gateway, -key (trends and top-keys also
// -kind and -method, all at once). Times are now, -1h, -7d,
// RFC 3339, "2006-01-02 15:04" (UTC) or Unix seconds. The hot-keys and
// nat-ips commands run the detectors over the range and write nothing.
//
// Environment overrides (a secret X can also be read from the file named
// by X_FILE): EDGELIMIT_CLICKHOUSE_ADDR, EDGELIMIT_CLICKHOUSE_DATABASE,
// EDGELIMIT_CLICKHOUSE_USER, EDGELIMIT_CLICKHOUSE_PASSWORD, EDGELIMIT_REDIS_ADDR,
// EDGELIMIT_REDIS_CLUSTER_ADDRS, EDGELIMIT_REDIS_SENTINEL_ADDRS,
// EDGELIMIT_REDIS_SENTINEL_MASTER, EDGELIMIT_REDIS_USERNAME,
// EDGELIMIT_REDIS_PASSWORD, EDGELIMIT_REDIS_DB, EDGELIMIT_REDIS_PREFIX,
// EDGELIMIT_ANALYTICS_TOKEN, EDGELIMIT_ANALYTICS_LISTEN, EDGELIMIT_ALERTMANAGER_URL,
// EDGELIMIT_ALERT_WEBHOOK_URL, EDGELIMIT_LOG_LEVEL; for TLS and
// authentication (see docs/security.md)
// EDGELIMIT_{REDIS,CLICKHOUSE,ALERTMANAGER,ALERT_WEBHOOK}_TLS_*,
// EDGELIMIT_REDIS_SENTINEL_USERNAME/_PASSWORD and
// EDGELIMIT_{ALERTMANAGER,ALERT_WEBHOOK}_{USERNAME,PASSWORD,BEARER_TOKEN}.
//
// serve also answers /metrics, /healthz and /readyz (ClickHouse reachable)
// without the token. It stops on SIGTERM or SIGINT in order: the HTTP
// server drains, the detector finishes its run, then Redis and ClickHouse
// close.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

func main() { boot.Main("analytics", run) }

const usage = `usage: analytics COMMAND [flags]

commands:
  serve         run the detectors, write directives, post alerts, serve the API and dashboard
  check         validate the configuration and print it (secrets redacted)
  trends        rejections and rejection ratio over time
  top-keys      the keys with the most rejections
  key           one key's page: requests, denials by rule and route, gateways, cost, directives, history
  hot-keys      hot keys over a range (or one key's history with -key)
  nat-ips       NAT-shared IPs with their evidence (or one IP's history with -ip)
  fail-minutes  minutes in which gateways failed open or closed
  store-health  store status, failure modes and check latency per gateway
  whatif        replay stored decisions through proposed rules: what they would deny
  usage         a usage statement: what each key used in a month or period, and whether it is complete
  version       print the version

Run "analytics COMMAND -h" for a command's flags.
`

// errUsage is returned for a bad command line: the process exits 2.
var errUsage = boot.ErrUsage

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
	if cmd == "version" || cmd == "-version" || cmd == "--version" {
		_, err := fmt.Fprintln(stdout, boot.VersionLine("analytics"))
		return err
	}
	fs := boot.NewFlags("analytics "+cmd, "YAML configuration file (optional; the environment can say everything)", stdout)
	switch cmd {
	case "serve", "check":
		if done, err := fs.Parse(args); done {
			return err
		}
		fc, err := loadConfig(*fs.Config, getenv)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if cmd == "check" {
			return boot.PrintYAML(stdout, "configuration is valid", fc)
		}
		if err := fc.validateServe(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		return serve(ctx, fc, stdout)
	case "trends", "top-keys", "key", "hot-keys", "nat-ips", "fail-minutes", "store-health", "whatif":
		return usageErr(query(ctx, cmd, fs, args, getenv, stdout))
	case "usage":
		return usageCmd(ctx, fs, args, getenv, stdout)
	}
	fmt.Fprint(stdout, usage)
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// serve runs the detector and the HTTP server until ctx ends. Shutdown
// order: stop accepting HTTP and drain it; let the detector finish its run;
// close Redis; close ClickHouse.
func serve(ctx context.Context, fc fileConfig, stdout io.Writer) error {
	log, err := boot.NewLogger(stdout, fc.LogLevel)
	if err != nil {
		return err
	}
	cfg := fc.analyticsConfig().WithDefaults()

	// Queries are interactive or on a seconds-long schedule: a 30s read
	// bound fails fast rather than piling up behind a dead server.
	ch, err := boot.OpenClickHouse(fc.ClickHouse, 30*time.Second)
	if err != nil {
		return err
	}
	defer ch.Close() // last: the detector's final run reads it
	// Wrong credentials or an untrusted certificate end the start here,
	// named; a server that is down now is reported by /readyz and retried
	// by every run.
	if err := boot.PingClickHouse(ctx, ch, fc.ClickHouse); boot.Fatal(err) {
		return err
	} else if err != nil {
		log.Warn("ClickHouse not reachable at start", "error", err.Error())
	}
	reader := analytics.NewReader(ch)

	deps := analytics.Deps{Reader: reader, Log: log}
	if !fc.DryRun {
		// Directive writes are a few small transactions every few seconds:
		// go-redis's default retries are fine (a replayed write is
		// idempotent apart from the version bump), timeouts short so a
		// dead Redis does not stall a run.
		rdb, err := boot.NewRedis(fc.Redis.Redis, boot.RedisTuning{Timeout: 2 * time.Second}, log)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		defer rdb.Close()
		if err := boot.PingRedis(ctx, rdb, fc.Redis.Redis); boot.Fatal(err) {
			return err
		} else if err != nil {
			log.Warn("Redis not reachable at start; directives are written once it is", "error", err.Error())
		}
		deps.Directives = limiter.NewDirectiveStore(rdb, fc.Redis.Prefix)
	} else {
		log.Warn("dry run: directives are computed but not written")
	}
	if cfg.Alerts.AlertmanagerURL != "" || cfg.Alerts.WebhookURL != "" {
		alerter, err := newAlerter(ctx, fc, cfg.Alerts, log)
		if err != nil {
			return err
		}
		deps.Alerter = alerter
	}
	reg := boot.NewRegistry()
	deps.Registry = reg
	det, err := analytics.NewDetector(cfg, deps)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	api, err := analytics.NewAPI(reader, det, string(fc.Token), nil, log)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	api.SecureCookie = fc.SecureCookie
	api.ParseProposal = parseProposal
	// Ready when ClickHouse answers: every query and detector run needs it.
	adminHandler := boot.Admin{Registry: reg, Ready: func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := ch.Ping(pctx); err != nil {
			// The reason goes to the log; the probe learns only which link.
			log.Warn("not ready: clickhouse does not answer", "error", err.Error())
			return errors.New("clickhouse does not answer (see the log)")
		}
		return nil
	}}.Handler()
	httpActor, ln, err := boot.Listen("http", fc.Listen, boot.NewServer(api.Handler(), log))
	if err != nil {
		return err
	}
	adminActor, aln, err := boot.Listen("admin", fc.AdminListen, boot.NewServer(adminHandler, log))
	if err != nil {
		ln.Close()
		return err
	}
	if host, _, _ := net.SplitHostPort(fc.Listen); !isLoopback(host) {
		log.Warn("the API and dashboard listen beyond loopback; they need the token, but put TLS in front", "listen", fc.Listen)
	}
	log.Info("analytics serving", "listen", ln.Addr().String(), "admin_listen", aln.Addr().String(), "clickhouse", fc.ClickHouse.Addr,
		"database", fc.ClickHouse.Database, "dry_run", fc.DryRun, "interval_ms", cfg.Interval.Milliseconds(),
		"alertmanager", cfg.Alerts.AlertmanagerURL != "", "webhook", cfg.Alerts.WebhookURL != "", "version", boot.Version)
	err = boot.Run(ctx, log, 5*time.Second, httpActor,
		boot.Func("detector", func(ctx context.Context) error { det.Run(ctx); return nil }), adminActor)
	log.Info("analytics stopped")
	return err
}

// newAlerter makes the alerter's HTTP client, one link per destination,
// and checks each: Alertmanager with GET /api/v2/status, the webhook with
// HEAD (it must not be posted to). Bad credentials or certificates end
// the start; a destination that is down only warns, as a failed post
// would be retried.
func newAlerter(ctx context.Context, fc fileConfig, ac analytics.AlertConfig, log *slog.Logger) (*analytics.Alerter, error) {
	links := map[string]boot.HTTP{}
	if ac.AlertmanagerURL != "" {
		links[ac.AlertmanagerURL] = fc.Alerts.AlertmanagerClient
	}
	if ac.WebhookURL != "" {
		links[ac.WebhookURL] = fc.Alerts.WebhookClient
	}
	client, err := boot.NewHTTPClient(10*time.Second, links)
	if err != nil {
		return nil, fmt.Errorf("config: alerts: %w", err)
	}
	var errs []error
	if ac.AlertmanagerURL != "" {
		errs = append(errs, boot.CheckHTTP(ctx, client, "alertmanager", http.MethodGet, analytics.AlertmanagerAPI(ac.AlertmanagerURL, "status")))
	}
	if ac.WebhookURL != "" {
		errs = append(errs, boot.CheckHTTP(ctx, client, "alert webhook", http.MethodHead, ac.WebhookURL))
	}
	for _, err := range errs {
		if boot.Fatal(err) {
			return nil, err
		} else if err != nil {
			log.Warn("alert destination not reachable at start", "error", err.Error())
		}
	}
	return analytics.NewAlerter(ac, client, nil), nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
