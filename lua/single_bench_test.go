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
	"github.com/ratebudget/ratebudget/internal/timerule"
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
// a bare EVALSHA of "return 1", the decision's own script call made directly (EVALSHA
// of allow.lua with the decision's keys and arguments, on a budget of its own) and a
// decision, all on the same client, one after another, and reports the median of each
// (ping-p50-ns, evalsha-p50-ns, script-p50-ns, p50-ns) and the decision's median as a
// multiple of the others (x-ping, x-evalsha, x-script; 1 = as fast). x-script is the
// limiter's own cost in the client; script over evalsha is the script's on the server.
//
// For one fixed window it also times the floor of any fixed-window script: EVALSHA of a
// script that only makes the three commands a fixed window needs (GET, PTTL, INCRBY)
// and replies six integers, with the decision's key and arguments (floor-p50-ns,
// floor-x-evalsha: the floor over the bare EVALSHA).
func BenchmarkSingleCaller(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	one := redis.NewScript("return 1")
	if err := one.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	allow := redis.NewScript(lua.AllowSource)
	if err := allow.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	floor := redis.NewScript(`local v = redis.call('GET', KEYS[1])
local p = redis.call('PTTL', KEYS[1])
redis.call('INCRBY', KEYS[1], ARGV[6])
return {1, 0, 0, p, 0, 0}`)
	if err := floor.Load(ctx, c).Err(); err != nil {
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
				var keys []string
				args := []any{"1"}
				for i, r := range rs.rules {
					checks[i] = ratebudget.Check{Rule: r, Identity: "single-" + strconv.Itoa(seq), Cost: 1}
					keys = append(keys, "direct:"+checks[i].Rule.Name+":"+strconv.Itoa(seq))
					args = append(args, int64(r.Algorithm), r.Limit, r.Window.Milliseconds(), timerule.Capacity(&r), int64(1))
				}
				// Warm up: connections open, scripts loaded.
				for range 10 {
					if _, err := tr.l.Allow(ctx, checks); err != nil {
						b.Fatal(err)
					}
				}
				pings := make([]time.Duration, 0, b.N)
				evals := make([]time.Duration, 0, b.N)
				scripts := make([]time.Duration, 0, b.N)
				decs := make([]time.Duration, 0, b.N)
				floors := make([]time.Duration, 0, b.N)
				withFloor := rs.name == "fixed"
				floorKeys := []string{"floor:" + strconv.Itoa(seq)}
				b.ResetTimer()
				for range b.N {
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
					if err := allow.EvalSha(ctx, tr.base, keys, args...).Err(); err != nil {
						b.Fatal(err)
					}
					t3 := time.Now()
					if _, err := tr.l.Allow(ctx, checks); err != nil {
						b.Fatal(err)
					}
					t4 := time.Now()
					if withFloor {
						if err := floor.EvalSha(ctx, tr.base, floorKeys, args...).Err(); err != nil {
							b.Fatal(err)
						}
						floors = append(floors, time.Since(t4))
					}
					pings = append(pings, t1.Sub(t0))
					evals = append(evals, t2.Sub(t1))
					scripts = append(scripts, t3.Sub(t2))
					decs = append(decs, t4.Sub(t3))
				}
				p, e, s, d := median(pings), median(evals), median(scripts), median(decs)
				b.ReportMetric(float64(d), "p50-ns")
				b.ReportMetric(float64(e), "evalsha-p50-ns")
				b.ReportMetric(float64(s), "script-p50-ns")
				b.ReportMetric(float64(p), "ping-p50-ns")
				if e > 0 && p > 0 && s > 0 {
					b.ReportMetric(float64(d)/float64(e), "x-evalsha")
					b.ReportMetric(float64(d)/float64(p), "x-ping")
					b.ReportMetric(float64(d)/float64(s), "x-script")
				}
				if f := median(floors); withFloor && e > 0 {
					b.ReportMetric(float64(f), "floor-p50-ns")
					b.ReportMetric(float64(f)/float64(e), "floor-x-evalsha")
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
