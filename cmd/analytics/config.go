package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/boot"
	"github.com/edgelimit/edgelimit/limiter"
)

// fileConfig is analytics' YAML file. Every field is optional; addresses
// and secrets come from the environment too (see ApplyEnv), which wins.
type fileConfig struct {
	ClickHouse boot.ClickHouse `yaml:"clickhouse"`
	Redis      redisConfig     `yaml:"redis"`
	// Listen serves the API, the dashboard and /healthz; default
	// 127.0.0.1:9092 (loopback: put a proxy with TLS in front to share it).
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz and /readyz, apart from the
	// API so that neither needs the token and neither is exposed with it;
	// default 127.0.0.1:9094.
	AdminListen string `yaml:"admin_listen"`
	// SecureCookie marks the dashboard's session cookie Secure although
	// analytics serves plain HTTP: set it behind a TLS proxy.
	SecureCookie bool `yaml:"secure_cookie"`
	// Token guards the API and the dashboard; at least 16 characters.
	// Required by serve. Better set through EDGELIMIT_ANALYTICS_TOKEN.
	Token boot.Secret `yaml:"token"`
	// DryRun detects and alerts but writes no directives to Redis.
	DryRun bool `yaml:"dry_run"`
	// Interval, StaleAfter, Hot, NAT and Alerts are analytics.Config's;
	// zero fields take its defaults.
	Interval   time.Duration       `yaml:"interval"`
	StaleAfter time.Duration       `yaml:"stale_after"`
	Hot        analytics.HotConfig `yaml:"hot"`
	NAT        analytics.NATConfig `yaml:"nat"`
	Alerts     alertsConfig        `yaml:"alerts"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
}

// alertsConfig is analytics.AlertConfig with its webhook URL as a secret:
// it may carry a token in its path.
type alertsConfig struct {
	analytics.AlertConfig `yaml:",inline"`
	WebhookURL            boot.Secret `yaml:"webhook_url"`
	// AlertmanagerClient and WebhookClient are how each is reached: TLS
	// (a private CA, a client certificate) and basic or bearer auth. Each
	// destination sees its own credentials only.
	AlertmanagerClient boot.HTTP `yaml:"alertmanager_client"`
	WebhookClient      boot.HTTP `yaml:"webhook_client"`
}

// MarshalYAML prints c (analytics check) with the password of the
// Alertmanager URL's user info (http://user:pass@am:9093, which the HTTP
// client sends as basic auth) and its query values (?token=…) redacted, as
// a Secret is; a URL too malformed to parse is not printed at all.
func (c alertsConfig) MarshalYAML() (any, error) {
	type plain alertsConfig // without this method
	if c.AlertmanagerURL != "" {
		c.AlertmanagerURL = analytics.RedactURL(c.AlertmanagerURL)
	}
	return plain(c), nil
}

// redisConfig is where directives go: the gateways' Redis, with their
// prefix.
type redisConfig struct {
	boot.Redis `yaml:",inline"`
	// Prefix must be the gateways' redis.prefix; default "rl"
	// (limiter.Config).
	Prefix string `yaml:"prefix"`
}

// loadConfig reads path (none: defaults only), applies the environment and
// the defaults, and validates (see boot.Load).
func loadConfig(path string, getenv func(string) string) (fileConfig, error) {
	return boot.Load[fileConfig](path, getenv)
}

// ApplyEnv overrides the file with EDGELIMIT_* variables.
func (fc *fileConfig) ApplyEnv(e *boot.Env) error {
	fc.ClickHouse.ApplyEnv(e)
	fc.Redis.ApplyEnv(e)
	e.String(&fc.Redis.Prefix, "EDGELIMIT_REDIS_PREFIX")
	e.Secret(&fc.Token, "EDGELIMIT_ANALYTICS_TOKEN")
	e.String(&fc.Listen, "EDGELIMIT_ANALYTICS_LISTEN")
	e.String(&fc.AdminListen, "EDGELIMIT_ANALYTICS_ADMIN_LISTEN")
	e.String(&fc.Alerts.AlertmanagerURL, "EDGELIMIT_ALERTMANAGER_URL")
	e.Secret(&fc.Alerts.WebhookURL, "EDGELIMIT_ALERT_WEBHOOK_URL")
	fc.Alerts.AlertmanagerClient.ApplyEnv(e, "EDGELIMIT_ALERTMANAGER")
	fc.Alerts.WebhookClient.ApplyEnv(e, "EDGELIMIT_ALERT_WEBHOOK")
	e.String(&fc.LogLevel, "EDGELIMIT_LOG_LEVEL")
	return e.Err()
}

// WithDefaults returns fc with the command's own defaults set; analytics
// and limiter apply theirs.
func (fc fileConfig) WithDefaults() fileConfig {
	fc.Listen = cmp.Or(fc.Listen, "127.0.0.1:9092")
	fc.AdminListen = cmp.Or(fc.AdminListen, "127.0.0.1:9094")
	fc.LogLevel = cmp.Or(fc.LogLevel, "info")
	fc.ClickHouse = fc.ClickHouse.WithDefaults()
	return fc
}

// Validate joins every problem with the file.
func (fc fileConfig) Validate() error {
	errs := []error{fc.ClickHouse.Validate(), fc.Redis.Validate(),
		fc.Alerts.AlertmanagerClient.Validate("alerts.alertmanager_client"), fc.Alerts.WebhookClient.Validate("alerts.webhook_client"),
		tlsNeedsHTTPS("alerts.alertmanager_client.tls", "alerts.alertmanager_url", fc.Alerts.AlertmanagerClient.TLS, fc.Alerts.AlertmanagerURL),
		tlsNeedsHTTPS("alerts.webhook_client.tls", "alerts.webhook_url", fc.Alerts.WebhookClient.TLS, string(fc.Alerts.WebhookURL))}
	if err := (limiter.Config{Prefix: fc.Redis.Prefix}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("redis.prefix: %w", err))
	}
	if _, _, err := net.SplitHostPort(fc.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", fc.Listen, err))
	}
	if _, _, err := net.SplitHostPort(fc.AdminListen); err != nil {
		errs = append(errs, fmt.Errorf("admin_listen %q: %w", fc.AdminListen, err))
	}
	if _, err := boot.ParseLevel(fc.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if err := fc.analyticsConfig().WithDefaults().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// tlsNeedsHTTPS refuses TLS settings for a URL that is not https: Go's
// transport ignores them for http://, so the alerts would go in plain
// text, credentials and all, while the file says TLS. The URL is not
// shown (a webhook's path may be its token).
func tlsNeedsHTTPS(section, urlField string, t boot.TLS, raw string) error {
	if !t.On() || raw == "" {
		return nil
	}
	if u, err := url.Parse(raw); err == nil && u.Scheme != "https" {
		return fmt.Errorf("%s is set but %s is %s://, which would not use it: make it https://", section, urlField, u.Scheme)
	}
	return nil
}

// validateServe adds what serve needs beyond the analyst commands.
func (fc fileConfig) validateServe() error {
	var errs []error
	if len(fc.Token) < analytics.MinTokenLen {
		errs = append(errs, fmt.Errorf("token (or EDGELIMIT_ANALYTICS_TOKEN) of at least %d characters is required to serve the API", analytics.MinTokenLen))
	}
	if !fc.DryRun && !fc.Redis.Set() {
		errs = append(errs, errors.New("redis.addr, redis.cluster_addrs or redis.sentinel_addrs (or EDGELIMIT_REDIS_ADDR / _CLUSTER_ADDRS / _SENTINEL_ADDRS) is required to write directives; set dry_run: true to run without"))
	}
	return errors.Join(errs...)
}

// analyticsConfig is the analytics package's part of the file.
func (fc fileConfig) analyticsConfig() analytics.Config {
	cfg := analytics.Config{Interval: fc.Interval, StaleAfter: fc.StaleAfter, Hot: fc.Hot, NAT: fc.NAT, Alerts: fc.Alerts.AlertConfig}
	cfg.Alerts.WebhookURL = string(fc.Alerts.WebhookURL)
	return cfg
}
