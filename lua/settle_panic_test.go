package lua_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// scriptHook is a go-redis hook that runs each script call through its script
// function, given the call's number (from 1) and the rest of the chain.
type scriptHook struct {
	calls  atomic.Int32
	script func(n int32, ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			return h.script(h.calls.Add(1), ctx, cmd, next)
		}
		return next(ctx, cmd)
	}
}

// settleRecovered is l.Settle, with a panic returned as p.
func settleRecovered(ctx context.Context, l *lua.Limiter, checks []ratebudget.Check, tickets []ratebudget.Ticket) (p any, err error) {
	defer func() { p = recover() }()
	return nil, l.Settle(ctx, checks, tickets, nil)
}

// settleCaller marks the context of a test's own call, to tell in a hook a command sent
// with it (on the limiter's goroutines) from one that the client's AutoPipeliner
// dispatches (whose hooks run with a context of go-redis's own).
type settleCaller struct{}

// Checks of several hash slots are settled by one call per slot, sent at once from
// goroutines of the limiter's own. A panic in one of those calls (a client hook's bug)
// must reach the caller of Settle, as it does when the checks share a slot (one call,
// on the caller's goroutine, where http.Server recovers a request's panic), and not end
// the process; the other slots are still settled.
//
// The hook panics only in a call sent on the limiter's goroutine. While the other
// slot's call is in flight, a call joins the client's AsyncAutoPipeline, whose
// dispatch goroutine runs the hooks and itself recovers a panic into the command's
// error (go-redis's behaviour, not the limiter's); the first call of the two to start
// is always sent directly, so exactly one call panics and it is one the limiter
// must hand on to the caller.
func TestSettlePanicAcrossSlotsReachesTheCaller(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	var armed atomic.Bool
	hook := &scriptHook{script: func(_ int32, ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if ctx.Value(settleCaller{}) != nil && armed.CompareAndSwap(true, false) {
			panic(errHook)
		}
		return next(ctx, cmd)
	}}
	client.AddHook(hook)
	l := newLimiter(t, client, lua.WithRefusalCache(0))
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	checks := []ratebudget.Check{{Rule: slots, Identity: "ann", Cost: 1}, {Rule: slots, Identity: "bob", Cost: 1}}
	ctx := context.Background()
	tickets := make([]ratebudget.Ticket, len(checks))
	if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("reserve: %+v, %v", d, err)
	}
	armed.Store(true)
	if p, _ := settleRecovered(context.WithValue(ctx, settleCaller{}, true), l, checks, tickets); p != errHook {
		t.Fatalf("settle: panic %v on the caller's goroutine, want the hook's", p)
	}
	// One slot's call panicked, the other's ran: exactly one of the two is free again.
	free := 0
	for i := range checks {
		if d, err := l.Allow(ctx, checks[i:i+1]); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			free++
		}
	}
	if free != 1 {
		t.Fatalf("%d of the two leases released, want the one whose call did not panic", free)
	}
}

// An in-flight decision whose reply is lost (uncertain) has its leases released by a
// refund on a goroutine of the limiter's own, after the decision returned. A panic
// there (a client hook's bug) has no caller to reach: it must not end the process.
func TestDetachedReleasePanicKeepsTheProcess(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	var panics atomic.Int32
	hook := &scriptHook{script: func(n int32, ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		switch n {
		case 1: // the decision: sent, its reply lost
			if err := next(ctx, cmd); err != nil {
				return err
			}
			return context.DeadlineExceeded
		case 2: // the release of its lease
			panics.Add(1)
			panic(errHook)
		}
		return next(ctx, cmd)
	}}
	client.AddHook(hook)
	l := newLimiter(t, client, lua.WithRefusalCache(0))
	if err := l.Load(context.Background()); err != nil { // no NOSCRIPT, and no EVAL after it
		t.Fatal(err)
	}
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	checks := []ratebudget.Check{{Rule: slots, Identity: "ann", Cost: 1}}
	var se *ratebudget.StoreError
	if _, err := l.Allow(context.Background(), checks); !errors.As(err, &se) || !se.Uncertain {
		t.Fatalf("decision: %v, want an uncertain store error", err)
	}
	waitFor(t, "the release to run", func() bool { return panics.Load() == 1 })
	// The process goes on: the limiter still decides (the lease taken by the lost call
	// was not released, and refuses until its TTL).
	if d, err := l.Allow(context.Background(), checks); err != nil || d.Allowed {
		t.Fatalf("next decision: %+v, %v; want refused by the unreleased lease", d, err)
	}
}
