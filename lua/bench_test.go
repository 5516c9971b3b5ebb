package lua_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/cputime"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// benchCallers is the number of concurrent callers of the Redis benchmarks.
const benchCallers = 64

// BenchmarkProcess compares a decision with a bare PING on one client, against a private
// redis-server process (no container network in between), with 64 concurrent callers.
//
// Each sub-benchmark first times as many PINGs as it will make decisions, with the same
// 64 callers on the same client, then times the decisions, and reports:
//   - x-ping: decision throughput as a fraction of PING throughput (1 = as fast as PING);
//   - redis-us/op: server time per decision (INFO commandstats, EVALSHA and EVAL), next
//     to ping-redis-us, the server time per PING.
//
// The refusal cache is on (the default); no decision is refused, so each is a script call.
// Each time rule runs twice: through the *redis.Client (the default: a decision sent at
// once when nothing else is in flight, else pipelined through the client's
// AutoPipeliner), and through the client's pool alone, without pipelining ("pool/": the
// client hidden behind a wrapper type, as any other redis.Scripter is). Each caller has
// a budget of its own, except in the "hot" cases, where all 64 share one: without and
// with lua.WithCoalescing ("coalesced/"), which also runs on per-caller budgets, where
// it has nothing to group.
func BenchmarkProcess(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: benchCallers, MaxRetries: -1, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	pooled, err := lua.New(c, lua.WithPrefix("bench"))
	if err != nil {
		b.Fatal(err)
	}
	plain, err := lua.New(scripter{c}, lua.WithPrefix("bench"))
	if err != nil {
		b.Fatal(err)
	}
	coal, err := lua.New(c, lua.WithPrefix("bench"), lua.WithCoalescing(256))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	par := (benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)
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
	rule := func(name string, alg ratebudget.Algorithm) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: 1 << 30, Window: time.Minute}
	}
	fixed := rule("f", ratebudget.FixedWindow)
	token := rule("t", ratebudget.TokenBucket)
	rolling := rule("r", ratebudget.RollingWindow)
	var seq atomic.Int64
	type benchCase struct {
		name  string
		l     *lua.Limiter
		rules []ratebudget.Rule
		hot   bool // one budget for all callers
	}
	var cases []benchCase
	for _, tr := range []struct {
		prefix string
		l      *lua.Limiter
	}{{"", pooled}, {"pool/", plain}} {
		for _, rc := range []struct {
			name  string
			rules []ratebudget.Rule
		}{
			{"fixed", []ratebudget.Rule{fixed}},
			{"token", []ratebudget.Rule{token}},
			{"rolling", []ratebudget.Rule{rolling}},
			{"3fixed", []ratebudget.Rule{fixed, rule("f2", ratebudget.FixedWindow), rule("f3", ratebudget.FixedWindow)}},
			{"3mixed", []ratebudget.Rule{fixed, token, rolling}},
		} {
			cases = append(cases, benchCase{tr.prefix + rc.name, tr.l, rc.rules, false})
		}
	}
	cases = append(cases,
		benchCase{"hot", pooled, []ratebudget.Rule{fixed}, true},
		benchCase{"coalesced/hot", coal, []ratebudget.Rule{fixed}, true},
		benchCase{"coalesced/fixed", coal, []ratebudget.Rule{fixed}, false})
	for _, bc := range cases {
		l := bc.l
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			pingStats := commandStats(b, c)
			pingCPU := cpuNow(b, c)
			pingTime := pingLoop(b, c, b.N)
			pingCPU = cpuNow(b, c).sub(pingCPU)
			pingRedis := commandStats(b, c).sub(pingStats)
			before := commandStats(b, c)
			cpu := cpuNow(b, c)
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				id := "client-" + strconv.FormatInt(seq.Add(1), 10) // one budget per caller
				if bc.hot {
					id = "hot"
				}
				checks := make([]ratebudget.Check, len(bc.rules))
				for i, r := range bc.rules {
					checks[i] = ratebudget.Check{Rule: r, Identity: id, Cost: 1}
				}
				for pb.Next() {
					if _, err := l.Allow(ctx, checks); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			elapsed := b.Elapsed()
			cpu = cpuNow(b, c).sub(cpu)
			after := commandStats(b, c).sub(before)
			if elapsed > 0 {
				b.ReportMetric(float64(pingTime)/float64(elapsed), "x-ping")
			}
			if calls := after.calls["evalsha"] + after.calls["eval"]; calls > 0 {
				b.ReportMetric((after.usec["evalsha"]+after.usec["eval"])/float64(b.N), "redis-us/op")
			}
			if n := pingRedis.calls["ping"]; n > 0 {
				b.ReportMetric(pingRedis.usec["ping"]/float64(n), "ping-redis-us")
			}
			n := float64(b.N)
			b.ReportMetric(cpu.server/n, "server-cpu-us/op")
			if !math.IsNaN(cpu.client) {
				b.ReportMetric(cpu.client/n, "client-cpu-us/op")
			}
			b.ReportMetric(pingCPU.server/n, "ping-server-cpu-us")
			if !math.IsNaN(pingCPU.client) {
				b.ReportMetric(pingCPU.client/n, "ping-client-cpu-us")
			}
		})
	}
}

// scripter hides a client's type from lua.New: it is then used as any redis.Scripter,
// every decision on its caller's goroutine through the client's pool.
type scripter struct{ redis.Scripter }

// pingLoop times n PINGs made by benchCallers goroutines on c.
func pingLoop(b *testing.B, c *redis.Client, n int) time.Duration {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	start := time.Now()
	for range benchCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := c.Ping(ctx).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

type cmdStats struct {
	calls map[string]float64
	usec  map[string]float64
}

// commandStats reads INFO commandstats: calls and total microseconds per command.
func commandStats(tb testing.TB, c *redis.Client) cmdStats {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	s := cmdStats{calls: map[string]float64{}, usec: map[string]float64{}}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				s.calls[name] = x
			case "usec":
				s.usec[name] = x
			}
		}
	}
	return s
}

func (s cmdStats) sub(o cmdStats) cmdStats {
	d := cmdStats{calls: map[string]float64{}, usec: map[string]float64{}}
	for k, v := range s.calls {
		d.calls[k] = v - o.calls[k]
	}
	for k, v := range s.usec {
		d.usec[k] = v - o.usec[k]
	}
	return d
}

// cpuTimes are CPU microseconds used by the redis-server process and by this process
// (NaN where this process's cannot be read, see cputime.Process).
type cpuTimes struct{ server, client float64 }

func cpuNow(tb testing.TB, c *redis.Client) cpuTimes {
	tb.Helper()
	info, err := c.InfoMap(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var t cpuTimes
	for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
		x, err := strconv.ParseFloat(info["CPU"][k], 64)
		if err != nil {
			tb.Fatalf("INFO cpu %s: %v", k, err)
		}
		t.server += x * 1e6
	}
	client, err := cputime.Process()
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		t.client = math.NaN()
	case err != nil:
		tb.Fatal(err)
	default:
		t.client = float64(client) / 1e3
	}
	return t
}

func (t cpuTimes) sub(o cpuTimes) cpuTimes { return cpuTimes{t.server - o.server, t.client - o.client} }
