package main

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/envoyrls"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

// fileConfig is the YAML file: the gateway's own settings at the top
// level, plus where its store and events go.
type fileConfig struct {
	gateway.Config `yaml:",inline"`
	Redis          redisConfig `yaml:"redis"`
	Kafka          kafkaConfig `yaml:"kafka"`
	// GRPC serves Envoy's rate limit service (envoyrls); off unless
	// grpc.listen is set.
	GRPC envoyrls.Config `yaml:"grpc"`
	// AdminAPI guards the key admin API on the admin listener; off
	// without a token. Restart.
	AdminAPI gateway.AdminConfig `yaml:"admin_api"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
	// GCPercent is the Go collector's GOGC: how far the heap may grow
	// past what is live before the next collection; default 400 (Go's own
	// is 100). A gateway's live heap is a few MB while every request
	// allocates, so at 100 it collects many times a second and spends a
	// sixth of its CPU on it; 400 costs a few MB. The GOGC environment
	// variable, when set, wins. Restart.
	GCPercent int `yaml:"gc_percent"`
}

// defaultGCPercent: measured in docs/operations.md ("The collector").
const defaultGCPercent = 400

// gcPercent is GCPercent or its default.
func (fc fileConfig) gcPercent() int {
	if fc.GCPercent == 0 {
		return defaultGCPercent
	}
	return fc.GCPercent
}

// envAdminToken names the token EDGELIMIT_ADMIN_TOKEN sets in audit records.
const envAdminToken = "env"

// redisConfig says where the shared limiter store is. No Redis: the
// in-memory store (limits per process).
type redisConfig struct {
	boot.Redis `yaml:",inline"`
	// Prefix starts every limiter key; default "rl" (limiter.Config).
	Prefix string `yaml:"prefix"`
	// DenyCache is how many denied keys are remembered locally; default
	// 65536 (limiter.Config), negative disables.
	DenyCache int `yaml:"deny_cache"`
	// PreviousLayout makes checks also read the per-rule keys of releases
	// before the one-key layout (limiter.Config.PreviousLayout): on while
	// upgrading from such a release, for the longest rule period, then
	// off. Default false. Restart.
	PreviousLayout bool `yaml:"previous_layout"`
	// WarmConns is how many connections to each master the gateway dials
	// and authenticates before it says it is ready, and keeps open;
	// default 4. Restart.
	WarmConns int `yaml:"warm_conns"`
}

// defaultWarmConns: the limiter's pipeline (its sender; a check that
// finds it in flight waits for the next one), the key admin API and the
// directive watcher use one each, and one is spare for a pipeline a
// Cluster node answers slowly.
const defaultWarmConns = 4

// maxWarmConns bounds warm_conns: connections a gateway holds on every
// master, whether it needs them or not.
const maxWarmConns = 256

// warmConns is WarmConns or its default.
func (rc redisConfig) warmConns() int {
	if rc.WarmConns == 0 {
		return defaultWarmConns
	}
	return rc.WarmConns
}

// limiterConfig is the limiter's configuration from the redis section.
func (rc redisConfig) limiterConfig() limiter.Config {
	return limiter.Config{Prefix: rc.Prefix, DenyCache: rc.DenyCache, PreviousLayout: rc.PreviousLayout}
}

// kafkaConfig says where decision events go.
type kafkaConfig struct {
	// Brokers are seed brokers. None: no decision events, unless Embedded.
	boot.Kafka `yaml:",inline"`
	// Topic default "decisions" (publish.Config).
	Topic string `yaml:"topic"`
	// Disabled turns decision events off.
	Disabled bool `yaml:"disabled"`
	// Embedded starts an in-memory Kafka (franz-go's kfake) inside the
	// gateway when no brokers are set: for trials only, it costs memory
	// (see openEvents). Default false.
	Embedded bool `yaml:"embedded"`
	// MaxBuffered bounds events waiting for Kafka; default 50000
	// (publish.Config).
	MaxBuffered int `yaml:"max_buffered"`
	// EmbeddedListen is where the embedded Kafka listens, on 127.0.0.1
	// only; default a free port.
	EmbeddedListen string `yaml:"embedded_listen"`
}

// errConfig marks a configuration the gateway cannot start or reload with.
var errConfig = errors.New("config")

// loadConfig reads path, applies environment overrides and validates the
// result. Its errors name the file and every problem found.
func loadConfig(path string, getenv func(string) string) (fileConfig, error) {
	var fc fileConfig
	if err := boot.LoadYAML(path, &fc); err != nil {
		return fc, fmt.Errorf("%w: %w", errConfig, err)
	}
	if err := fc.applyEnv(boot.NewEnv(getenv)); err != nil {
		return fc, fmt.Errorf("%w: %s: %w", errConfig, path, err)
	}
	if err := fc.Validate(); err != nil {
		return fc, fmt.Errorf("%w: %s:\n%w", errConfig, path, err)
	}
	return fc, nil
}

// applyEnv overrides addresses and secrets from the environment, so one
// file serves every environment and holds no secrets.
func (fc *fileConfig) applyEnv(e *boot.Env) error {
	e.String(&fc.GatewayID, "EDGELIMIT_GATEWAY_ID")
	e.String(&fc.Listen, "EDGELIMIT_LISTEN")
	e.String(&fc.AdminListen, "EDGELIMIT_ADMIN_LISTEN")
	e.String(&fc.LogLevel, "EDGELIMIT_LOG_LEVEL")
	var key boot.Secret
	e.Secret(&key, "EDGELIMIT_KEY_HASH_SECRET")
	if key != "" {
		fc.KeyHashSecret = gateway.Secret(key)
	}
	var proof boot.Secret
	e.Secret(&proof, "EDGELIMIT_TRUSTED_PROXY_SECRET")
	if proof != "" {
		fc.TrustedProxySecret = gateway.Secret(proof)
	}
	var admin boot.Secret
	e.Secret(&admin, "EDGELIMIT_ADMIN_TOKEN")
	if admin != "" {
		tokens := make(map[string]gateway.Secret, len(fc.AdminAPI.Tokens)+1)
		for name, t := range fc.AdminAPI.Tokens {
			tokens[name] = t
		}
		tokens[envAdminToken] = gateway.Secret(admin)
		fc.AdminAPI.Tokens = tokens
	}
	fc.Redis.ApplyEnv(e)
	e.String(&fc.Redis.Prefix, "EDGELIMIT_REDIS_PREFIX")
	fc.Kafka.ApplyEnv(e)
	e.String(&fc.Kafka.Topic, "EDGELIMIT_KAFKA_TOPIC")
	e.Bool(&fc.Kafka.Embedded, "EDGELIMIT_KAFKA_EMBEDDED")
	e.String(&fc.GRPC.Listen, "EDGELIMIT_GRPC_LISTEN")
	e.String(&fc.GRPC.ConfigDir, "EDGELIMIT_GRPC_CONFIG_DIR")

	// EDGELIMIT_UPSTREAM_<NAME> sets upstream NAME's URL (name upper-cased,
	// '-' and '.' as '_'); EDGELIMIT_UPSTREAM sets the only one.
	if len(fc.Upstreams) > 0 {
		ups := make(map[string]gateway.Upstream, len(fc.Upstreams))
		for name, u := range fc.Upstreams {
			e.String(&u.URL, "EDGELIMIT_UPSTREAM_"+envName(name))
			ups[name] = u
		}
		fc.Upstreams = ups
	}
	if v := e.Lookup("EDGELIMIT_UPSTREAM"); v != "" {
		if len(fc.Upstreams) != 1 {
			e.Fail(fmt.Errorf("EDGELIMIT_UPSTREAM needs exactly one upstream in the file, found %d; use EDGELIMIT_UPSTREAM_<NAME>", len(fc.Upstreams)))
		}
		for name, u := range fc.Upstreams {
			u.URL = v
			fc.Upstreams[name] = u
		}
	}
	return e.Err()
}

// Validate joins every problem with the file.
func (fc fileConfig) Validate() error {
	errs := []error{fc.Config.Validate(), fc.Redis.Validate(), fc.Kafka.Validate(), fc.AdminAPI.Validate()}
	if err := fc.Redis.limiterConfig().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("redis.prefix: %w", err))
	}
	if n := fc.GCPercent; n != 0 && (n < 50 || n > 10000) {
		errs = append(errs, fmt.Errorf("gc_percent: %d, want 50 to 10000 (0: the default, %d)", n, defaultGCPercent))
	}
	if n := fc.Redis.WarmConns; n < 0 || n > maxWarmConns {
		errs = append(errs, fmt.Errorf("redis.warm_conns: %d, want 1 to %d (0: the default, %d)", n, maxWarmConns, defaultWarmConns))
	}
	if fc.Redis.PreviousLayout && !fc.Redis.Set() {
		// The in-memory store never had the previous layout.
		errs = append(errs, errors.New("redis.previous_layout: set without a Redis (addr, cluster_addrs or sentinel_addrs)"))
	}
	if _, err := boot.ParseLevel(fc.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if fc.Kafka.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("kafka.max_buffered: %d is negative", fc.Kafka.MaxBuffered))
	}
	if _, err := embeddedPort(fc.Kafka.EmbeddedListen); err != nil {
		errs = append(errs, err)
	}
	if err := fc.GRPC.Validate(); err != nil {
		errs = append(errs, err)
	} else if fc.GRPC.Enabled() {
		// The Envoy ratelimit files are part of the configuration: -check
		// and a reload refuse a directory envoyproxy/ratelimit would.
		if _, err := envoyrls.LoadDir(fc.GRPC.ConfigDir); err != nil {
			errs = append(errs, fmt.Errorf("grpc.config_dir: %w", err))
		}
	}
	return errors.Join(errs...)
}

// restartNeeded lists settings of next that a reload cannot apply.
func restartNeeded(cur, next fileConfig) []string {
	var out []string
	if !reflect.DeepEqual(cur.Redis, next.Redis) {
		out = append(out, "redis")
	}
	if !reflect.DeepEqual(cur.Kafka, next.Kafka) {
		out = append(out, "kafka")
	}
	if !reflect.DeepEqual(cur.AdminAPI, next.AdminAPI) {
		out = append(out, "admin_api")
	}
	if cur.LogLevel != next.LogLevel {
		out = append(out, "log_level")
	}
	if cur.GCPercent != next.GCPercent {
		out = append(out, "gc_percent")
	}
	if a, b := cur.GRPC, next.GRPC; a.Listen != b.Listen || a.TLS != b.TLS || a.MaxMessageBytes != b.MaxMessageBytes ||
		a.MaxConcurrentStreams != b.MaxConcurrentStreams || a.Keepalive != b.Keepalive {
		out = append(out, "grpc (listener settings)")
	}
	return out
}

func envName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
}
