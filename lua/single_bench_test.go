package lua_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// singleCallerTransports are the clients BenchmarkSingleCaller decides through.
func singleCallerTransports(b *testing.B, c *redis.Client) []struct {
	name string
	l    ratebudget.Limiter
	base redis.Scripter // PING and EVALSHA go through this
} {
	l, err := lua.New(c, lua.WithPrefix("bench1"))
	if err != nil {
		b.Fatal(err)
	}
	demo, err := lua.New(c, lua.WithPrefix("bench1"), lua.WithOneServer(), lua.WithCoalescing(256))
	if err != nil {
		b.Fatal(err)
	}
	return []struct {
		name string
		l    ratebudget.Limiter
		base redis.Scripter
	}{{"client", l, c}, {"demo", demo, c}}
}

// BenchmarkSingleCaller measures a decision with nothing else in flight: one caller,
// one decision at a time, each on a budget that admits it. Every iteration times a PING,
// a bare EVALSHA of "return 1" and a decision on the same client, one after another, and
// reports the median of each (p50-ns, ping-p50-ns, evalsha-p50-ns) and the decision's
// median as a multiple of the other two (x-evalsha, x-ping; 1 = as fast).
func BenchmarkSingleCaller(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	one := redis.NewScript("return 1")
	if err := one.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	rule := func(name string, alg ratebudget.Algorithm) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: 1 << 30, Window: time.Minute}
	}
	fixed := rule("f", ratebudget.FixedWindow)
	token := rule("t", ratebudget.TokenBucket)
	rolling := rule("r", ratebudget.RollingWindow)
	ruleSets := []struct {
		name  string
		rules []ratebudget.Rule
	}{
		{"fixed", []ratebudget.Rule{fixed}},
		{"token", []ratebudget.Rule{token}},
		{"rolling", []ratebudget.Rule{rolling}},
		{"3fixed", []ratebudget.Rule{fixed, rule("f2", ratebudget.FixedWindow), rule("f3", ratebudget.FixedWindow)}},
		{"3mixed", []ratebudget.Rule{fixed, token, rolling}},
	}
	seq := 0
	for _, tr := range singleCallerTransports(b, c) {
		for _, rs := range ruleSets {
			b.Run(tr.name+"/"+rs.name, func(b *testing.B) {
				b.ReportAllocs()
				seq++
				checks := make([]ratebudget.Check, len(rs.rules))
				for i, r := range rs.rules {
					checks[i] = ratebudget.Check{Rule: r, Identity: "single-" + strconv.Itoa(seq), Cost: 1}
				}
				// Warm up: connections open, scripts loaded.
				for range 10 {
					if _, err := tr.l.Allow(ctx, checks); err != nil {
						b.Fatal(err)
					}
				}
				pings := make([]time.Duration, 0, b.N)
				evals := make([]time.Duration, 0, b.N)
				decs := make([]time.Duration, 0, b.N)
				var dec time.Duration
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					t0 := time.Now()
					if err := tr.base.(interface {
						Ping(context.Context) *redis.StatusCmd
					}).Ping(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					if err := one.EvalSha(ctx, tr.base, nil).Err(); err != nil {
						b.Fatal(err)
					}
					t2 := time.Now()
					b.StartTimer()
					if _, err := tr.l.Allow(ctx, checks); err != nil {
						b.Fatal(err)
					}
					t3 := time.Now()
					pings = append(pings, t1.Sub(t0))
					evals = append(evals, t2.Sub(t1))
					decs = append(decs, t3.Sub(t2))
					dec += t3.Sub(t2)
				}
				b.StopTimer()
				p, e, d := median(pings), median(evals), median(decs)
				b.ReportMetric(float64(d), "p50-ns")
				b.ReportMetric(float64(e), "evalsha-p50-ns")
				b.ReportMetric(float64(p), "ping-p50-ns")
				if e > 0 && p > 0 {
					b.ReportMetric(float64(d)/float64(e), "x-evalsha")
					b.ReportMetric(float64(d)/float64(p), "x-ping")
				}
			})
		}
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
