package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// BenchmarkSettle measures, one caller at a time on one server: two PINGs (two round
// trips), an Allow of a fixed window, a Reserve and Settle of it (5xx given back), and a
// lease taken and released (an InFlight rule), each as one sub-benchmark.
func BenchmarkSettle(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	l, err := lua.New(c, lua.WithPrefix("benchsettle"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		b.Fatal(err)
	}
	fixed := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "f", Limit: 1 << 30, Window: time.Minute}, Identity: "bench", Cost: 1}}
	lease := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1 << 20, Window: time.Minute}, Identity: "bench", Cost: 1}}
	tickets := make([]ratebudget.Ticket, 1)
	zero := []int64{0}
	b.Run("ping-x2", func(b *testing.B) {
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("allow", func(b *testing.B) {
		for b.Loop() {
			if d, err := l.Allow(ctx, fixed); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
	for _, bc := range []struct {
		name   string
		checks []ratebudget.Check
	}{{"reserve+settle", fixed}, {"lease+release", lease}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if d, err := l.Reserve(ctx, bc.checks, tickets, nil); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				if err := l.Settle(ctx, bc.checks, tickets, zero); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
