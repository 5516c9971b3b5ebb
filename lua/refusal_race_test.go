package lua_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
)

// afterReply is a go-redis hook that runs fn once, when armed, after a command's reply
// came back and before the caller sees it.
type afterReply struct {
	armed atomic.Bool
	fn    func()
}

func (h *afterReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *afterReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *afterReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.armed.CompareAndSwap(true, false) {
			h.fn()
		}
		return err
	}
}

// TestRefusalCachedAfterSettle: a refusal whose reply is on its way back while a settle
// of this limiter gives its budget back is not cached: the settle dropped the budget's
// cached refusals before that refusal reached the cache, which would then refuse for
// its whole wait what Redis admits.
func TestRefusalCachedAfterSettle(t *testing.T) {
	c := redistest.Start(t).Client(t)
	hook := &afterReply{}
	c.AddHook(hook)
	l := newLimiter(t, c)
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for _, each := range []bool{false, true} {
			t.Run(fmt.Sprint(algname.Of(alg), each), func(t *testing.T) {
				chk := ratebudget.Check{Rule: ratebudget.Rule{Name: fmt.Sprint("r", each), Algorithm: alg, Limit: 3, Window: time.Hour}, Identity: "uma", Cost: 3}
				allow := func(cost int64) ratebudget.Decision {
					t.Helper()
					ch := chk
					ch.Cost = cost
					var d ratebudget.Decision
					var err error
					if each {
						d, err = l.AllowEach(ctx, []ratebudget.Check{ch}, make([]ratebudget.Outcome, 1))
					} else {
						d, err = l.Allow(ctx, []ratebudget.Check{ch})
					}
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				tickets := make([]ratebudget.Ticket, 1)
				if d, err := l.Reserve(ctx, []ratebudget.Check{chk}, tickets, nil); err != nil || !d.Allowed {
					t.Fatalf("Reserve: %+v, %v", d, err)
				}
				// Redis refuses; before the refusal reaches the cache, the reservation is
				// given back.
				var settleErr error
				hook.fn = func() { settleErr = l.Settle(ctx, []ratebudget.Check{chk}, tickets, nil) }
				hook.armed.Store(true)
				if d := allow(1); d.Allowed {
					t.Fatalf("cost 1 with the budget reserved: %+v, want refused", d)
				}
				if hook.armed.Load() || settleErr != nil {
					t.Fatalf("the settle did not run after the refusal: %v", settleErr)
				}
				if d := allow(1); !d.Allowed {
					t.Fatalf("cost 1 after the reservation was given back: %+v; want admitted, as Redis admits", d)
				}
			})
		}
	}
}

// TestRefusalCachedAcrossLimits: two rules of one name share their budget in Redis
// whatever their limits (a changed Limit, or two routes). A settle through one of them
// gives budget back; the other's cached refusal is dropped too, or this process would
// refuse for its whole wait what Redis admits.
func TestRefusalCachedAcrossLimits(t *testing.T) {
	l := newLimiter(t, redistest.Start(t).Client(t))
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
			wide := ratebudget.Check{Rule: ratebudget.Rule{Name: "api", Algorithm: alg, Limit: 3, Window: time.Hour}, Identity: "uma", Cost: 1}
			narrow := wide
			narrow.Rule.Limit = 2
			if d, err := l.Allow(ctx, []ratebudget.Check{narrow}); err != nil || !d.Allowed {
				t.Fatalf("first unit under the limit of 2: %+v, %v", d, err)
			}
			// Reserved last, so that a rolling window's event is the newest: given back.
			tickets := make([]ratebudget.Ticket, 1)
			if d, err := l.Reserve(ctx, []ratebudget.Check{wide}, tickets, nil); err != nil || !d.Allowed {
				t.Fatalf("Reserve: %+v, %v", d, err)
			}
			if d, err := l.Allow(ctx, []ratebudget.Check{narrow}); err != nil || d.Allowed {
				t.Fatalf("third unit under the limit of 2: %+v, %v; want refused", d, err)
			}
			if err := l.Settle(ctx, []ratebudget.Check{wide}, tickets, nil); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Allow(ctx, []ratebudget.Check{narrow}); err != nil || !d.Allowed {
				t.Fatalf("after the reservation was given back: %+v, %v; want admitted, as Redis admits", d, err)
			}
		})
	}
}

// orderedScripter is a redis.Scripter (without go-redis's Process, so that every script
// call is its own EvalSha or Eval on the caller's goroutine) that runs after once each
// call's reply came back, before the caller sees it.
type orderedScripter struct {
	redis.Scripter
	after func(ctx context.Context)
}

func (s *orderedScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	cmd := s.Scripter.EvalSha(ctx, sha, keys, args...)
	s.after(ctx)
	return cmd
}

func (s *orderedScripter) Eval(ctx context.Context, src string, keys []string, args ...any) *redis.Cmd {
	cmd := s.Scripter.Eval(ctx, src, keys, args...)
	s.after(ctx)
	return cmd
}

type callerKey struct{}

// TestRefusalCachedAfterRefund: a decision of two slot groups spends the first budget
// and is refused by the second; the first is refunded. Another decision on the first
// budget, sent while it was spent, is refused by Redis; its refusal reaches the cache
// only after the refund gave the budget back. It is not cached: the cache would refuse
// for the refusal's whole wait what Redis admits.
func TestRefusalCachedAfterRefund(t *testing.T) {
	c := redistest.Start(t).Client(t)
	var (
		aCalls             atomic.Int32
		bOnce              sync.Once
		aRefused, bReplied chan struct{}
		aDone              chan struct{}
	)
	s := &orderedScripter{Scripter: c, after: func(ctx context.Context) {
		switch ctx.Value(callerKey{}) {
		case "A":
			if aCalls.Add(1) == 2 { // the second group's refusal, before the refund
				close(aRefused)
				<-bReplied
			}
		case "B":
			bOnce.Do(func() {
				close(bReplied)
				<-aDone // the refund has given the budget back
			})
		}
	}}
	l := newLimiter(t, s)
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for _, reserve := range []bool{false, true} {
			t.Run(fmt.Sprint(algname.Of(alg), reserve), func(t *testing.T) {
				aCalls.Store(0)
				bOnce = sync.Once{}
				aRefused, bReplied, aDone = make(chan struct{}), make(chan struct{}), make(chan struct{})
				rule := ratebudget.Rule{Name: fmt.Sprint("x", reserve), Algorithm: alg, Limit: 1, Window: time.Hour}
				x := ratebudget.Check{Rule: rule, Identity: "uma", Cost: 1}
				y := x
				y.Rule.Name, y.Identity = fmt.Sprint("y", reserve), "" // another slot
				// y's budget is spent, by an admission: nothing is cached.
				if d, err := l.Allow(ctx, []ratebudget.Check{y}); err != nil || !d.Allowed {
					t.Fatalf("y: %+v, %v", d, err)
				}
				var dA ratebudget.Decision
				var errA error
				go func() {
					defer close(aDone)
					actx := context.WithValue(ctx, callerKey{}, "A")
					if reserve {
						dA, errA = l.Reserve(actx, []ratebudget.Check{x, y}, make([]ratebudget.Ticket, 2), nil)
					} else {
						dA, errA = l.Allow(actx, []ratebudget.Check{x, y})
					}
				}()
				<-aRefused
				dB, errB := l.Allow(context.WithValue(ctx, callerKey{}, "B"), []ratebudget.Check{x})
				<-aDone
				if errA != nil || dA.Allowed || errB != nil || dB.Allowed {
					t.Fatalf("x and y: %+v, %v; x while spent by it: %+v, %v; want both refused", dA, errA, dB, errB)
				}
				if d, err := l.Allow(ctx, []ratebudget.Check{x}); err != nil || !d.Allowed {
					t.Fatalf("x after the refund: %+v, %v; want admitted, as Redis admits", d, err)
				}
			})
		}
	}
}
