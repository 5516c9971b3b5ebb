package lua_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestLayersExactUnderContention: with coalescing and the refusal cache on, many
// goroutines spend from one budget at once through Allow, AllowEach, decisions of two
// checks sharing a slot, costs of 1 and 2, and reservations held meanwhile, then
// settled at cost 0 (a give-back) or at their cost. Every admitted unit is counted: the total never passes
// the limit, and once the callers are done, a drain one unit at a time admits exactly
// what is left, so the total is the limit exactly and Redis's budget agrees. A refusal
// left cached after a give-back would stop the drain early; a member spent twice or
// lost would make the totals differ.
func TestLayersExactUnderContention(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
			prefix := uniquePrefix(t)
			l, err := lua.New(client, lua.WithPrefix(prefix), lua.WithCoalescing(64), lua.WithRefusalCache(1024))
			if err != nil {
				t.Fatal(err)
			}
			bare, err := lua.New(client, lua.WithPrefix(prefix), lua.WithRefusalCache(0))
			if err != nil {
				t.Fatal(err)
			}
			const limit, callers, each = 300, 32, 40
			// 366 days: a token bucket refills one unit per 29 hours, nothing ages out.
			rule := ratebudget.Rule{Name: "api", Algorithm: alg, Limit: limit, Window: 8784 * time.Hour}
			side := ratebudget.Rule{Name: "side", Limit: bound.MaxLimit, Window: time.Hour}
			main := func(cost int64) ratebudget.Check { return ratebudget.Check{Rule: rule, Identity: "ann", Cost: cost} }
			// settles: a rolling window gives an event back only while it is the newest,
			// so its reservations could stay spent; they are not used there.
			settles := alg != ratebudget.RollingWindow
			var admitted, maxSeen atomic.Int64
			note := func(cost int64) {
				if v := admitted.Add(cost); v > maxSeen.Load() {
					maxSeen.Store(v) // only a bound is checked: a lost race stores less
				}
			}
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range callers {
				wg.Go(func() {
					<-start
					// A reservation held while the others spend, settled at the end.
					held := []ratebudget.Check{main(1)}
					tickets := make([]ratebudget.Ticket, 1)
					if settles {
						if d, err := l.Reserve(ctx, held, tickets, nil); err != nil {
							t.Error(err)
							return
						} else if !d.Allowed {
							tickets = nil
						}
					}
					defer func() {
						if tickets == nil || !settles {
							return
						}
						keep := g%2 == 0
						actual := int64(0)
						if keep {
							actual = 1
						}
						if err := l.Settle(ctx, held, tickets, []int64{actual}); err != nil {
							t.Error(err)
						} else if keep {
							note(1)
						}
					}()
					for i := range each {
						var d ratebudget.Decision
						var err error
						cost := int64(1)
						switch op := (g + i) % 5; {
						case op == 0 || op == 1:
							d, err = l.Allow(ctx, []ratebudget.Check{main(1)})
						case op == 2:
							d, err = l.AllowEach(ctx, []ratebudget.Check{main(1)}, make([]ratebudget.Outcome, 1))
						case op == 3:
							cost = 2
							d, err = l.Allow(ctx, []ratebudget.Check{main(2)})
						case op == 4:
							chk := []ratebudget.Check{{Rule: side, Identity: "ann", Cost: 1}, main(1)}
							d, err = l.AllowEach(ctx, chk, make([]ratebudget.Outcome, 2))
							if err == nil && d.Allowed {
								note(1)
							}
							if err != nil {
								t.Error(err)
								return
							}
							continue
						default:
							d, err = l.Allow(ctx, []ratebudget.Check{main(1)})
						}
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							note(cost)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			if t.Failed() {
				return
			}
			if n := admitted.Load(); n > limit || maxSeen.Load() > limit {
				t.Fatalf("admitted %d units (at most %d seen), limit %d", n, maxSeen.Load(), limit)
			}
			concurrent := admitted.Load()
			for range limit + 1 {
				d, err := l.Allow(ctx, []ratebudget.Check{main(1)})
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				admitted.Add(1)
			}
			if n := admitted.Load(); n != limit {
				t.Fatalf("admitted %d units concurrently, %d in all after draining one by one; want exactly %d", concurrent, n, limit)
			}
			// Redis agrees: nothing is left for a request that asks it.
			out := make([]ratebudget.Outcome, 1)
			if d, err := bare.AllowEach(ctx, []ratebudget.Check{main(1)}, out); err != nil || d.Allowed || out[0].Remaining != 0 {
				t.Fatalf("Redis after the drain: %+v %+v, %v; want refused with nothing remaining", d, out, err)
			}
		})
	}
}
