package lua_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

// Construct a Redis limiter from a URL with the recommended client options, and decide
// one request against two rules of one client (one script call).
func Example() {
	opts, err := redis.ParseURL("redis://localhost:6379/0")
	if err != nil {
		log.Fatal(err)
	}
	opts.MaxRetries = -1              // never re-send a script whose reply was lost
	opts.ContextTimeoutEnabled = true // the caller's deadline bounds socket reads
	opts.DialerRetries = 1            // a refused connection fails at once
	opts.DialTimeout = 200 * time.Millisecond
	opts.ReadTimeout = 100 * time.Millisecond
	opts.WriteTimeout = 100 * time.Millisecond
	opts.PoolTimeout = 100 * time.Millisecond
	client := redis.NewClient(opts)
	defer client.Close()

	// The secret must be 16 to 1024 bytes, the same on every replica: New refuses an
	// empty one, so set RATEBUDGET_KEY_SECRET (or leave WithKeySecret out, and warn).
	limiter, err := lua.New(client, lua.WithPrefix("rb"), lua.WithKeySecret([]byte(os.Getenv("RATEBUDGET_KEY_SECRET"))))
	if err != nil {
		log.Fatal(err)
	}
	// Load the scripts and open connections before serving.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := limiter.Load(ctx); err != nil {
		log.Printf("budget store not ready: %v", err)
	}
	perSecond := ratebudget.Rule{Name: "burst", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Second}
	perHour := ratebudget.Rule{Name: "hourly", Algorithm: ratebudget.RollingWindow, Limit: 1000, Window: time.Hour}
	// Bound each decision by a deadline: Allow returns by it.
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	d, err := limiter.Allow(dctx, []ratebudget.Check{
		{Rule: perSecond, Identity: "203.0.113.7", Cost: 1},
		{Rule: perHour, Identity: "203.0.113.7", Cost: 1},
	})
	switch {
	case err != nil:
		log.Printf("budget store unavailable: %v", err) // apply the failure policy
	case !d.Allowed:
		fmt.Println(http.StatusTooManyRequests, d.Rule, d.RetryAfter)
	}
}

// Decide concurrent requests for one budget in groups: while a decision for a budget is
// in flight, the requests that arrive for it wait and then go to Redis as one call.
func ExampleWithCoalescing() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: 200 * time.Millisecond})
	defer client.Close()
	limiter, err := lua.New(client, lua.WithCoalescing(256))
	if err != nil {
		log.Fatal(err)
	}

	// Every caller of a service-wide rule (no identity) spends the same budget: a hot key.
	rule := ratebudget.Rule{Name: "service", Limit: 50_000, Window: time.Second}
	d, err := limiter.Allow(context.Background(), []ratebudget.Check{{Rule: rule, Cost: 1}})
	if err == nil && !d.Allowed {
		fmt.Println(http.StatusTooManyRequests, d.RetryAfter)
	}
}

// On one Redis server, decide a per-client rule and a service-wide rule, whose keys are
// in different hash slots, in one script call: all-or-nothing, with no refunds.
func ExampleWithOneServer() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: 200 * time.Millisecond})
	defer client.Close()
	limiter, err := lua.New(client, lua.WithOneServer())
	if err != nil {
		log.Fatal(err)
	}
	perClient := ratebudget.Rule{Name: "client", Limit: 100, Window: time.Minute}
	service := ratebudget.Rule{Name: "service", Limit: 10_000, Window: time.Minute}
	d, err := limiter.Allow(context.Background(), []ratebudget.Check{
		{Rule: perClient, Identity: "203.0.113.7", Cost: 1},
		{Rule: service, Cost: 1},
	})
	if err == nil && !d.Allowed {
		fmt.Println(http.StatusTooManyRequests, d.Rule, d.RetryAfter)
	}
}
