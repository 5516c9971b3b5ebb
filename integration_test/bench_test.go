package integration_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// BenchmarkRedis compares one decision with a bare PING on the same client and
// connection pool, with about 64 concurrent callers: a decision is one round trip, so
// its throughput should stay close to PING's (the goal is at least 0.85×).
func BenchmarkRedis(b *testing.B) {
	const callers = 64
	c := newClient(b, callers)
	l := newLimiter(b, c)
	ctx := context.Background()
	parallelism := (callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)

	b.Run("ping", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(parallelism)
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
	bench := func(name string, rules ...ratebudget.Rule) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				id := "client-" + strconv.FormatInt(seq.Add(1), 10) // one budget per caller
				checks := make([]ratebudget.Check, len(rules))
				for i, r := range rules {
					checks[i] = ratebudget.Check{Rule: r, Identity: id, Cost: 1}
				}
				for pb.Next() {
					if _, err := l.Allow(ctx, checks); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	fixed := ratebudget.Rule{Name: "f", Algorithm: ratebudget.FixedWindow, Limit: 1 << 30, Window: time.Minute}
	token := ratebudget.Rule{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 1 << 30, Window: time.Minute}
	rolling := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 1 << 30, Window: time.Minute}
	bench("fixed", fixed)
	bench("token", token)
	bench("rolling", rolling)
	bench("three-rules", fixed, token, rolling)
}
