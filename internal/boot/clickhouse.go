package boot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClickHouse is the link to ClickHouse over the native protocol (the HTTP
// protocol does not work with ClickHouse 18.16), over TLS when TLS is on:
// then Addr is the server's tcp_port_secure (9440 by convention).
type ClickHouse struct {
	// Addr is the native-protocol address, host:port. Required.
	Addr string `yaml:"addr"`
	// Database default "default"; Username default "default".
	Database string `yaml:"database"`
	Username string `yaml:"username"`
	Password Secret `yaml:"password"`
	// Compression of the native protocol: lz4 (default) or none.
	Compression string `yaml:"compression"`
	// TLS secures the native protocol (the server's tcp_port_secure).
	TLS TLS `yaml:"tls"`
}

// ApplyEnv overrides c from EDGELIMIT_CLICKHOUSE_ADDR, _DATABASE, _USER,
// _PASSWORD (or _PASSWORD_FILE) and the TLS settings
// EDGELIMIT_CLICKHOUSE_TLS, _TLS_CA_FILE, _TLS_CERT_FILE, _TLS_KEY_FILE,
// _TLS_SERVER_NAME and _TLS_MIN_VERSION.
func (c *ClickHouse) ApplyEnv(e *Env) {
	e.String(&c.Addr, "EDGELIMIT_CLICKHOUSE_ADDR")
	e.String(&c.Database, "EDGELIMIT_CLICKHOUSE_DATABASE")
	e.String(&c.Username, "EDGELIMIT_CLICKHOUSE_USER")
	e.Secret(&c.Password, "EDGELIMIT_CLICKHOUSE_PASSWORD")
	c.TLS.applyEnv(e, "EDGELIMIT_CLICKHOUSE")
}

// WithDefaults returns c with its empty fields set to their defaults.
func (c ClickHouse) WithDefaults() ClickHouse {
	c.Database = cmp.Or(c.Database, "default")
	c.Username = cmp.Or(c.Username, "default")
	c.Compression = cmp.Or(c.Compression, "lz4")
	return c
}

// ErrAddress is an address that is not a plain host:port: a URL, a path,
// or credentials (user:password@host) that belong in their own settings.
var ErrAddress = errors.New("not a host:port (credentials belong in their own settings, never in an address)")

// CheckAddress returns ErrAddress naming what, without repeating addr: an
// address may hold a password, which -check would print and every failed
// dial would log.
func CheckAddress(what, addr string) error {
	if strings.ContainsAny(addr, "@/?# ") {
		return fmt.Errorf("%s: %w", what, ErrAddress)
	}
	return nil
}

// Validate joins every problem with c after defaults.
func (c ClickHouse) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("clickhouse.addr (or EDGELIMIT_CLICKHOUSE_ADDR) is required"))
	} else {
		errs = append(errs, CheckAddress("clickhouse.addr", c.Addr))
	}
	if c.Compression != "lz4" && c.Compression != "none" {
		errs = append(errs, fmt.Errorf("clickhouse.compression %q: want lz4 or none", c.Compression))
	}
	errs = append(errs, c.TLS.validate("clickhouse.tls"))
	return errors.Join(errs...)
}

// Options are the driver's options for c; readTimeout bounds one read (0:
// the driver's default). It is the one place every process's ClickHouse
// options are made.
func (c ClickHouse) Options(readTimeout time.Duration) (*clickhouse.Options, error) {
	c = c.WithDefaults()
	tc, err := c.TLS.Config()
	if err != nil {
		return nil, fmt.Errorf("clickhouse.tls: %w", err)
	}
	opts := &clickhouse.Options{
		TLS:      tc,
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
	return opts, nil
}

// OpenClickHouse opens a connection pool for c (see Options). It does not
// connect: PingClickHouse checks the link.
func OpenClickHouse(c ClickHouse, readTimeout time.Duration) (driver.Conn, error) {
	opts, err := c.Options(readTimeout)
	if err != nil {
		return nil, err
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse %s: %w", c.Addr, err)
	}
	return conn, nil
}

// PingClickHouse checks conn, opened by OpenClickHouse from c, within
// CheckTimeout: a LinkError naming the server and the cause (see Fatal),
// or nil. The native handshake carries the credentials, so a ping proves
// them.
func PingClickHouse(ctx context.Context, conn driver.Conn, c ClickHouse) error {
	ctx, cancel := checkContext(ctx)
	defer cancel()
	link := "clickhouse (" + c.Addr
	if c.TLS.On() {
		link += ", tls"
	}
	return linkError(link+")", conn.Ping(ctx), isClickHouseAuth)
}

// isClickHouseAuth: the server's exception codes for an unknown user, a
// wrong or missing password (18.16) and AUTHENTICATION_FAILED (current).
func isClickHouseAuth(err error) bool {
	var ex *clickhouse.Exception
	if !errors.As(err, &ex) {
		return false
	}
	switch ex.Code {
	case 192, 193, 194, 516:
		return true
	}
	return false
}
