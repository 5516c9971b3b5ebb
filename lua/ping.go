package lua

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Ping asks the server whether it answers (PING), without deciding anything. For a
// *redis.Client it dials a connection of its own, with the client's options, and closes
// it after the reply: the client's pool is not used, so failed dials while the server
// is down do not count toward the pool's own dial circuit (after PoolSize failed dials
// go-redis fails every new connection for up to a second). For a *redis.ClusterClient
// it pings every primary through the client; for an *redis.AutoPipeliner, through it.
// The middleware's circuit breaker calls it to probe an open breaker off the request
// path. It returns nil on PONG, else a *[ratebudget.StoreError] (an error reply, such
// as LOADING or NOAUTH, included). It is safe for concurrent use.
func (l *Limiter) Ping(ctx context.Context) error {
	c := l.core
	var err error
	switch cl := c.direct.(type) {
	case nil:
		err = c.submit(ctx, c.pipe, redis.NewStatusCmd(ctx, "ping"))
	case *redis.Client:
		o := *cl.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 0, 0
		o.MaxRetries, o.DialerRetries, o.ContextTimeoutEnabled = -1, 1, true
		own := redis.NewClient(&o)
		err = own.Ping(ctx).Err()
		own.Close()
	case *redis.ClusterClient:
		err = cl.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
	case interface {
		Ping(context.Context) *redis.StatusCmd
	}:
		err = cl.Ping(ctx).Err()
	default:
		_, err = cl.Eval(ctx, "return 1", nil).Result()
	}
	if err != nil {
		return classify(err)
	}
	return nil
}
