// Command gateway is edgelimit's edge: it rate-limits API traffic against a
// shared Redis, answers 429s with rate-limit headers, proxies allowed
// requests upstream and publishes every decision to Kafka.
//
//	gateway -config gateway.yaml          serve
//	gateway -config gateway.yaml -check   validate, print the effective config (secrets redacted), exit
//	gateway -version                      print the version, exit
//	gateway -hash-key [-key-id ID] [-key-plan PLAN] < key
//	                                      print the api_keys entry of the API key on stdin, exit
//	gateway admin key show|reset|clear -api-key ID|-user ID|-ip ADDR [-route NAME] [-admin URL]
//	gateway admin key show|reset|clear -domain NAME -entry KEY=VALUE... [-admin URL]
//	                                      a running gateway's key admin API (token: EDGELIMIT_ADMIN_TOKEN)
//
// Environment overrides (addresses and secrets, so files hold none; a
// secret X can also be read from the file named by X_FILE):
// EDGELIMIT_GATEWAY_ID, EDGELIMIT_LISTEN, EDGELIMIT_ADMIN_LISTEN,
// EDGELIMIT_REDIS_ADDR, EDGELIMIT_REDIS_CLUSTER_ADDRS,
// EDGELIMIT_REDIS_SENTINEL_ADDRS, EDGELIMIT_REDIS_SENTINEL_MASTER,
// EDGELIMIT_REDIS_USERNAME, EDGELIMIT_REDIS_PASSWORD, EDGELIMIT_REDIS_DB,
// EDGELIMIT_REDIS_PREFIX, EDGELIMIT_KAFKA_BROKERS, EDGELIMIT_KAFKA_TOPIC,
// EDGELIMIT_KAFKA_EMBEDDED, EDGELIMIT_KEY_HASH_SECRET,
// EDGELIMIT_GRPC_LISTEN, EDGELIMIT_GRPC_CONFIG_DIR, EDGELIMIT_ADMIN_TOKEN,
// EDGELIMIT_REDIS_SENTINEL_USERNAME, EDGELIMIT_REDIS_SENTINEL_PASSWORD,
// EDGELIMIT_KAFKA_SASL_* and EDGELIMIT_{REDIS,KAFKA}_TLS_* (see
// docs/security.md),
// EDGELIMIT_UPSTREAM_<NAME>, EDGELIMIT_UPSTREAM, EDGELIMIT_LOG_LEVEL.
//
// SIGHUP reloads the file, and so does a change of its content, looked for
// every -watch (default 1s; a Kubernetes ConfigMap's symlink swap counts);
// an invalid file keeps the running config. SIGTERM or SIGINT drains and
// stops.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/envoyrls"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

func main() { boot.Main("gateway", run) }

// run serves until ctx ends, then shuts down in order: fail readiness and
// stop taking traffic, finishing what is in flight; flush decision events;
// stop the admin listener (so metrics stay scrapeable to the end); close
// the embedded Kafka, if any, and Redis.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "admin" {
		return runAdmin(ctx, args[1:], getenv, stdout)
	}
	fs := boot.NewFlags("gateway", "YAML configuration file (required)", stdout)
	path := fs.Config
	check := fs.Bool("check", false, "validate the configuration, print it with secrets redacted, and exit")
	hashKey := fs.Bool("hash-key", false, "read one API key from stdin, print its api_keys entry (its SHA-256, never the key), and exit")
	keyID := fs.String("key-id", "", "with -hash-key: the entry's id (default: the first 16 hex digits of the SHA-256)")
	keyPlan := fs.String("key-plan", "", "with -hash-key: the entry's plan")
	watch := fs.Duration("watch", time.Second, "how often to look for a changed config file (also a Kubernetes ConfigMap's symlink swap) and reload it; 0: only on SIGHUP")
	if done, err := fs.Parse(args); done {
		return err
	}
	if *hashKey {
		return printKeyEntry(os.Stdin, stdout, *keyID, *keyPlan)
	}
	if *path == "" {
		return errors.New("-config is required")
	}
	// Hash the file before loading it: a change in between is then seen
	// by the first poll, never missed.
	fw := boot.NewFileWatch(*path)
	fc, err := loadConfig(*path, getenv)
	if err != nil {
		return err
	}
	if *check {
		fc.Config = fc.Config.WithDefaults()
		fc.GCPercent = fc.gcPercent()
		if fc.Redis.Set() {
			fc.Redis.WarmConns = fc.Redis.warmConns()
		}
		return boot.PrintYAML(stdout, *path+" is valid", fc)
	}
	if fc.GatewayID == "" {
		fc.GatewayID, _ = os.Hostname()
	}
	log, err := boot.NewLogger(stdout, fc.LogLevel)
	if err != nil {
		return err
	}
	if getenv("GOGC") == "" {
		debug.SetGCPercent(fc.gcPercent())
	}
	reg := boot.NewRegistry()

	// Hear SIGHUP before anything can be reloaded, so an early one is not
	// taken for the default action (exit).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	st, err := openStore(ctx, fc, reg, log)
	if err != nil {
		return err
	}
	defer st.close()
	ev, err := openEvents(ctx, fc, reg, log)
	if err != nil {
		return err
	}
	defer ev.closeCluster()

	opts := gateway.Options{Registry: reg, Logger: log, Ping: st.ping, Warm: st.warm}
	if st.lim != nil {
		opts.Store = st.lim
	}
	if ev.pub != nil {
		opts.Publisher = ev.pub
	}
	var watcher *limiter.Watcher
	if st.rdb != nil {
		watcher = newWatcher(st.rdb, fc.Redis.Prefix, log)
		opts.Directives = watcher
	}
	gw, err := gateway.New(fc.Config, opts)
	if err != nil {
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	defer gw.Close()

	defaults := fc.Config.WithDefaults()
	srv := gw.Server()
	traffic, ln, err := boot.Listen("traffic", srv.Addr, srv)
	if err != nil {
		return err
	}
	// Readiness fails first, so load balancers stop sending while the
	// server finishes what it has.
	traffic.Stop = func(ctx context.Context) error { gw.Drain(); return srv.Shutdown(ctx) }
	// The gateway's listener refuses framing net/http would let through
	// (Content-Length beside Transfer-Encoding) and caps connections.
	traffic.Run = func() error {
		if err := srv.Serve(gw.Listener(ln)); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve traffic %s: %w", ln.Addr(), err)
		}
		return nil
	}
	keys, err := gateway.NewAdmin(gw, fc.AdminAPI)
	if err != nil {
		ln.Close()
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	if !keys.Enabled() {
		log.Info("key admin API disabled: no admin token (admin_api.tokens or EDGELIMIT_ADMIN_TOKEN)")
	}
	mux := http.NewServeMux()
	boot.Admin{Registry: reg, Ready: gw.Ready, Pprof: fc.Pprof}.Register(mux)
	keys.Register(mux)
	admin, aln, err := boot.Listen("admin", defaults.AdminListen, boot.NewServer(mux, log))
	if err != nil {
		ln.Close()
		return err
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "admin_addr", aln.Addr().String(),
		"gateway_id", fc.GatewayID, "config", *path, "pprof", fc.Pprof, "version", boot.Version)

	actors := []boot.Actor{traffic, boot.Func("warmup", func(ctx context.Context) error {
		if gw.WarmUp(ctx) == nil {
			gw.KeepWarm(ctx)
		}
		<-ctx.Done() // an actor that returns stops the gateway
		return nil
	})}
	var rls *envoyrls.Service
	if fc.GRPC.Enabled() {
		var grpcActor boot.Actor
		rls, grpcActor, err = startRLS(fc.GRPC, gw, reg, log)
		if err != nil {
			ln.Close()
			aln.Close()
			return err
		}
		// Stopped beside the traffic listener, before events are flushed.
		actors = append(actors, grpcActor)
		keys.SetDoor(rls)
	}
	actors = append(actors, boot.Func("reload", func(ctx context.Context) error {
		cur := fc
		var w changeWatch = fw
		if rls != nil {
			// The Envoy ratelimit files reload like the file itself.
			// The Envoy ratelimit files, by content like the config file.
			dir := fc.GRPC.ConfigDir
			w = watches{fw, boot.NewWatch(dir, func() ([]byte, bool) { return envoyrls.DirSum(dir) })}
		}
		reloads(ctx, hup, w, *watch, func() { cur = reload(gw, rls, *path, getenv, cur, log) }, log)
		return nil
	}))
	if watcher != nil {
		actors = append(actors, boot.Func("directives", func(ctx context.Context) error { watcher.Run(ctx); return nil }))
	}
	if ev.pub != nil {
		actors = append(actors, boot.Actor{Name: "events", Stop: ev.pub.Close})
	}
	err = boot.Run(ctx, log, defaults.Timeouts.Shutdown, append(actors, admin)...)
	log.Info("gateway stopped")
	return err
}

// printKeyEntry reads one API key from in and writes the api_keys entry
// that admits it: the config file holds the key's SHA-256, never the key.
// Surrounding whitespace (echo's newline) is not part of the key; an HTTP
// header could not carry it anyway.
func printKeyEntry(in io.Reader, out io.Writer, id, plan string) error {
	b, err := io.ReadAll(io.LimitReader(in, 64<<10))
	if err != nil {
		return fmt.Errorf("read the key from stdin: %w", err)
	}
	key := strings.TrimSpace(string(b))
	switch {
	case key == "":
		return errors.New("-hash-key: no key on stdin (try: printf %s \"$KEY\" | gateway -hash-key)")
	case strings.ContainsAny(key, " \t\r\n"):
		return errors.New("-hash-key: the key on stdin contains whitespace; give one key, without spaces")
	}
	sum := sha256.Sum256([]byte(key))
	hexSum := hex.EncodeToString(sum[:])
	if id == "" {
		id = hexSum[:16] // the gateway's own default id
	}
	comment := ""
	if plan == "" {
		plan, comment = "PLAN", "  # PLAN: one of plans (or -key-plan)"
	}
	_, err = fmt.Fprintf(out, "- {id: %s, sha256: %s, plan: %s}%s\n", id, hexSum, plan, comment)
	return err
}

// newWatcher polls analytics' split and NAT directives in the background
// (one small GET a second), so the request path reads them from memory.
func newWatcher(rdb redis.UniversalClient, prefix string, log *slog.Logger) *limiter.Watcher {
	w := limiter.NewWatcher(limiter.NewDirectiveStore(rdb, prefix), time.Second)
	lastErr := false
	w.OnLoad = func(d *limiter.Directives, bad int, err error) {
		switch {
		case err != nil && !lastErr:
			log.Warn("directives: refresh failed; keeping the last set until it expires", "error", err.Error())
		case err == nil:
			log.Info("directives loaded", "version", d.Version, "splits", len(d.Splits), "nats", len(d.NATs), "malformed", bad)
		}
		lastErr = err != nil
	}
	return w
}

// startRLS serves Envoy's rate limit service over gRPC on the gateway's
// enforcement step: one more actor, which drains its health service and
// then stops gracefully (or hard at the shutdown deadline).
func startRLS(cfg envoyrls.Config, gw *gateway.Gateway, reg *prometheus.Registry, log *slog.Logger) (*envoyrls.Service, boot.Actor, error) {
	svc, err := envoyrls.New(cfg, gw, envoyrls.Options{Registry: reg, Logger: log, Ready: gw.Warmed()})
	if err != nil {
		return nil, boot.Actor{}, fmt.Errorf("%w: %w", errConfig, err)
	}
	srv, err := svc.Server()
	if err != nil {
		return nil, boot.Actor{}, fmt.Errorf("%w: %w", errConfig, err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, boot.Actor{}, fmt.Errorf("listen grpc %s: %w", cfg.Listen, err)
	}
	log.Info("envoy rate limit service listening", "grpc_addr", ln.Addr().String(), "config_dir", cfg.ConfigDir, "tls", cfg.TLS.CertFile != "")
	return svc, boot.Actor{
		Name: "grpc",
		Run: func() error {
			if err := srv.Serve(svc.Listener(ln)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("serve grpc %s: %w", ln.Addr(), err)
			}
			return nil
		},
		Stop: func(ctx context.Context) error {
			svc.Drain()
			done := make(chan struct{})
			go func() { srv.GracefulStop(); close(done) }()
			select {
			case <-done:
				return nil
			case <-ctx.Done():
				srv.Stop()
				return fmt.Errorf("grpc did not drain in time: %w", ctx.Err())
			}
		},
	}, nil
}

// reloads calls reload on every SIGHUP and, looking every `every` (0:
// never), when the file's content has changed, until ctx ends. The file's content
// that a reload read, valid or not, is not reloaded again until it changes:
// an invalid file is counted once, not once a poll.
func reloads(ctx context.Context, hup <-chan os.Signal, fw changeWatch, every time.Duration, reload func(), log *slog.Logger) {
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			fw.Seen()
			reload()
		case <-tick:
			if fw.Changed() {
				log.Info("config file changed; reloading", "config", fw.Path())
				reload()
			}
		}
	}
}

// reload re-reads the file; an invalid one keeps cur in force.
func reload(gw *gateway.Gateway, rls *envoyrls.Service, path string, getenv func(string) string, cur fileConfig, log *slog.Logger) fileConfig {
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
	if rls != nil {
		if err := rls.Reload(next.GRPC); err != nil {
			// The file passed loadConfig, so the directory changed since.
			log.Error("envoy ratelimit config reload failed; keeping the previous rules", "error", err.Error())
		}
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
	warm func(context.Context) error
}

func (s store) close() {
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
}

func openStore(ctx context.Context, fc fileConfig, reg prometheus.Registerer, log *slog.Logger) (store, error) {
	rc := fc.Redis
	if !rc.Set() {
		log.Warn("no Redis configured: using the in-memory store, so limits hold per gateway process, not across gateways")
		return store{}, nil
	}
	// Why this tuning: the gateway's store deadline (tens of ms) must bound
	// every call, so the client honours context deadlines on the socket; no
	// retries, because a retried EVALSHA after a timeout could consume
	// twice and the failure policy handles errors; short timeouts so a
	// dead node frees its connections quickly; warm connections for the
	// first requests.
	// The warm connections serve pipelines too (OnePool), and the pool
	// holds them whatever go-redis's default size.
	warm := rc.warmConns()
	rdb, err := boot.NewRedis(rc.Redis, boot.RedisTuning{
		Timeout: time.Second, MaxRetries: -1, MinIdleConns: warm, ContextTimeout: true,
		PoolSize: max(warm, 10*runtime.GOMAXPROCS(0)), OnePool: true,
	}, log)
	if err != nil {
		return store{}, fmt.Errorf("%w: %w", errConfig, err)
	}
	lim, err := limiter.New(rdb, rc.limiterConfig())
	if err != nil {
		rdb.Close()
		return store{}, fmt.Errorf("%w: redis: %w", errConfig, err)
	}
	if err := boot.RegisterRedisPool(reg, rdb); err != nil {
		rdb.Close()
		return store{}, err
	}
	// A Redis that is down now is the failure policy's business, not a
	// reason to refuse to start; wrong credentials or an untrusted
	// certificate are a configuration to fix, and no policy should hide
	// them.
	if err := boot.PingRedis(ctx, rdb, rc.Redis); boot.Fatal(err) {
		rdb.Close()
		return store{}, err
	}
	// The gateway's warm-up (Gateway.WarmUp) loads the function library
	// and dials the connections before /readyz says ready.
	log.Info("limiter store: Redis", "redis", rc.Target(), "cluster", len(rc.ClusterAddrs) > 0, "warm_conns", warm)
	return store{
		lim: lim, rdb: rdb,
		ping: func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		warm: func(ctx context.Context) error { return lim.Warm(ctx, warm) },
	}, nil
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

func openEvents(ctx context.Context, fc fileConfig, reg prometheus.Registerer, log *slog.Logger) (events, error) {
	kc := fc.Kafka
	switch {
	case kc.Disabled:
		log.Info("decision events disabled (kafka.disabled)")
		return events{}, nil
	case len(kc.Brokers) == 0 && !kc.Embedded:
		log.Warn("no Kafka brokers configured: decision events are OFF; set kafka.brokers (EDGELIMIT_KAFKA_BROKERS), " +
			"or kafka.embedded: true (EDGELIMIT_KAFKA_EMBEDDED) for an in-memory trial broker")
		return events{}, nil
	}
	var ev events
	link := kc.Kafka
	if len(link.Brokers) == 0 {
		// The publisher's topic, which the cluster must hold before the
		// first event.
		topic := publish.Config{Topic: kc.Topic}.WithDefaults().Topic
		c, err := embeddedKafka(kc, topic)
		if err != nil {
			return events{}, fmt.Errorf("start embedded kafka: %w", err)
		}
		ev.cluster, ev.stop = c, make(chan struct{})
		go applyRetention(c, ev.stop)
		// The in-process broker speaks neither TLS nor SASL.
		link = boot.Kafka{Brokers: c.ListenAddrs()}
		log.Warn("kafka.embedded: decision events go to an in-memory Kafka (kfake) inside this gateway, for trials only: "+
			"it keeps the last 10 minutes, at most 64 MiB per partition (4 partitions), and costs about twice that in memory; "+
			"set EDGELIMIT_KAFKA_BROKERS for a real one",
			"brokers", link.Brokers, "topic", topic)
	}
	opts, err := link.Opts(log)
	if err != nil {
		ev.closeCluster()
		return events{}, fmt.Errorf("%w: %w", errConfig, err)
	}
	// Events never block a request, so a broker that is down now only
	// costs dropped (counted) events; a link that can never work is a
	// configuration to fix before serving.
	if ev.cluster == nil {
		if err := link.Check(ctx, log); boot.Fatal(err) {
			return events{}, err
		} else if err != nil {
			log.Warn("Kafka not reachable at start; decision events are dropped (and counted) until it is", "error", err.Error())
		}
	}
	pub, err := publish.New(publish.Config{
		Brokers: link.Brokers, Topic: kc.Topic, MaxBuffered: kc.MaxBuffered, GatewayID: fc.GatewayID,
		Opts: append(opts, boot.KafkaMetrics(reg)),
	}, reg, log)
	if err != nil {
		ev.closeCluster()
		return events{}, fmt.Errorf("%w: kafka: %w", errConfig, err)
	}
	ev.pub = pub
	if ev.cluster == nil {
		log.Info("decision events: Kafka", "brokers", link.Brokers, "topic", kc.Topic)
	}
	return ev, nil
}

// embeddedPort is the port of kafka.embedded_listen; 0 (a free one) when
// it is empty. kfake binds 127.0.0.1 whatever host it is given, so any
// other host is refused rather than silently not served.
func embeddedPort(listen string) (int, error) {
	if listen == "" {
		return 0, nil
	}
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 0, fmt.Errorf("kafka.embedded_listen: %w", err)
	}
	if host != "" && host != "127.0.0.1" && host != "localhost" {
		return 0, fmt.Errorf("kafka.embedded_listen %q: the embedded Kafka listens on 127.0.0.1 only (a trial broker inside this gateway); set kafka.brokers for one other machines reach", listen)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("kafka.embedded_listen port %q: want 0 to 65535", p)
	}
	return int(port), nil
}

func embeddedKafka(kc kafkaConfig, topic string) (*kfake.Cluster, error) {
	port, err := embeddedPort(kc.EmbeddedListen)
	if err != nil {
		return nil, err
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
