package lua_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// namedLimiter is a limiter under test and its name in failure messages.
type namedLimiter struct {
	name string
	l    ratebudget.Limiter
}

// TestSameDecisionsAsMemory: a sequence of random decisions (one to four checks, every
// time rule, a token bucket with a burst, a rule that some costs exceed, two scopes,
// several slots) gets the same answers from the in-process limiter, whose clock is
// stopped, and from the Redis limiter through the pool, over a dedicated connection
// with coalescing, with WithOneServer (with and without the refusal cache), and with
// the demo server's options. Windows are hours long, so time does not move any budget
// while the test runs. The in-process limiter decides every check at once; the Redis
// limiter decides slot by slot and refunds the earlier slots when a later one refuses
// (except with WithOneServer), so an inexact refund would make a later decision differ.
func TestSameDecisionsAsMemory(t *testing.T) {
	c := redistest.Start(t).Client(t)
	opts := []lua.Option{lua.WithRefusalCache(0)}
	sameDecisions(t, false, []*redis.Client{c}, []namedLimiter{
		{"pool", newLimiter(t, c, opts...)},
		{"coalesced", newLimiter(t, c, append(opts, lua.WithCoalescing(64))...)},
		{"one-server", newLimiter(t, c, append(opts, lua.WithOneServer())...)},
		// Without refunds the refusal cache is exact: it refuses only what Redis would.
		{"one-server-refusal-cache", newLimiter(t, c, lua.WithOneServer())},
		// The demo's options.
		{"demo", newLimiter(t, c, lua.WithOneServer(), lua.WithCoalescing(256))},
	})
}

// TestSameOutcomesAsMemory is TestSameDecisionsAsMemory through AllowEach: every
// check's outcome (admitted or not, exceeded or not, remaining units, a wait or none)
// is the in-process limiter's, with and without coalescing and the refusal cache. A
// third of the decisions repeat one of the last few, so that refusals are repeated
// from the cache: the limiter with a cache must make fewer script calls.
func TestSameOutcomesAsMemory(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	calls := map[string]*scriptCalls{}
	client := func(name string) *redis.Client {
		cl := srv.Client(t)
		calls[name] = &scriptCalls{}
		cl.AddHook(calls[name])
		return cl
	}
	opts := []lua.Option{lua.WithRefusalCache(0)}
	sameDecisions(t, true, []*redis.Client{c}, []namedLimiter{
		{"pool", newLimiter(t, client("pool"), opts...)},
		{"coalesced", newLimiter(t, client("coalesced"), append(opts, lua.WithCoalescing(64))...)},
		{"one-server", newLimiter(t, client("one-server"), append(opts, lua.WithOneServer())...)},
		{"one-server-refusal-cache", newLimiter(t, client("one-server-refusal-cache"), lua.WithOneServer())},
		{"demo", newLimiter(t, client("demo"), lua.WithOneServer(), lua.WithCoalescing(256))},
	})
	for name, n := range calls {
		t.Logf("%s: %d script calls", name, n.n.Load())
	}
	if none, cached := calls["one-server"].n.Load(), calls["one-server-refusal-cache"].n.Load(); cached > none-100 {
		t.Errorf("with the refusal cache %d script calls, without %d: want at least 100 refusals repeated from the cache", cached, none)
	}
}

// scriptCalls counts the EVALSHA and EVAL commands a client sends.
type scriptCalls struct{ n atomic.Int64 }

func (*scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "evalsha" || name == "eval" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// sameDecisions runs 1,500 random decisions on a stopped-clock ratebudget.Memory and on
// each of limiters, whose keys live on servers, and fails on the first answer that differs: admitted or not,
// exceeded or not, and the remaining units whenever both report the same rule. (Which
// rule is reported may differ: among equal candidates it depends on waits, which move
// with Redis's clock and not with the stopped one.) With each, every limiter decides
// through AllowEach, every check's outcome is compared, and a third of the decisions
// repeat one of the last eight.
func sameDecisions(t *testing.T, each bool, servers []*redis.Client, limiters []namedLimiter) {
	t.Helper()
	refunds := countRefunds(t, servers)
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := ratebudget.NewMemory(ratebudget.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	// Windows are distinct whole hours (and token buckets refill one unit every 94 to 156
	// minutes), so that waits of different rules are minutes apart.
	rule := func(alg ratebudget.Algorithm, hours time.Duration, limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: fmt.Sprintf("%v-%dh", alg, hours), Algorithm: alg, Limit: limit, Window: hours * time.Hour}
	}
	burst := rule(ratebudget.TokenBucket, 17, 3) // refills 1 unit per 340 minutes, holds 6
	burst.Burst = 6
	rules := []ratebudget.Rule{
		rule(ratebudget.FixedWindow, 1, 5), rule(ratebudget.FixedWindow, 3, 8), rule(ratebudget.FixedWindow, 5, 3),
		rule(ratebudget.RollingWindow, 2, 6), rule(ratebudget.RollingWindow, 4, 4), rule(ratebudget.RollingWindow, 6, 9),
		rule(ratebudget.TokenBucket, 7, 4), rule(ratebudget.TokenBucket, 11, 7), rule(ratebudget.TokenBucket, 13, 5),
		burst,
		rule(ratebudget.FixedWindow, 8, 2), // a cost of 3 exceeds it: Exceeded
	}
	scopes := []string{"", "/reports"}
	rng := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	var admitted, refused, exceeded, compared int
	var recent [][]ratebudget.Check
	for i := range 1500 {
		n := 1 + rng.IntN(4)
		checks := make([]ratebudget.Check, 0, n)
		seen := map[[3]int]bool{}
		if each && len(recent) > 0 && rng.IntN(3) == 0 {
			checks = recent[rng.IntN(len(recent))] // a repeat: not extended below
			n = len(checks)
		}
		for len(checks) < n {
			r, id, sc := rng.IntN(len(rules)), rng.IntN(30), rng.IntN(len(scopes))
			if seen[[3]int{r, id, sc}] {
				continue
			}
			seen[[3]int{r, id, sc}] = true
			checks = append(checks, ratebudget.Check{
				Rule: rules[r], Identity: fmt.Sprintf("id-%d", id), Scope: scopes[sc], Cost: 1 + rng.Int64N(3),
			})
		}
		if each {
			recent = append(recent, checks)
			if len(recent) > 8 {
				recent = recent[1:]
			}
		}
		wantOuts := make([]ratebudget.Outcome, len(checks))
		var want ratebudget.Decision
		var err error
		if each {
			want, err = mem.AllowEach(ctx, checks, wantOuts)
		} else {
			want, err = mem.Allow(ctx, checks)
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case want.Allowed:
			admitted++
		case want.Exceeded:
			exceeded++
		default:
			refused++
		}
		for _, nl := range limiters {
			var got ratebudget.Decision
			var err error
			outs := make([]ratebudget.Outcome, len(checks))
			if each {
				got, err = nl.l.(ratebudget.Reporter).AllowEach(ctx, checks, outs)
			} else {
				got, err = nl.l.Allow(ctx, checks)
			}
			if err != nil {
				t.Fatalf("decision %d, %s: %v", i, nl.name, err)
			}
			for j := range outs {
				if !each {
					break
				}
				g, w := outs[j], wantOuts[j]
				if g.Allowed != w.Allowed || g.Exceeded != w.Exceeded || g.Remaining != w.Remaining || (g.RetryAfter > 0) != (w.RetryAfter > 0) {
					t.Fatalf("decision %d of %+v, check %d:\n%s: %+v\nmemory: %+v", i, checks, j, nl.name, g, w)
				}
			}
			if got.Allowed != want.Allowed || got.Exceeded != want.Exceeded ||
				got.Index == want.Index && got.Remaining != want.Remaining {
				t.Fatalf("decision %d of %+v:\n%s: %+v\nmemory: %+v", i, checks, nl.name, got, want)
			}
			if got.Index == want.Index {
				compared++
			}
		}
	}
	fixed, rolling := refunds.since(t)
	t.Logf("%d admitted, %d refused, %d exceeded; remaining compared %d times; refunds: %d to fixed windows, %d to rolling windows",
		admitted, refused, exceeded, compared, fixed, rolling)
	if admitted < 300 || refused < 300 || exceeded < 50 || compared < 900*len(limiters) || fixed < 20 || rolling < 20 {
		t.Fatalf("want at least 300 admitted, 300 refused, 50 exceeded, remaining compared %d times and 20 refunds of each kind",
			900*len(limiters))
	}
}
