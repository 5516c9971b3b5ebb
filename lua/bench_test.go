package lua_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// BenchmarkProcess compares a decision with a bare PING on one client, against a private
// redis-server process (no container network in between), with about 64 callers.
func BenchmarkProcess(b *testing.B) {
	const callers = 64
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: callers, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	l, err := lua.New(c, lua.WithPrefix("bench"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	par := (callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)
	b.Run("ping", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(par)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := c.Ping(ctx).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	var seq atomic.Int64
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		r := ratebudget.Rule{Name: "b", Algorithm: alg, Limit: 1 << 30, Window: time.Minute}
		b.Run(alg.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				checks := []ratebudget.Check{{Rule: r, Identity: strconv.FormatInt(seq.Add(1), 10), Cost: 1}}
				for pb.Next() {
					if _, err := l.Allow(ctx, checks); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
