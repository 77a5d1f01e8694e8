package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edgelimit/edgelimit/analytics"
)

// fileConfig is analytics' YAML file. Every field is optional; addresses
// and secrets come from the environment too (see applyEnv), which wins.
type fileConfig struct {
	ClickHouse clickhouseConfig `yaml:"clickhouse"`
	Redis      redisConfig      `yaml:"redis"`
	// Listen serves the API, the dashboard, /metrics and /healthz;
	// default 127.0.0.1:9092 (loopback: put a proxy with TLS in front to
	// share it).
	Listen string `yaml:"listen"`
	// Token guards the API and the dashboard; at least 16 characters.
	// Required by serve. Better set through EDGELIMIT_ANALYTICS_TOKEN.
	Token secret `yaml:"token"`
	// DryRun detects and alerts but writes no directives to Redis.
	DryRun bool `yaml:"dry_run"`
	// Interval between detector runs; default 5s.
	Interval time.Duration `yaml:"interval"`
	Hot      hotConfig     `yaml:"hot"`
	NAT      natConfig     `yaml:"nat"`
	Alerts   alertsConfig  `yaml:"alerts"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
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

// redisConfig is where directives go: the gateways' Redis, with their
// prefix.
type redisConfig struct {
	Addr         string   `yaml:"addr"`
	ClusterAddrs []string `yaml:"cluster_addrs"`
	Username     string   `yaml:"username"`
	Password     secret   `yaml:"password"`
	DB           int      `yaml:"db"`
	// Prefix must be the gateways' redis.prefix; default "rl".
	Prefix string `yaml:"prefix"`
}

// hotConfig mirrors analytics.HotConfig; zero fields take its defaults.
type hotConfig struct {
	Disabled        bool          `yaml:"disabled"`
	Window          time.Duration `yaml:"window"`
	MinSpan         time.Duration `yaml:"min_span"`
	MinRate         float64       `yaml:"min_rate"`
	MinShare        float64       `yaml:"min_share"`
	ShareMinRate    float64       `yaml:"share_min_rate"`
	CoolRatio       float64       `yaml:"cool_ratio"`
	MinGateways     int           `yaml:"min_gateways"`
	MinGatewayShare float64       `yaml:"min_gateway_share"`
	TTL             time.Duration `yaml:"ttl"`
	MaxKeys         int           `yaml:"max_keys"`
}

// natConfig mirrors analytics.NATConfig.
type natConfig struct {
	Disabled              bool          `yaml:"disabled"`
	Window                time.Duration `yaml:"window"`
	MinDistinctKeys       int64         `yaml:"min_distinct_keys"`
	MinDistinctUserAgents int64         `yaml:"min_distinct_user_agents"`
	MinRequests           int64         `yaml:"min_requests"`
	PerClient             float64       `yaml:"per_client"`
	MaxFactor             float64       `yaml:"max_factor"`
	CoolRatio             float64       `yaml:"cool_ratio"`
	TTL                   time.Duration `yaml:"ttl"`
	MaxIPs                int           `yaml:"max_ips"`
}

// alertsConfig mirrors analytics.AlertConfig.
type alertsConfig struct {
	Disabled              bool              `yaml:"disabled"`
	Window                time.Duration     `yaml:"window"`
	StoreUnavailableRatio float64           `yaml:"store_unavailable_ratio"`
	FailOpenRatio         float64           `yaml:"fail_open_ratio"`
	FailClosedRatio       float64           `yaml:"fail_closed_ratio"`
	MinRequests           int64             `yaml:"min_requests"`
	ResendInterval        time.Duration     `yaml:"resend_interval"`
	AlertmanagerURL       string            `yaml:"alertmanager_url"`
	WebhookURL            secret            `yaml:"webhook_url"` // may carry a token in its path
	Labels                map[string]string `yaml:"labels"`
	GeneratorURL          string            `yaml:"generator_url"`
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
// the defaults, and validates what every subcommand needs.
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
	return fc, fc.validate()
}

// applyEnv overrides the file with EDGELIMIT_* variables.
func (fc *fileConfig) applyEnv(getenv func(string) string) error {
	set := func(dst *string, name string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	setSecret := func(dst *secret, name string) {
		if v := getenv(name); v != "" {
			*dst = secret(v)
		}
	}
	set(&fc.ClickHouse.Addr, "EDGELIMIT_CLICKHOUSE_ADDR")
	set(&fc.ClickHouse.Database, "EDGELIMIT_CLICKHOUSE_DATABASE")
	set(&fc.ClickHouse.Username, "EDGELIMIT_CLICKHOUSE_USER")
	setSecret(&fc.ClickHouse.Password, "EDGELIMIT_CLICKHOUSE_PASSWORD")
	addr, cluster := getenv("EDGELIMIT_REDIS_ADDR"), getenv("EDGELIMIT_REDIS_CLUSTER_ADDRS")
	switch {
	case addr != "" && cluster != "":
		return errors.New("set EDGELIMIT_REDIS_ADDR or EDGELIMIT_REDIS_CLUSTER_ADDRS, not both")
	case addr != "":
		fc.Redis.Addr, fc.Redis.ClusterAddrs = addr, nil
	case cluster != "":
		fc.Redis.Addr, fc.Redis.ClusterAddrs = "", strings.Split(cluster, ",")
	}
	setSecret(&fc.Redis.Password, "EDGELIMIT_REDIS_PASSWORD")
	set(&fc.Redis.Prefix, "EDGELIMIT_REDIS_PREFIX")
	setSecret(&fc.Token, "EDGELIMIT_ANALYTICS_TOKEN")
	set(&fc.Listen, "EDGELIMIT_ANALYTICS_LISTEN")
	set(&fc.Alerts.AlertmanagerURL, "EDGELIMIT_ALERTMANAGER_URL")
	setSecret(&fc.Alerts.WebhookURL, "EDGELIMIT_ALERT_WEBHOOK_URL")
	set(&fc.LogLevel, "EDGELIMIT_LOG_LEVEL")
	return nil
}

func (fc *fileConfig) defaults() {
	if fc.Listen == "" {
		fc.Listen = "127.0.0.1:9092"
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
	if fc.Redis.Prefix == "" {
		fc.Redis.Prefix = "rl"
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
	if fc.Redis.Addr != "" && len(fc.Redis.ClusterAddrs) > 0 {
		errs = append(errs, errors.New("redis: set addr or cluster_addrs, not both"))
	}
	if strings.ContainsAny(fc.Redis.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("redis.prefix %q may not contain braces", fc.Redis.Prefix))
	}
	if _, _, err := net.SplitHostPort(fc.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", fc.Listen, err))
	}
	if _, err := parseLevel(fc.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if err := fc.analyticsConfig().WithDefaults().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateServe adds what serve needs beyond the analyst commands.
func (fc fileConfig) validateServe() error {
	var errs []error
	if len(fc.Token) < analytics.MinTokenLen {
		errs = append(errs, fmt.Errorf("token (or EDGELIMIT_ANALYTICS_TOKEN) of at least %d characters is required to serve the API", analytics.MinTokenLen))
	}
	if !fc.DryRun && fc.Redis.Addr == "" && len(fc.Redis.ClusterAddrs) == 0 {
		errs = append(errs, errors.New("redis.addr or redis.cluster_addrs (or EDGELIMIT_REDIS_ADDR / EDGELIMIT_REDIS_CLUSTER_ADDRS) is required to write directives; set dry_run: true to run without"))
	}
	return errors.Join(errs...)
}

// analyticsConfig is the analytics package's part of the file.
func (fc fileConfig) analyticsConfig() analytics.Config {
	h, n, a := fc.Hot, fc.NAT, fc.Alerts
	return analytics.Config{
		Interval: fc.Interval,
		Hot: analytics.HotConfig{
			Disabled: h.Disabled, Window: h.Window, MinSpan: h.MinSpan, MinRate: h.MinRate, MinShare: h.MinShare,
			ShareMinRate: h.ShareMinRate, CoolRatio: h.CoolRatio, MinGateways: h.MinGateways,
			MinGatewayShare: h.MinGatewayShare, TTL: h.TTL, MaxKeys: h.MaxKeys,
		},
		NAT: analytics.NATConfig{
			Disabled: n.Disabled, Window: n.Window, MinDistinctKeys: n.MinDistinctKeys,
			MinDistinctUserAgents: n.MinDistinctUserAgents, MinRequests: n.MinRequests,
			PerClient: n.PerClient, MaxFactor: n.MaxFactor, CoolRatio: n.CoolRatio, TTL: n.TTL, MaxIPs: n.MaxIPs,
		},
		Alerts: analytics.AlertConfig{
			Disabled: a.Disabled, Window: a.Window, StoreUnavailableRatio: a.StoreUnavailableRatio,
			FailOpenRatio: a.FailOpenRatio, FailClosedRatio: a.FailClosedRatio, MinRequests: a.MinRequests,
			ResendInterval: a.ResendInterval, AlertmanagerURL: a.AlertmanagerURL, WebhookURL: string(a.WebhookURL),
			Labels: a.Labels, GeneratorURL: a.GeneratorURL,
		},
	}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return l, fmt.Errorf("log_level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
