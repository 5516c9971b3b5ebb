package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

// newRedisClient applies the client settings recommended for a limiter: no retries (a
// re-sent script may spend twice), socket deadlines that follow the decision's context,
// and short timeouts, so that a failing Redis costs a request at most the decision
// deadline.
func newRedisClient(url string, timeout time.Duration) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", err)
	}
	opt.MaxRetries = -1
	opt.DialerRetries = 1 // a refused connection fails at once, as a definite error
	opt.ContextTimeoutEnabled = true
	opt.DialTimeout = max(timeout, 100*time.Millisecond)
	opt.ReadTimeout = max(timeout, 100*time.Millisecond)
	opt.WriteTimeout = opt.ReadTimeout
	opt.PoolTimeout = opt.ReadTimeout
	return redis.NewClient(opt), nil
}

// keySecretEnv names the environment variable holding the secret that keys the
// budget keys' digests (lua.WithKeySecret); every replica must be given the same one.
const keySecretEnv = "RATEBUDGET_KEY_SECRET"

func newRedisLimiter(ctx context.Context, o options, log *slog.Logger) (ratebudget.Limiter, func(), error) {
	client, err := newRedisClient(o.redisURL, o.storeTimeout)
	if err != nil {
		return nil, nil, err
	}
	opts := []lua.Option{lua.WithPrefix("rb-demo")}
	if secret := os.Getenv(keySecretEnv); secret != "" {
		opts = append(opts, lua.WithKeySecret([]byte(secret)))
	}
	if o.oneServer {
		opts = append(opts, lua.WithOneServer())
	}
	if o.coalesce > 0 {
		opts = append(opts, lua.WithCoalescing(o.coalesce))
	}
	lim, err := lua.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	if !lim.Keyed() {
		log.Warn("budget keys are not keyed by a secret: anyone can compute which Redis Cluster slot an identity lands in; set " + keySecretEnv + " (16 to 1024 bytes, the same on every replica)")
	}
	// Load the scripts and open connections now, so that the first decisions do not
	// pay for it within their deadline. Starting without Redis is allowed: the failure
	// policy applies until it answers.
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := lim.Load(lctx); err != nil {
		log.Warn("redis not ready at startup; the store-error policy applies until it is", "policy", o.storeError.String(), "err", err)
	}
	return lim, func() { client.Close() }, nil
}
