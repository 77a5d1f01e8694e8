package limiter

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Warm readies the link for checks, so that none pays for it within its
// deadline: it loads the function library (Load), the first time it
// succeeds only, and opens conns connections to every master (Connect).
// Called again it only connects: loading compiles the library on every
// master, and a library a restart lost is loaded again by the first check
// that misses it.
func (r *Redis) Warm(ctx context.Context, conns int) error {
	if !r.loaded.Load() {
		if err := r.Load(ctx); err != nil {
			return err
		}
		r.loaded.Store(true)
	}
	return r.Connect(ctx, conns)
}

// Connect makes sure the client's pool holds at least conns connections
// to every master, each dialled, TLS-handshaken, authenticated and
// answering PING: it takes conns connections at once and pings each,
// which dials only those missing and costs a PING per connection
// otherwise. The pool's own count would not do: it counts connections
// MinIdleConns is still dialling, and ones not yet authenticated, which
// the first check to take them would pay for within its deadline. The
// connections stay idle in the pool for the checks that follow. A client
// of another kind than go-redis's (a test double) has no pool to fill.
func (r *Redis) Connect(ctx context.Context, conns int) error {
	fill := func(ctx context.Context, c *redis.Client) error {
		// Held until all have answered, so each is a connection of its
		// own; Close returns it to the pool.
		cns, errs := make([]*redis.Conn, conns), make([]error, conns)
		var wg sync.WaitGroup
		for i := range cns {
			cns[i] = c.Conn()
			wg.Go(func() { errs[i] = cns[i].Ping(ctx).Err() })
		}
		wg.Wait()
		for _, cn := range cns {
			_ = cn.Close()
		}
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("connect to %s: %w", c.Options().Addr, err)
			}
		}
		return nil
	}
	switch c := r.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fill)
	case *redis.Client:
		return fill(ctx, c)
	}
	return nil
}
