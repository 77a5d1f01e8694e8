package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/edgelimit/edgelimit/gateway"
)

// fileConfig is the YAML file: the gateway's own settings at the top
// level, plus where its store and events go.
type fileConfig struct {
	gateway.Config `yaml:",inline"`
	Redis          redisConfig `yaml:"redis"`
	Kafka          kafkaConfig `yaml:"kafka"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
}

// redisConfig says where the shared limiter store is. Neither Addr nor
// ClusterAddrs: the in-memory store (limits per process).
type redisConfig struct {
	// Addr is a standalone Redis, host:port.
	Addr string `yaml:"addr"`
	// ClusterAddrs are Redis Cluster seed nodes.
	ClusterAddrs []string `yaml:"cluster_addrs"`
	// SentinelAddrs find the master named SentinelMaster through Redis
	// Sentinel, following failovers.
	SentinelAddrs  []string       `yaml:"sentinel_addrs"`
	SentinelMaster string         `yaml:"sentinel_master"`
	Username       string         `yaml:"username"`
	Password       gateway.Secret `yaml:"password"`
	DB             int            `yaml:"db"`
	// Prefix starts every limiter key; default "rl".
	Prefix string `yaml:"prefix"`
	// DenyCache is how many denied keys are remembered locally; default
	// 65536, negative disables.
	DenyCache int `yaml:"deny_cache"`
}

// kafkaConfig says where decision events go.
type kafkaConfig struct {
	// Brokers are seed brokers. None: an embedded in-memory Kafka (kfake),
	// unless Disabled.
	Brokers []string `yaml:"brokers"`
	// Topic default "decisions".
	Topic string `yaml:"topic"`
	// Disabled turns decision events off.
	Disabled bool `yaml:"disabled"`
	// MaxBuffered bounds events waiting for Kafka; default 50000.
	MaxBuffered int `yaml:"max_buffered"`
	// EmbeddedListen is where the embedded Kafka listens; default
	// 127.0.0.1 on a free port.
	EmbeddedListen string `yaml:"embedded_listen"`
}

// errConfig marks a configuration the gateway cannot start or reload with.
var errConfig = errors.New("config")

// loadConfig reads path, applies environment overrides and validates the
// result. Its errors name the file and every problem found.
func loadConfig(path string, getenv func(string) string) (fileConfig, error) {
	var fc fileConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return fc, fmt.Errorf("%w: %w", errConfig, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true) // a misspelt field is an error, not a silent default
	if err := dec.Decode(&fc); err != nil {
		return fc, fmt.Errorf("%w: %s: %w", errConfig, path, err)
	}
	if err := fc.applyEnv(getenv); err != nil {
		return fc, fmt.Errorf("%w: %s: %w", errConfig, path, err)
	}
	if err := fc.validate(); err != nil {
		return fc, fmt.Errorf("%w: %s:\n%w", errConfig, path, err)
	}
	return fc, nil
}

// applyEnv overrides addresses and secrets from the environment, so one
// file serves every environment and holds no secrets.
func (fc *fileConfig) applyEnv(getenv func(string) string) error {
	set := func(dst *string, name string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	set(&fc.GatewayID, "EDGELIMIT_GATEWAY_ID")
	set(&fc.Listen, "EDGELIMIT_LISTEN")
	set(&fc.AdminListen, "EDGELIMIT_ADMIN_LISTEN")
	set(&fc.LogLevel, "EDGELIMIT_LOG_LEVEL")
	if v := getenv("EDGELIMIT_KEY_HASH_SECRET"); v != "" {
		fc.KeyHashSecret = gateway.Secret(v)
	}

	addr, cluster := getenv("EDGELIMIT_REDIS_ADDR"), getenv("EDGELIMIT_REDIS_CLUSTER_ADDRS")
	sentinel := getenv("EDGELIMIT_REDIS_SENTINEL_ADDRS")
	switch {
	case addr != "" && cluster != "", sentinel != "" && (addr != "" || cluster != ""):
		return errors.New("set one of EDGELIMIT_REDIS_ADDR, EDGELIMIT_REDIS_CLUSTER_ADDRS or EDGELIMIT_REDIS_SENTINEL_ADDRS")
	case sentinel != "":
		fc.Redis.Addr, fc.Redis.ClusterAddrs, fc.Redis.SentinelAddrs = "", nil, splitList(sentinel)
	case addr != "":
		fc.Redis.Addr, fc.Redis.ClusterAddrs, fc.Redis.SentinelAddrs = addr, nil, nil
	case cluster != "":
		fc.Redis.Addr, fc.Redis.ClusterAddrs, fc.Redis.SentinelAddrs = "", splitList(cluster), nil
	}
	set(&fc.Redis.SentinelMaster, "EDGELIMIT_REDIS_SENTINEL_MASTER")
	set(&fc.Redis.Prefix, "EDGELIMIT_REDIS_PREFIX")
	if v := getenv("EDGELIMIT_REDIS_PASSWORD"); v != "" {
		fc.Redis.Password = gateway.Secret(v)
	}
	if v := getenv("EDGELIMIT_KAFKA_BROKERS"); v != "" {
		fc.Kafka.Brokers = splitList(v)
	}
	set(&fc.Kafka.Topic, "EDGELIMIT_KAFKA_TOPIC")

	// EDGELIMIT_UPSTREAM_<NAME> sets upstream NAME's URL (name upper-cased,
	// '-' and '.' as '_'); EDGELIMIT_UPSTREAM sets the only one.
	if len(fc.Upstreams) > 0 {
		ups := make(map[string]gateway.Upstream, len(fc.Upstreams))
		for name, u := range fc.Upstreams {
			set(&u.URL, "EDGELIMIT_UPSTREAM_"+envName(name))
			ups[name] = u
		}
		fc.Upstreams = ups
	}
	if v := getenv("EDGELIMIT_UPSTREAM"); v != "" {
		if len(fc.Upstreams) != 1 {
			return fmt.Errorf("EDGELIMIT_UPSTREAM needs exactly one upstream in the file, found %d; use EDGELIMIT_UPSTREAM_<NAME>", len(fc.Upstreams))
		}
		for name, u := range fc.Upstreams {
			u.URL = v
			fc.Upstreams[name] = u
		}
	}
	return nil
}

func (fc fileConfig) validate() error {
	var errs []error
	if err := fc.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	n := 0
	for _, set := range []bool{fc.Redis.Addr != "", len(fc.Redis.ClusterAddrs) > 0, len(fc.Redis.SentinelAddrs) > 0} {
		if set {
			n++
		}
	}
	if n > 1 {
		errs = append(errs, errors.New("redis: set one of addr, cluster_addrs or sentinel_addrs"))
	}
	if (len(fc.Redis.SentinelAddrs) > 0) != (fc.Redis.SentinelMaster != "") {
		errs = append(errs, errors.New("redis: sentinel_addrs and sentinel_master go together"))
	}
	if strings.ContainsAny(fc.Redis.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("redis.prefix: %q may not contain braces", fc.Redis.Prefix))
	}
	if _, err := parseLevel(fc.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if fc.Kafka.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("kafka.max_buffered: %d is negative", fc.Kafka.MaxBuffered))
	}
	return errors.Join(errs...)
}

// restartNeeded lists settings of next that a reload cannot apply.
func restartNeeded(cur, next fileConfig) []string {
	var out []string
	if cur.Redis.Addr != next.Redis.Addr || !slices.Equal(cur.Redis.ClusterAddrs, next.Redis.ClusterAddrs) ||
		!slices.Equal(cur.Redis.SentinelAddrs, next.Redis.SentinelAddrs) || cur.Redis.SentinelMaster != next.Redis.SentinelMaster ||
		cur.Redis.Username != next.Redis.Username || cur.Redis.Password != next.Redis.Password ||
		cur.Redis.DB != next.Redis.DB || cur.Redis.Prefix != next.Redis.Prefix || cur.Redis.DenyCache != next.Redis.DenyCache {
		out = append(out, "redis")
	}
	if !slices.Equal(cur.Kafka.Brokers, next.Kafka.Brokers) || cur.Kafka.Topic != next.Kafka.Topic ||
		cur.Kafka.Disabled != next.Kafka.Disabled || cur.Kafka.MaxBuffered != next.Kafka.MaxBuffered ||
		cur.Kafka.EmbeddedListen != next.Kafka.EmbeddedListen {
		out = append(out, "kafka")
	}
	if cur.LogLevel != next.LogLevel {
		out = append(out, "log_level")
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
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
