package boot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Redis is the link to a Redis: standalone (Addr), Redis Cluster
// (ClusterAddrs) or a master found through Sentinel (SentinelAddrs +
// SentinelMaster). None set: no Redis. Embed it inline in a process's
// redis section. TLS and ACL settings belong here (issue 16).
type Redis struct {
	// Addr is a standalone Redis, host:port.
	Addr string `yaml:"addr"`
	// ClusterAddrs are Redis Cluster seed nodes.
	ClusterAddrs []string `yaml:"cluster_addrs"`
	// SentinelAddrs find the master named SentinelMaster through Redis
	// Sentinel, following failovers.
	SentinelAddrs  []string `yaml:"sentinel_addrs"`
	SentinelMaster string   `yaml:"sentinel_master"`
	// Username is the ACL user (Redis 6+); empty: the default user, with
	// Password alone (requirepass).
	Username string `yaml:"username"`
	Password Secret `yaml:"password"`
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves, when they require it (sentinel sentinel-user/-pass).
	SentinelUsername string `yaml:"sentinel_username"`
	SentinelPassword Secret `yaml:"sentinel_password"`
	// TLS secures the connections to every node (and Sentinel).
	TLS TLS `yaml:"tls"`
	// DB is the database of a standalone or Sentinel Redis; default 0.
	DB int `yaml:"db"`
}

// RedisTuning is how a process uses its Redis: each says why in its own
// code.
type RedisTuning struct {
	// Timeout bounds dialling, reads and writes.
	Timeout time.Duration
	// MaxRetries is go-redis's: 0 its default (3), -1 none.
	MaxRetries int
	// MinIdleConns keeps connections warm for the first requests.
	MinIdleConns int
	// PoolSize caps the connections per node; 0: go-redis's default.
	PoolSize int
	// OnePool runs pipelines on the main pool. go-redis otherwise gives
	// them a pool of their own that it never dials ahead (MinIdleConns does
	// not apply to it), so a pipeline's first use of each connection dials
	// it, TLS and AUTH included, within the caller's deadline.
	OnePool bool
	// ContextTimeout makes a call's context deadline bound the socket too.
	ContextTimeout bool
}

// Set reports whether any Redis is configured.
func (r Redis) Set() bool {
	return r.Addr != "" || len(r.ClusterAddrs) > 0 || len(r.SentinelAddrs) > 0
}

// ApplyEnv overrides r from EDGELIMIT_REDIS_ADDR, _CLUSTER_ADDRS,
// _SENTINEL_ADDRS (one of the three, replacing the file's kind),
// _SENTINEL_MASTER, _USERNAME, _PASSWORD (or _PASSWORD_FILE), _DB,
// _SENTINEL_USERNAME, _SENTINEL_PASSWORD (or _FILE) and the TLS settings
// EDGELIMIT_REDIS_TLS, _TLS_CA_FILE, _TLS_CERT_FILE, _TLS_KEY_FILE,
// _TLS_SERVER_NAME and _TLS_MIN_VERSION.
func (r *Redis) ApplyEnv(e *Env) {
	addr, cluster, sentinel := e.Lookup("EDGELIMIT_REDIS_ADDR"), e.Lookup("EDGELIMIT_REDIS_CLUSTER_ADDRS"), e.Lookup("EDGELIMIT_REDIS_SENTINEL_ADDRS")
	n := 0
	for _, v := range []string{addr, cluster, sentinel} {
		if v != "" {
			n++
		}
	}
	switch {
	case n > 1:
		e.Fail(errors.New("set one of EDGELIMIT_REDIS_ADDR, EDGELIMIT_REDIS_CLUSTER_ADDRS or EDGELIMIT_REDIS_SENTINEL_ADDRS (not both, not all three)"))
	case addr != "":
		r.Addr, r.ClusterAddrs, r.SentinelAddrs = addr, nil, nil
	case cluster != "":
		r.Addr, r.ClusterAddrs, r.SentinelAddrs = "", SplitList(cluster), nil
	case sentinel != "":
		r.Addr, r.ClusterAddrs, r.SentinelAddrs = "", nil, SplitList(sentinel)
	}
	e.String(&r.SentinelMaster, "EDGELIMIT_REDIS_SENTINEL_MASTER")
	e.String(&r.Username, "EDGELIMIT_REDIS_USERNAME")
	e.Secret(&r.Password, "EDGELIMIT_REDIS_PASSWORD")
	e.Int(&r.DB, "EDGELIMIT_REDIS_DB")
	e.String(&r.SentinelUsername, "EDGELIMIT_REDIS_SENTINEL_USERNAME")
	e.Secret(&r.SentinelPassword, "EDGELIMIT_REDIS_SENTINEL_PASSWORD")
	r.TLS.applyEnv(e, "EDGELIMIT_REDIS")
}

// Validate joins every problem with r.
func (r Redis) Validate() error {
	var errs []error
	n := 0
	for _, set := range []bool{r.Addr != "", len(r.ClusterAddrs) > 0, len(r.SentinelAddrs) > 0} {
		if set {
			n++
		}
	}
	if n > 1 {
		errs = append(errs, errors.New("redis: set one of addr, cluster_addrs or sentinel_addrs"))
	}
	// A redis:// URL or user:password@host would be logged whole by every
	// failed dial (and printed by -check); credentials go in their own
	// settings.
	if r.Addr != "" {
		errs = append(errs, CheckAddress("redis.addr", r.Addr))
	}
	for i, a := range r.ClusterAddrs {
		errs = append(errs, CheckAddress(fmt.Sprintf("redis.cluster_addrs[%d]", i), a))
	}
	for i, a := range r.SentinelAddrs {
		errs = append(errs, CheckAddress(fmt.Sprintf("redis.sentinel_addrs[%d]", i), a))
	}
	if (len(r.SentinelAddrs) > 0) != (r.SentinelMaster != "") {
		errs = append(errs, errors.New("redis: sentinel_addrs and sentinel_master go together"))
	}
	if len(r.ClusterAddrs) > 0 && r.DB != 0 {
		errs = append(errs, fmt.Errorf("redis.db: %d, but Redis Cluster has only database 0", r.DB))
	}
	if r.DB < 0 {
		errs = append(errs, fmt.Errorf("redis.db: %d is negative", r.DB))
	}
	if r.Username != "" && r.Password == "" {
		errs = append(errs, errors.New("redis.username is set but redis.password (or EDGELIMIT_REDIS_PASSWORD) is not"))
	}
	if (r.SentinelUsername != "" || r.SentinelPassword != "") && len(r.SentinelAddrs) == 0 {
		errs = append(errs, errors.New("redis.sentinel_username/sentinel_password are set but no sentinel_addrs"))
	}
	if r.Set() {
		errs = append(errs, r.TLS.validate("redis.tls"))
	}
	return errors.Join(errs...)
}

// Target names the Redis for log lines (never the password).
func (r Redis) Target() string {
	switch {
	case len(r.SentinelAddrs) > 0:
		return "sentinel " + r.SentinelMaster + " " + strings.Join(r.SentinelAddrs, ",")
	case len(r.ClusterAddrs) > 0:
		return "cluster " + strings.Join(r.ClusterAddrs, ",")
	}
	return r.Addr
}

// link names the Redis in errors: "redis (127.0.0.1:6379)", with ", tls"
// when it is on, so a message says which way it was reached.
func (r Redis) link() string {
	t := r.Target()
	if r.TLS.On() {
		t += ", tls"
	}
	return "redis (" + t + ")"
}

// NewRedis returns a client for r, of the kind r configures; the caller
// closes it. It is the one place every process's Redis options are made,
// TLS and ACLs included. go-redis's own log lines (one per failed dial) go
// to log at debug level: the callers' breakers and retries say it once.
// It does not connect: PingRedis checks the link.
func NewRedis(r Redis, t RedisTuning, log *slog.Logger) (redis.UniversalClient, error) {
	tc, err := r.TLS.Config()
	if err != nil {
		return nil, fmt.Errorf("redis.tls: %w", err)
	}
	redis.SetLogger(redisLogger{log})
	o := &redis.UniversalOptions{
		Username:              r.Username,
		Password:              string(r.Password),
		SentinelUsername:      r.SentinelUsername,
		SentinelPassword:      string(r.SentinelPassword),
		TLSConfig:             tc,
		DB:                    r.DB,
		MasterName:            r.SentinelMaster,
		MaxRetries:            t.MaxRetries,
		DialTimeout:           t.Timeout,
		ReadTimeout:           t.Timeout,
		WriteTimeout:          t.Timeout,
		MinIdleConns:          t.MinIdleConns,
		PoolSize:              t.PoolSize,
		ContextTimeoutEnabled: t.ContextTimeout,
	}
	if t.OnePool {
		o.PipelinePoolSize = -1
	}
	// The kind is chosen here, not by redis.NewUniversalClient's guess from
	// the number of addresses: one cluster seed is still a cluster.
	switch {
	case len(r.SentinelAddrs) > 0:
		o.Addrs = r.SentinelAddrs
		return redis.NewFailoverClient(o.Failover()), nil
	case len(r.ClusterAddrs) > 0:
		o.Addrs = r.ClusterAddrs
		co := o.Cluster()
		// go-redis reloads the slot map on MOVED or on this interval
		// (default 60s), not on a dead node's dial errors: after a master
		// dies, its slots stay pointed at it until the reload. One CLUSTER
		// SLOTS a second per client is cheap and follows a failover in
		// seconds (TestClusterFailover).
		co.ClusterStateReloadInterval = time.Second
		return redis.NewClusterClient(co), nil
	}
	o.Addrs = []string{r.Addr}
	return redis.NewClient(o.Simple()), nil
}

// PingRedis checks rdb, made by NewRedis from r, within CheckTimeout: a
// LinkError naming the Redis and the cause (see Fatal), or nil. Through
// Sentinel it asks the Sentinels for the master and pings the master; in a
// cluster it loads the slots from a seed and pings a node.
func PingRedis(ctx context.Context, rdb redis.UniversalClient, r Redis) error {
	ctx, cancel := checkContext(ctx)
	defer cancel()
	err := rdb.Ping(ctx).Err()
	// go-redis reports every Sentinel failure, a refused password
	// included, as "all sentinels ... are unreachable: <last error>": say
	// that it was the Sentinels, and what they said.
	const allSentinels = "redis: all sentinels specified in configuration are unreachable: "
	if err != nil && strings.HasPrefix(err.Error(), allSentinels) {
		err = prefixed{"sentinel: " + strings.TrimPrefix(err.Error(), allSentinels), err}
	}
	return linkError(r.link(), err, isRedisAuth)
}

// prefixed is err with another text, still unwrapping to it.
type prefixed struct {
	text string
	err  error
}

func (p prefixed) Error() string { return p.text }
func (p prefixed) Unwrap() error { return p.err }

// isRedisAuth: Redis refused the credentials, or wants some.
func isRedisAuth(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	s := re.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password", "ERR Client sent AUTH"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// redisLogger sends go-redis's internal messages to slog at debug level.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// RegisterRedisPool exposes rdb's connection pool on reg, read at each
// scrape: a miss is a call that found no idle connection and dialled one
// (TLS and AUTH included) within its own deadline, so on a ready gateway
// misses should not move while its load holds steady.
func RegisterRedisPool(reg prometheus.Registerer, rdb redis.UniversalClient) error {
	// A pipeline pool of its own (RedisTuning.OnePool off) counts apart.
	stat := func(f func(*redis.PoolStats) uint32) func() float64 {
		return func() float64 {
			s := rdb.PoolStats()
			n := f(s)
			if s.PipelineStats != nil {
				n += f((*redis.PoolStats)(s.PipelineStats))
			}
			return float64(n)
		}
	}
	return errors.Join(
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "edgelimit_redis_pool_hits_total",
			Help: "Redis calls that found an idle connection in the pool."}, stat(func(s *redis.PoolStats) uint32 { return s.Hits }))),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "edgelimit_redis_pool_misses_total",
			Help: "Redis calls that found no idle connection and dialled one."}, stat(func(s *redis.PoolStats) uint32 { return s.Misses }))),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "edgelimit_redis_pool_timeouts_total",
			Help: "Redis calls that waited for a connection past the pool timeout."}, stat(func(s *redis.PoolStats) uint32 { return s.Timeouts }))),
		reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgelimit_redis_pool_connections",
			Help: "Connections open to Redis (every node)."}, stat(func(s *redis.PoolStats) uint32 { return s.TotalConns }))),
		reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgelimit_redis_pool_idle_connections",
			Help: "Idle connections in the pool (every node)."}, stat(func(s *redis.PoolStats) uint32 { return s.IdleConns }))),
	)
}
