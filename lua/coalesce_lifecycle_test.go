package lua_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// panicHook is a go-redis hook that, for script calls, panics once when armed (a bug in
// a user's hook, which go-redis does not recover and which reaches the limiter's
// caller), else, when gate is not nil, signals gated and waits until gate is closed.
type panicHook struct {
	armed  atomic.Bool
	gate   chan struct{} // nil: no wait
	gated  chan struct{} // buffered for every call of the test
	panics atomic.Int32
}

var errHook = errors.New("hook bug")

func (h *panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			if h.armed.CompareAndSwap(true, false) {
				h.panics.Add(1)
				panic(errHook)
			}
			if h.gate != nil {
				h.gated <- struct{}{}
				<-h.gate
			}
		}
		return next(ctx, cmd)
	}
}

// allowRecovered is l.Allow(ctx, apiCheck(limit)), with a panic returned as p.
func allowRecovered(ctx context.Context, l *lua.Limiter, limit int64) (r result, p any) {
	defer func() { p = recover() }()
	d, err := l.Allow(ctx, apiCheck(limit))
	return result{d, err}, nil
}

// A coalesced decision whose call panics (a user's go-redis hook) must not leave its
// signature in flight: later decisions of the same checks would wait behind it until
// their context ended, and forever without a deadline.
func TestCoalescedLeaderPanicLandsItsFlight(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &panicHook{}
	client.AddHook(hook)
	l := newLimiter(t, client, lua.WithCoalescing(16), lua.WithRefusalCache(0))
	hook.armed.Store(true)
	if _, p := allowRecovered(context.Background(), l, 100); p != errHook {
		t.Fatalf("first decision: panic %v, want the hook's", p)
	}
	if _, f := lua.Waiting(l); f != 0 {
		t.Errorf("after the panic: %d signatures in flight, want none", f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // bounds a wedged decision
	defer cancel()
	if r, p := allowRecovered(ctx, l, 100); p != nil || r.err != nil || !r.d.Allowed {
		t.Fatalf("next decision of the same checks: %+v, %v, panic %v; want admitted", r.d, r.err, p)
	}
}

// A group's sender whose call panics must still let the group's other members decide,
// and land the flight for the decisions after them.
func TestCoalescedSenderPanicAnswersTheMembers(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &panicHook{gate: make(chan struct{}), gated: make(chan struct{}, 16)}
	client.AddHook(hook)
	l := newLimiter(t, client, lua.WithCoalescing(16), lua.WithRefusalCache(0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // bounds a wedged decision
	defer cancel()
	type answer struct {
		r result
		p any
	}
	out := make(chan answer, 4)
	decide := func() {
		r, p := allowRecovered(ctx, l, 100)
		out <- answer{r, p}
	}
	go decide()
	<-hook.gated // the first decision is in flight, held in the hook
	for range 3 {
		go decide()
	}
	waitFor(t, "three decisions to join a group", func() bool { m, _ := lua.Waiting(l); return m == 3 })
	hook.armed.Store(true) // the next call, the group's, panics
	close(hook.gate)       // every call goes on from now
	panics, admitted := 0, 0
	for range 4 {
		a := <-out
		switch {
		case a.p == errHook:
			panics++
		case a.p != nil:
			t.Fatalf("decision panicked with %v", a.p)
		case a.r.err != nil:
			t.Errorf("decision: %v; want an answer from Redis", a.r.err)
		case a.r.d.Allowed:
			admitted++
		}
	}
	if panics != 1 || admitted != 3 {
		t.Fatalf("%d panics, %d admitted; want the sender's panic and the other three admitted", panics, admitted)
	}
	if r, p := allowRecovered(ctx, l, 100); p != nil || r.err != nil || !r.d.Allowed {
		t.Fatalf("next decision of the same checks: %+v, %v, panic %v; want admitted", r.d, r.err, p)
	}
	if m, f := lua.Waiting(l); m != 0 || f != 0 {
		t.Errorf("after the decisions: %d waiting, %d in flight; want none", m, f)
	}
}

// The decision in flight, whose landing seals the group behind it, is canceled while
// Redis holds it: the group is sealed all the same, and its members are answered by
// the group's own call, all admitted. The canceled call may still have been applied.
func TestCoalescedFlightCanceled(t *testing.T) {
	srv, control, l := coalescing(t, nil)
	chk := apiCheck(1000)
	srv.Freeze(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan result, 1)
	go func() {
		d, err := l.Allow(ctx, chk)
		first <- result{d, err}
	}()
	waitFor(t, "the first decision in flight", func() bool { _, f := lua.Waiting(l); return f == 1 })
	out := make(chan result, 3)
	join(t, l, chk, 3, 3, background, out)
	cancel()
	if r := <-first; r.err == nil {
		t.Fatalf("canceled decision: %+v, want an error", r.d)
	}
	srv.Thaw(t)
	for range 3 {
		if r := <-out; r.err != nil || !r.d.Allowed {
			t.Fatalf("member: %+v, %v; want admitted", r.d, r.err)
		}
	}
	if v, err := control.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v < 3 || v > 4 {
		t.Fatalf("counter in Redis: %d, %v; want the 3 members, and perhaps the canceled call", v, err)
	}
	if m, f := lua.Waiting(l); m != 0 || f != 0 {
		t.Errorf("after the decisions: %d waiting, %d in flight; want none", m, f)
	}
}
