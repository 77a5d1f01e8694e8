// Command gateway is edgelimit's edge: it rate-limits API traffic against a
// shared Redis, answers 429s with rate-limit headers, proxies allowed
// requests upstream and publishes every decision to Kafka.
//
//	gateway -config gateway.yaml          serve
//	gateway -config gateway.yaml -check   validate, print the effective config (secrets redacted), exit
//
// Environment overrides (addresses and secrets, so files hold none):
// EDGELIMIT_GATEWAY_ID, EDGELIMIT_LISTEN, EDGELIMIT_ADMIN_LISTEN,
// EDGELIMIT_REDIS_ADDR, EDGELIMIT_REDIS_CLUSTER_ADDRS, EDGELIMIT_REDIS_PASSWORD,
// EDGELIMIT_KAFKA_BROKERS, EDGELIMIT_KAFKA_TOPIC, EDGELIMIT_KEY_HASH_SECRET,
// EDGELIMIT_UPSTREAM_<NAME>, EDGELIMIT_UPSTREAM, EDGELIMIT_LOG_LEVEL.
//
// SIGHUP reloads the file (an invalid one keeps the running config);
// SIGTERM or SIGINT drains and stops.
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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/limiter"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down in order: stop taking
// traffic and finish what is in flight, flush decision events, stop the
// admin listener, close Redis.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stdout)
	path := fs.String("config", "", "YAML configuration file (required)")
	check := fs.Bool("check", false, "validate the configuration, print it with secrets redacted, and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("-config is required")
	}
	fc, err := loadConfig(*path, getenv)
	if err != nil {
		return err
	}
	if *check {
		fc.Config = fc.Config.WithDefaults()
		out, err := yaml.Marshal(fc)
		if err != nil {
			return fmt.Errorf("print config: %w", err)
		}
		fmt.Fprintf(stdout, "# %s is valid\n%s", *path, out)
		return nil
	}
	if fc.GatewayID == "" {
		fc.GatewayID, _ = os.Hostname()
	}
	level, _ := parseLevel(fc.LogLevel)
	log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: level}))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Hear SIGHUP before anything can be reloaded, so an early one is not
	// taken for the default action (exit).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	st, err := openStore(ctx, fc, log)
	if err != nil {
		return err
	}
	defer st.close()
	ev, err := openEvents(fc, reg, log)
	if err != nil {
		return err
	}
	defer ev.closeCluster()

	opts := gateway.Options{Registry: reg, Logger: log, Ping: st.ping}
	if st.lim != nil {
		opts.Store = st.lim
	}
	if ev.pub != nil {
		opts.Publisher = ev.pub
	}
	// Analytics' split and NAT directives: polled in the background (one
	// small GET a second), so the request path reads them from memory.
	var watcher *limiter.Watcher
	if st.rdb != nil {
		watcher = limiter.NewWatcher(limiter.NewDirectiveStore(st.rdb, fc.Redis.Prefix), time.Second)
		lastErr := false
		watcher.OnLoad = func(d *limiter.Directives, bad int, err error) {
			switch {
			case err != nil && !lastErr:
				log.Warn("directives: refresh failed; keeping the last set until it expires", "error", err.Error())
			case err == nil:
				log.Info("directives loaded", "version", d.Version, "splits", len(d.Splits), "nats", len(d.NATs), "malformed", bad)
			}
			lastErr = err != nil
		}
		opts.Directives = watcher
	}
	gw, err := gateway.New(fc.Config, opts)
	if err != nil {
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	defer gw.Close()

	srv, admin := gw.Server(), gw.AdminServer()
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	aln, err := net.Listen("tcp", admin.Addr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("listen admin: %w", err)
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "admin_addr", aln.Addr().String(),
		"gateway_id", fc.GatewayID, "config", *path, "pprof", fc.Pprof)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serve(srv, gw.Listener(ln)) })
	g.Go(func() error { return serve(admin, aln) })
	if watcher != nil {
		g.Go(func() error { watcher.Run(gctx); return nil })
	}
	g.Go(func() error {
		cur := fc
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-hup:
				cur = reload(gw, *path, getenv, cur, log)
			}
		}
	})
	g.Go(func() error {
		<-gctx.Done()
		return shutdown(gw, srv, admin, ev, fc.Config.WithDefaults().Timeouts.Shutdown, log)
	})
	err = g.Wait()
	log.Info("gateway stopped")
	return err
}

func serve(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	return nil
}

// shutdown stops in order: fail readiness and stop accepting, finish
// in-flight requests, flush decision events, then the admin listener (so
// metrics stay scrapeable to the end). Redis closes after run returns.
func shutdown(gw *gateway.Gateway, srv, admin *http.Server, ev events, timeout time.Duration, log *slog.Logger) error {
	log.Info("shutting down", "timeout", timeout.String())
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	gw.Drain()
	var errs []error
	if err := srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("drain traffic: %w", err))
	}
	if ev.pub != nil {
		if err := ev.pub.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := admin.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stop admin: %w", err))
	}
	return errors.Join(errs...)
}

// reload re-reads the file; an invalid one keeps cur in force.
func reload(gw *gateway.Gateway, path string, getenv func(string) string, cur fileConfig, log *slog.Logger) fileConfig {
	next, err := loadConfig(path, getenv)
	if err != nil {
		gw.ReloadFailed(err)
		return cur
	}
	if next.GatewayID == "" {
		next.GatewayID = cur.GatewayID
	}
	if err := gw.Reload(next.Config); err != nil {
		return cur // Reload counted and logged it
	}
	if fields := restartNeeded(cur, next); len(fields) > 0 {
		log.Warn("config reloaded, but these settings apply only after a restart", "sections", fields)
	}
	return next
}

// store is the shared limiter store, if any.
type store struct {
	lim  *limiter.Redis
	rdb  redis.UniversalClient
	ping func(context.Context) error
}

func (s store) close() {
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
}

func openStore(ctx context.Context, fc fileConfig, log *slog.Logger) (store, error) {
	rc := fc.Redis
	if rc.Addr == "" && len(rc.ClusterAddrs) == 0 && len(rc.SentinelAddrs) == 0 {
		log.Warn("no Redis configured: using the in-memory store, so limits hold per gateway process, not across gateways")
		return store{}, nil
	}
	// go-redis logs every failed dial; the breaker's transitions say it once.
	redis.SetLogger(redisLogger{log})
	// Why these options: the gateway's store deadline (tens of ms) must
	// bound every call, so the client honours context deadlines on the
	// socket; no retries, because a retried EVALSHA after a timeout could
	// consume twice and the failure policy handles errors; short
	// background timeouts so a dead node frees its connections quickly.
	var rdb redis.UniversalClient
	switch {
	case len(rc.SentinelAddrs) > 0:
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: rc.SentinelMaster, SentinelAddrs: rc.SentinelAddrs,
			Username: rc.Username, Password: string(rc.Password), DB: rc.DB,
			ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			MinIdleConns: 4,
		})
	case len(rc.ClusterAddrs) > 0:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: rc.ClusterAddrs, Username: rc.Username, Password: string(rc.Password),
			ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			MinIdleConns: 4,
		})
	default:
		rdb = redis.NewClient(&redis.Options{
			Addr: rc.Addr, Username: rc.Username, Password: string(rc.Password), DB: rc.DB,
			ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			MinIdleConns: 4,
		})
	}
	lim, err := limiter.New(rdb, limiter.Config{Prefix: rc.Prefix, DenyCache: rc.DenyCache})
	if err != nil {
		rdb.Close()
		return store{}, fmt.Errorf("%w: redis: %w", errConfig, err)
	}
	// Preloading is optional (a missing script is loaded on first use); a
	// Redis that is down now is the failure policy's business, not a reason
	// to refuse to start.
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	target := rc.Addr
	switch {
	case len(rc.SentinelAddrs) > 0:
		target = "sentinel " + rc.SentinelMaster + " " + fmt.Sprint(rc.SentinelAddrs)
	case target == "":
		target = fmt.Sprint(rc.ClusterAddrs)
	}
	if err := lim.Load(lctx); err != nil {
		log.Warn("Redis not reachable at start; failure policies apply until it is", "redis", target, "error", err.Error())
	} else {
		log.Info("limiter store: Redis", "redis", target, "cluster", len(rc.ClusterAddrs) > 0)
	}
	return store{lim: lim, rdb: rdb, ping: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}, nil
}

// events is where decision events go, if anywhere.
type events struct {
	pub     *publish.Publisher
	cluster *kfake.Cluster
	stop    chan struct{}
}

func (e events) closeCluster() {
	if e.cluster != nil {
		close(e.stop)
		e.cluster.Close()
	}
}

func openEvents(fc fileConfig, reg prometheus.Registerer, log *slog.Logger) (events, error) {
	kc := fc.Kafka
	if kc.Disabled {
		log.Info("decision events disabled (kafka.disabled)")
		return events{}, nil
	}
	var ev events
	brokers := kc.Brokers
	topic := kc.Topic
	if topic == "" {
		topic = "decisions"
	}
	if len(brokers) == 0 {
		c, err := embeddedKafka(kc, topic)
		if err != nil {
			return events{}, fmt.Errorf("start embedded kafka: %w", err)
		}
		ev.cluster, ev.stop = c, make(chan struct{})
		go applyRetention(c, ev.stop)
		brokers = c.ListenAddrs()
		log.Warn("no Kafka brokers configured: decision events go to an embedded in-memory Kafka (kfake, last 10 minutes / 64 MiB kept); set EDGELIMIT_KAFKA_BROKERS for a real one",
			"brokers", brokers, "topic", topic)
	}
	pub, err := publish.New(publish.Config{Brokers: brokers, Topic: topic, MaxBuffered: kc.MaxBuffered}, reg, log)
	if err != nil {
		ev.closeCluster()
		return events{}, fmt.Errorf("%w: kafka: %w", errConfig, err)
	}
	ev.pub = pub
	if kc.Brokers != nil {
		log.Info("decision events: Kafka", "brokers", brokers, "topic", topic)
	}
	return ev, nil
}

func embeddedKafka(kc kafkaConfig, topic string) (*kfake.Cluster, error) {
	port := 0
	if kc.EmbeddedListen != "" {
		_, p, err := net.SplitHostPort(kc.EmbeddedListen)
		if err != nil {
			return nil, fmt.Errorf("kafka.embedded_listen: %w", err)
		}
		if _, err := fmt.Sscan(p, &port); err != nil {
			return nil, fmt.Errorf("kafka.embedded_listen port %q: %w", p, err)
		}
	}
	return kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.SeedTopics(4, topic),
		// An embedded broker lives in the gateway's memory: keep it bounded.
		kfake.BrokerConfigs(map[string]string{
			"log.retention.ms":    "600000",
			"log.retention.bytes": "67108864",
		}),
	)
}

func applyRetention(c *kfake.Cluster, stop <-chan struct{}) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			c.ApplyRetention()
		}
	}
}

// redisLogger sends go-redis's internal messages to slog at debug level.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if s == "" {
		return slog.LevelInfo, nil
	}
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log_level: %q is not debug, info, warn or error", s)
	}
	return l, nil
}
