package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// failingSettler is an in-process limiter whose Settle and Renew fail with a store error
// while failSettle and failRenew are set; it then settles and renews nothing (as a
// limiter whose store is down), and clears the tickets as Settle does.
type failingSettler struct {
	*memory.Limiter
	failSettle, failRenew atomic.Bool
}

var errDown = &ratebudget.StoreError{Class: ratebudget.ClassConnection, Uncertain: true, Err: errors.New("read tcp 10.1.2.3:6379: connection reset by peer")}

func (f *failingSettler) Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error {
	if f.failSettle.Load() {
		clear(tickets[:len(checks)])
		return errDown
	}
	return f.Limiter.Settle(ctx, checks, tickets, costs)
}

func (f *failingSettler) Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	if f.failRenew.Load() {
		return errDown
	}
	return f.Limiter.Renew(ctx, checks, tickets)
}

// events records the events an observer saw.
type events struct {
	mu  sync.Mutex
	evs []middleware.Event
}

func (e *events) observe(ev middleware.Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

// take returns the outcomes seen since the last take, and the events.
func (e *events) take() ([]middleware.Result, []middleware.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	evs := e.evs
	e.evs = nil
	var outs []middleware.Result
	for _, ev := range evs {
		outs = append(outs, ev.Result)
	}
	return outs, evs
}

// wantSettleFailed fails unless ev reports a failed settle of the request to path with
// the store's error.
func wantSettleFailed(t *testing.T, ev middleware.Event, path string, class ratebudget.ErrorClass) {
	t.Helper()
	var se *ratebudget.StoreError
	if ev.Result != middleware.SettleFailed || !errors.As(ev.Err, &se) || se.Class != class ||
		ev.Request == nil || ev.Request.URL.Path != path || ev.Decision.Rule != "" {
		t.Fatalf("event %+v (err %v), want SettleFailed of %s with a %q store error and no decision", ev, ev.Err, path, class)
	}
}

// TestSettleFailureIsObserved: a settle that fails once the handler returned (a 500 given
// back under CountSuccesses) is an event of its own, after the decision's, with the
// store's error; the response is the handler's, and the reservation stays spent. A settle
// that succeeds adds no event.
func TestSettleFailureIsObserved(t *testing.T) {
	t.Parallel()
	lim := &failingSettler{Limiter: newMemory(t, newClock())}
	r := rule("flaky", 3, time.Minute)
	var seen events
	h := mustNew(t, lim, []middleware.Rule{{Rule: r, Identity: global, Counts: middleware.CountSuccesses(nil)}},
		middleware.WithObserver(seen.observe))(flakyRoute)
	lim.failSettle.Store(true)
	if c := do(h, "GET", "/flaky?status=500", nil).Code; c != 500 {
		t.Fatalf("status %d, want the handler's 500", c)
	}
	outs, evs := seen.take()
	if len(outs) != 2 || outs[0] != middleware.Allowed {
		t.Fatalf("events %v, want the admission, then the failed settle", outs)
	}
	wantSettleFailed(t, evs[1], "/flaky", "connection")
	lim.failSettle.Store(false)
	if c := do(h, "GET", "/flaky?status=500", nil).Code; c != 500 {
		t.Fatalf("status %d, want the handler's 500", c)
	}
	if outs, _ := seen.take(); len(outs) != 1 || outs[0] != middleware.Allowed {
		t.Fatalf("events %v after a settle that succeeded, want the admission alone", outs)
	}
	// The failed settle gave nothing back: 1 of 3 spent.
	if n := left(t, lim, r, globalID); n != 2 {
		t.Fatalf("%d left, want 2: the failed settle's reservation stays spent", n)
	}
}

// TestRenewFailureIsObserved: while a handler holding a lease runs, a renewal that fails
// is reported to the observers as it happens, on the renewal's timer; the settle at the
// end, which succeeds, releases the lease.
func TestRenewFailureIsObserved(t *testing.T) {
	t.Parallel()
	lim := &failingSettler{Limiter: newMemory(t, newClock())}
	lim.failRenew.Store(true)
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: 40 * time.Millisecond}
	failed := make(chan middleware.Event, 1)
	var seen events
	observer := func(ev middleware.Event) {
		seen.observe(ev)
		if ev.Result == middleware.SettleFailed {
			select {
			case failed <- ev:
			default:
			}
		}
	}
	var during middleware.Event
	h := mustNew(t, lim, []middleware.Rule{{Rule: slots, Identity: global}}, middleware.WithObserver(observer))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			// The lease is renewed every 20ms (half its TTL): wait for the failure.
			select {
			case during = <-failed:
			case <-time.After(10 * time.Second):
			}
		}))
	if c := do(h, "GET", "/slow", nil).Code; c != 200 {
		t.Fatalf("status %d", c)
	}
	if during.Result != middleware.SettleFailed {
		t.Fatal("no failed renewal was observed while the handler ran (10s)")
	}
	wantSettleFailed(t, during, "/slow", "connection")
	outs, _ := seen.take()
	if len(outs) < 2 || outs[0] != middleware.Allowed {
		t.Fatalf("events %v, want the admission, then failed renewals", outs)
	}
	for _, o := range outs[1:] {
		if o != middleware.SettleFailed {
			t.Fatalf("events %v, want only failed renewals after the admission", outs)
		}
	}
	// The final settle succeeded: the lease is free.
	if n := left(t, lim, slots, globalID); n != 1 {
		t.Fatalf("%d of 1 slot free after the request, want 1", n)
	}
}

// TestCancelFailureIsObserved: when a later limiter refuses, the earlier limiter's
// reservation is given back; a failure to give it back is reported to the observers of
// every layer, as the refusal is, whichever layer's limiter failed.
func TestCancelFailureIsObserved(t *testing.T) {
	t.Parallel()
	first := &failingSettler{Limiter: newMemory(t, newClock())}
	second := newMemory(t, newClock())
	var outerSeen, innerSeen events
	outer := mustNew(t, first, []middleware.Rule{{Rule: rule("outer", 5, time.Minute), Identity: global, Counts: middleware.CountSuccesses(nil)}},
		middleware.WithObserver(outerSeen.observe))
	inner := mustNew(t, second, []middleware.Rule{{Rule: rule("inner", 1, time.Minute), Identity: global}},
		middleware.WithObserver(innerSeen.observe))
	h := outer(inner(ok))
	if c := do(h, "GET", "/", nil).Code; c != 200 {
		t.Fatalf("first: %d", c)
	}
	if outs, _ := outerSeen.take(); len(outs) != 1 || outs[0] != middleware.Allowed {
		t.Fatalf("outer layer's events %v, want the admission alone", outs)
	}
	innerSeen.take()
	first.failSettle.Store(true)
	if c := do(h, "GET", "/", nil).Code; c != 429 {
		t.Fatalf("second: %d, want 429 from the inner limiter", c)
	}
	outs, evs := outerSeen.take()
	if len(outs) != 2 || outs[1] != middleware.Denied {
		t.Fatalf("outer layer's events %v, want the failed cancel, then the refusal", outs)
	}
	wantSettleFailed(t, evs[0], "/", "connection")
	if outs, _ := innerSeen.take(); len(outs) != 2 || outs[0] != middleware.SettleFailed || outs[1] != middleware.Denied {
		t.Fatalf("inner layer's events %v, want the failed cancel, then the refusal, as the outer layer", outs)
	}
}

// TestSettleFailureOnRedis: with the lua limiter, a settle that meets a store gone away
// since the admission is observed as a connection failure.
func TestSettleFailureOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim, err := lua.New(srv.Client(t), lua.WithPrefix("settlefail"))
	if err != nil {
		t.Fatal(err)
	}
	var seen events
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("flaky", 3, time.Minute), Identity: global, Counts: middleware.CountSuccesses(nil)}},
		middleware.WithObserver(seen.observe), middleware.WithTimeout(time.Second))(
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			srv.Kill(t)
			w.WriteHeader(503)
		}))
	if c := do(h, "GET", "/gone", nil).Code; c != 503 {
		t.Fatalf("status %d, want the handler's 503", c)
	}
	outs, evs := seen.take()
	if len(outs) != 2 || outs[0] != middleware.Allowed {
		t.Fatalf("events %v, want the admission, then the failed settle", outs)
	}
	wantSettleFailed(t, evs[1], "/gone", "connection")
}

// InProcess reports false: the limiter stands in for one with a store, which gets a
// deadline and a circuit breaker.
func (f *failingSettler) InProcess() bool { return false }
