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

// BenchmarkSettle measures, one caller at a time on one server: two PINGs (two round
// trips), an Allow of a fixed window, a Reserve and Settle of it (5xx given back), the
// same settled above its reservation (the extra charged), a lease taken and released (an
// InFlight rule), and two settles that mix a give-back or a release with an extra in one
// slot group: a fixed window given back next to a token bucket charged above its
// reservation, and a lease released next to a fixed window of bytes charged above its
// estimate. Each is one sub-benchmark, and reports its script calls per operation
// (calls/op): round trips, whatever the machine's noise.
func BenchmarkSettle(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	calls := &scriptCalls{}
	c.AddHook(calls)
	l, err := lua.New(c, lua.WithPrefix("benchsettle"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		b.Fatal(err)
	}
	// Limits far above what a run spends, so that every reservation is admitted and the
	// extras never reach the debt bound.
	fixedRule := ratebudget.Rule{Name: "f", Limit: 1 << 30, Window: time.Minute}
	fixed := []ratebudget.Check{{Rule: fixedRule, Identity: "bench", Cost: 1}}
	lease := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1 << 20, Window: time.Minute}, Identity: "bench", Cost: 1}}
	mixed := []ratebudget.Check{
		{Rule: fixedRule, Identity: "bench-mixed", Cost: 2},
		{Rule: ratebudget.Rule{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 1 << 30, Window: time.Second}, Identity: "bench-mixed", Cost: 1},
	}
	leaseBytes := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1 << 20, Window: time.Minute}, Identity: "bench-bytes", Cost: 1},
		{Rule: ratebudget.Rule{Name: "bytes", Limit: 1 << 40, Window: time.Second}, Identity: "bench-bytes", Cost: 1},
	}
	tickets := make([]ratebudget.Ticket, 2)
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
		costs  []int64
	}{
		{"reserve+settle", fixed, []int64{0}},
		{"reserve+settle-extra", fixed, []int64{3}},
		{"lease+release", lease, []int64{0}},
		{"reserve+settle-mixed", mixed, []int64{0, 3}},
		{"lease+release+extra", leaseBytes, []int64{1, 4096}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			before := calls.n.Load()
			for b.Loop() {
				if d, err := l.Reserve(ctx, bc.checks, tickets, nil); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				if err := l.Settle(ctx, bc.checks, tickets, bc.costs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(calls.n.Load()-before)/float64(b.N), "calls/op")
		})
	}
}

// BenchmarkSettleParallel measures a Reserve and its Settle with benchCallers concurrent
// callers on one client, each on a budget of its own: a fixed window given back in full
// (a 5xx under a contract that counts successes), and a lease taken and released. It
// reports the server's time per reservation and settle (redis-us/op, INFO commandstats)
// next to ns/op, which is wall time per pair over all callers.
func BenchmarkSettleParallel(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: benchCallers, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	l, err := lua.New(c, lua.WithPrefix("benchsettlepar"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		b.Fatal(err)
	}
	par := (benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)
	var seq atomic.Int64
	for _, bc := range []struct {
		name string
		rule ratebudget.Rule
	}{
		{"reserve+settle", ratebudget.Rule{Name: "f", Limit: 1 << 30, Window: time.Minute}},
		{"lease+release", ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1 << 20, Window: time.Minute}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			before := commandStats(b, c)
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				checks := []ratebudget.Check{{Rule: bc.rule, Identity: "caller-" + strconv.FormatInt(seq.Add(1), 10), Cost: 1}}
				tickets := make([]ratebudget.Ticket, 1)
				for pb.Next() {
					if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
						b.Error(d, err)
						return
					}
					if err := l.Settle(ctx, checks, tickets, []int64{0}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			after := commandStats(b, c).sub(before)
			b.ReportMetric((after.usec["evalsha"]+after.usec["eval"])/float64(b.N), "redis-us/op")
		})
	}
}
