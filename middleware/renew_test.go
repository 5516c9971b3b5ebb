package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/budgetkey"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// renewGate wraps a Settler to watch the middleware's lease renewals. A Renew call is
// offered on held when the test is receiving there at that moment, and then runs only
// once the test closes its proceed; otherwise it runs at once. Its error is sent on
// renewed, when that has room.
type renewGate struct {
	limitertest.Settler
	held    chan *heldRenew // unbuffered; nil: never held
	renewed chan error      // nil: not reported
}

// heldRenew is one Renew call the test holds.
type heldRenew struct {
	proceed chan struct{} // closed by the test: run the renewal
	err     chan error    // the renewal's result
}

func (g *renewGate) Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	h := &heldRenew{proceed: make(chan struct{}), err: make(chan error, 1)}
	held := false
	select {
	case g.held <- h:
		held = true
		<-h.proceed
	default:
	}
	err := g.Settler.Renew(ctx, checks, tickets)
	if held {
		h.err <- err
	}
	select {
	case g.renewed <- err:
	default:
	}
	return err
}

// longAndQuick is a handler for lease tests: /long signals running and holds its
// request until the test sends on release; any other path answers at once.
func longAndQuick(running, release chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/long" {
			running <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
}

// nextHeld waits for the middleware's next renewal to be offered on g.held.
func nextHeld(t *testing.T, g *renewGate, every time.Duration) *heldRenew {
	t.Helper()
	select {
	case h := <-g.held:
		return h
	case <-time.After(10 * time.Second):
		t.Fatalf("no lease renewal within 10s; one is due every %v", every)
		return nil
	}
}

// A handler that runs longer than its lease's TTL keeps its slot: the middleware renews
// the lease while the handler runs, and a concurrent request is still refused long after
// the TTL has passed; once the handler returns the slot is free. A renewal that comes
// after the lease expired finds it lost, and the slot was free meanwhile.
//
// The leases live on the in-process limiter's fake clock, which only the test moves; the
// middleware's renewal timer (every TTL/2) runs on the wall clock and is left as is. The
// test holds each renewal (renewGate) while it moves the fake clock, so every renewal
// happens at a fake time the test chose: the fake clock reaches 3 TTLs after the
// admission while every lease expiry stays ahead of it, whatever the machine's load.
func TestInFlightLeaseRenewedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	clk := newClock()
	gate := &renewGate{Settler: newMemory(t, clk), held: make(chan *heldRenew)}
	const ttl = 20 * time.Millisecond // of the fake clock; renewals come every 10ms of wall time
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: ttl}
	running, release := make(chan struct{}, 1), make(chan struct{})
	h := mustNew(t, gate, []middleware.Rule{{Rule: slots, Identity: global}})(longAndQuick(running, release))
	done := make(chan int, 1)
	go func() { done <- do(h, "GET", "/long", nil).Code }()
	<-running

	admitted := clk.Now()
	step := ttl * 3 / 4
	for i := 1; i <= 4; i++ {
		r := nextHeld(t, gate, ttl/2)
		// The lease was taken or last renewed step ago: still live, the slot still taken.
		clk.Advance(step)
		if c := do(h, "GET", "/quick", nil).Code; c != http.StatusTooManyRequests {
			t.Fatalf("round %d, before the renewal: a concurrent request got %d, want 429", i, c)
		}
		close(r.proceed)
		if err := <-r.err; err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		if c := do(h, "GET", "/quick", nil).Code; c != http.StatusTooManyRequests {
			t.Fatalf("round %d, after the renewal: a concurrent request got %d, want 429", i, c)
		}
	}
	if held := clk.Now().Sub(admitted); held < 3*ttl {
		t.Fatalf("the slot was held for %v of the limiter's clock, want at least 3 TTLs (%v)", held, 3*ttl)
	}
	release <- struct{}{}
	if c := <-done; c != http.StatusOK {
		t.Fatalf("the long request answered %d", c)
	}
	if c := do(h, "GET", "/quick", nil).Code; c != http.StatusOK {
		t.Fatalf("after the long request returned: %d, want 200 (its lease released)", c)
	}

	// The same, with a renewal held until the fake clock is past the lease's expiry: the
	// lease expires, its slot admits another request, and the late renewal reports the
	// lease lost (and does not take the slot back).
	go func() { done <- do(h, "GET", "/long", nil).Code }()
	<-running
	r := nextHeld(t, gate, ttl/2)
	clk.Advance(ttl + time.Millisecond)
	if c := do(h, "GET", "/quick", nil).Code; c != http.StatusOK {
		t.Fatalf("a lease not renewed within its TTL still held the slot: %d, want 200", c)
	}
	close(r.proceed)
	if err := <-r.err; !errors.Is(err, ratebudget.ErrLeaseLost) {
		t.Fatalf("a renewal after the expiry: %v, want ErrLeaseLost", err)
	}
	release <- struct{}{}
	if c := <-done; c != http.StatusOK {
		t.Fatalf("the long request answered %d", c)
	}
}

// On Redis, as in process, a running handler's lease is renewed and outlives its TTL:
// the lease's expiry in Redis moves forward with every renewal, a concurrent request is
// refused after each one, also once the server's clock is past the TTL from the
// admission, and the lease is gone once the handler has returned.
//
// Redis's clock cannot be moved, so this test runs for about 1.5 TTLs of wall time
// (renewals every TTL/2 = 2s). Every check is made against the server's clock: it ends
// with a refusal that started a quarter TTL after the admission's lease would have
// expired.
func TestInFlightLeaseRenewedOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	lim, err := lua.New(client, lua.WithPrefix("renew"))
	if err != nil {
		t.Fatal(err)
	}
	gate := &renewGate{Settler: lim, renewed: make(chan error, 16)}
	const ttl = 4 * time.Second // renewals due every 2 s: one must run 2 s late to lose the lease
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: ttl}
	key := budgetkey.New("renew", nil).Key(ratebudget.Check{Rule: slots, Identity: globalID, Cost: 1})
	running, release := make(chan struct{}, 1), make(chan struct{})
	h := mustNew(t, gate, []middleware.Rule{{Rule: slots, Identity: global}}, middleware.WithTimeout(2*time.Second))(longAndQuick(running, release))
	ctx := context.Background()
	// expiry is the one lease's expiry (server ms).
	expiry := func() int64 {
		t.Helper()
		zs, err := client.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil || len(zs) != 1 {
			t.Fatalf("leases in %s: %v, %v; want one", key, zs, err)
		}
		return int64(zs[0].Score)
	}
	now := func() int64 {
		t.Helper()
		tm, err := client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}

	done := make(chan int, 1)
	go func() { done <- do(h, "GET", "/long", nil).Code }()
	<-running
	first := expiry() // the admission's: when the lease would expire without renewals
	last := first
	renewals := 0
	for {
		select {
		case err := <-gate.renewed:
			if err != nil {
				t.Fatalf("renewal %d: %v", renewals+1, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no lease renewal within 30s (%d so far); one is due every %v", renewals, ttl/2)
		}
		renewals++
		e := expiry()
		if e <= last {
			t.Fatalf("renewal %d left the lease's expiry at %d, not after %d", renewals, e, last)
		}
		last = e
		before := now()
		if c := do(h, "GET", "/quick", nil).Code; c != http.StatusTooManyRequests {
			t.Fatalf("after renewal %d: a concurrent request got %d, want 429 (server time %d ms before the lease's expiry)", renewals, c, last-now())
		}
		if before > first+(ttl/4).Milliseconds() {
			t.Logf("refused %d ms past the admission's TTL, after %d renewals", before-first, renewals)
			break
		}
	}
	release <- struct{}{}
	if c := <-done; c != http.StatusOK {
		t.Fatalf("the long request answered %d", c)
	}
	if n, err := client.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the lease key after the handler returned: exists %d, %v; want released (gone)", n, err)
	}
	if c := do(h, "GET", "/quick", nil).Code; c != http.StatusOK {
		t.Fatalf("after the long request returned: %d, want 200", c)
	}
}

// A lease TTL so short that the first renewal is due at once (1ms, the shortest the
// demo's -lease-ttl takes): the renewals run and succeed while the handler runs, and the
// slot is free once it returns. Under -race this also checks that the renewal timer is
// published to its own callback before the callback can read it: nothing else in this
// test orders the request's goroutine before the renewals.
func TestInFlightShortLeaseRenewals(t *testing.T) {
	t.Parallel()
	gate := &renewGate{Settler: newMemory(t, newClock()), renewed: make(chan error, 64)}
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Millisecond}
	release := make(chan struct{})
	h := mustNew(t, gate, []middleware.Rule{{Rule: slots, Identity: global}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	done := make(chan int, 1)
	go func() { done <- do(h, "GET", "/", nil).Code }()
	for i := 1; i <= 3; i++ {
		select {
		case err := <-gate.renewed:
			if err != nil { // the fake clock stands still: no lease can expire
				t.Fatalf("renewal %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d renewals within 10s; one is due every 500µs", i-1)
		}
	}
	close(release)
	if c := <-done; c != http.StatusOK {
		t.Fatalf("the long request answered %d", c)
	}
	if c := do(h, "GET", "/", nil).Code; c != http.StatusOK {
		t.Fatalf("after the request returned: %d, want 200 (its lease released)", c)
	}
}
