package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestRetryAfterOfAHeavierRequest: a worker spending a weighted cost per item is told,
// on a refusal, when that item could be admitted, also when the refusal cache holds a
// refusal of a lighter item of the same budget. Under a token bucket or a rolling
// window the wait grows with the cost: the lighter item's wait is too short, and a
// worker waiting it is refused again. Under a fixed window every cost waits for the
// window's end, which the cache repeats for a heavier item too.
//
// The limiter's answer, with its cache, is compared with Redis's own, asked afterwards
// without a cache: the earlier answer can only be the longer one (time passes between
// them, which a slow run makes longer still).
func TestRetryAfterOfAHeavierRequest(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := countCommands(c)
	prefix := uniquePrefix(t)
	cached, err := lua.New(c, lua.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	direct, err := lua.New(srv.Client(t), lua.WithPrefix(prefix), lua.WithRefusalCache(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
			r := ratebudget.Rule{Name: "items", Algorithm: alg, Limit: 10, Window: time.Minute}
			item := func(cost int64) []ratebudget.Check {
				return []ratebudget.Check{{Rule: r, Identity: "batch-7", Cost: cost}}
			}
			// Three items of 3, 50ms apart, so that a rolling window holds three events
			// that leave it one by one: the heavier item waits 100ms longer.
			for i := range 3 {
				if i > 0 {
					time.Sleep(50 * time.Millisecond) // spacing the events, not waiting for anything
				}
				if d, err := cached.Allow(ctx, item(3)); err != nil || !d.Allowed {
					t.Fatalf("item of 3: %+v, %v", d, err)
				}
			}
			light, err := cached.Allow(ctx, item(2))
			if err != nil || light.Allowed || light.RetryAfter <= 0 {
				t.Fatalf("item of 2 with 1 unit left: %+v, %v; want a refusal with a wait", light, err)
			}
			hook.take()
			heavy, err := cached.Allow(ctx, item(8))
			if err != nil || heavy.Allowed || heavy.RetryAfter <= 0 {
				t.Fatalf("item of 8 with 1 unit left: %+v, %v; want a refusal with a wait", heavy, err)
			}
			if got := hook.take(); alg == ratebudget.FixedWindow && got["evalsha"]+got["eval"] != 0 {
				t.Fatalf("fixed window: the item of 8 cost %v; want it refused by the cached refusal of the item of 2", got)
			}
			truth, err := direct.Allow(ctx, item(8))
			if err != nil || truth.Allowed {
				t.Fatalf("item of 8, asked without a cache: %+v, %v; want a refusal", truth, err)
			}
			if heavy.RetryAfter < truth.RetryAfter {
				t.Fatalf("item of 8 told to retry in %v (the item of 2's wait, %v), but Redis says %v", heavy.RetryAfter, light.RetryAfter, truth.RetryAfter)
			}
		})
	}
}
