package boot

import (
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClickHouse is the link to ClickHouse over the native protocol (the HTTP
// protocol does not work with ClickHouse 18.16). TLS settings belong here
// (issue 16).
type ClickHouse struct {
	// Addr is the native-protocol address, host:port. Required.
	Addr string `yaml:"addr"`
	// Database default "default"; Username default "default".
	Database string `yaml:"database"`
	Username string `yaml:"username"`
	Password Secret `yaml:"password"`
	// Compression of the native protocol: lz4 (default) or none.
	Compression string `yaml:"compression"`
}

// ApplyEnv overrides c from EDGELIMIT_CLICKHOUSE_ADDR, _DATABASE, _USER
// and _PASSWORD (or _PASSWORD_FILE).
func (c *ClickHouse) ApplyEnv(e *Env) {
	e.String(&c.Addr, "EDGELIMIT_CLICKHOUSE_ADDR")
	e.String(&c.Database, "EDGELIMIT_CLICKHOUSE_DATABASE")
	e.String(&c.Username, "EDGELIMIT_CLICKHOUSE_USER")
	e.Secret(&c.Password, "EDGELIMIT_CLICKHOUSE_PASSWORD")
}

// WithDefaults returns c with its empty fields set to their defaults.
func (c ClickHouse) WithDefaults() ClickHouse {
	if c.Database == "" {
		c.Database = "default"
	}
	if c.Username == "" {
		c.Username = "default"
	}
	if c.Compression == "" {
		c.Compression = "lz4"
	}
	return c
}

// Validate joins every problem with c after defaults.
func (c ClickHouse) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("clickhouse.addr (or EDGELIMIT_CLICKHOUSE_ADDR) is required"))
	}
	if c.Compression != "lz4" && c.Compression != "none" {
		errs = append(errs, fmt.Errorf("clickhouse.compression %q: want lz4 or none", c.Compression))
	}
	return errors.Join(errs...)
}

// Options are the driver's options for c; readTimeout bounds one read (0:
// the driver's default). It is the one place every process's ClickHouse
// options are made.
func (c ClickHouse) Options(readTimeout time.Duration) *clickhouse.Options {
	c = c.WithDefaults()
	opts := &clickhouse.Options{
		Addr:     []string{c.Addr},
		Protocol: clickhouse.Native,
		Auth:     clickhouse.Auth{Database: c.Database, Username: c.Username, Password: string(c.Password)},
		// Fail fast at start and on reconnects rather than pile up behind
		// a dead server; callers retry.
		DialTimeout: 5 * time.Second,
		ReadTimeout: readTimeout,
	}
	if c.Compression == "lz4" {
		opts.Compression = &clickhouse.Compression{Method: clickhouse.CompressionLZ4}
	}
	return opts
}

// OpenClickHouse opens a connection pool for c (see Options).
func OpenClickHouse(c ClickHouse, readTimeout time.Duration) (driver.Conn, error) {
	conn, err := clickhouse.Open(c.Options(readTimeout))
	if err != nil {
		return nil, fmt.Errorf("open clickhouse %s: %w", c.Addr, err)
	}
	return conn, nil
}
