package limitertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// Settler is a limiter whose decisions can be reserved, settled and their leases renewed,
// as those of packages memory and lua are; the contract is "Settling a decision" in the
// [ratebudget] package documentation.
type Settler interface {
	ratebudget.Limiter
	Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
	Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error
	Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error
}

// Reporter is a limiter that reports every check's outcome, as those of packages memory
// and lua do; the contract is "Reporting every check" in the [ratebudget] package
// documentation.
type Reporter interface {
	ratebudget.Limiter
	AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
}

// runSettle runs the cases of [Settler] and of [ratebudget.InFlight] rules. Each skips
// for a limiter that does not implement Settler.
func runSettle(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, alg := range algorithms {
		t.Run("settle/"+algname.Of(alg), func(t *testing.T) {
			tests := []struct {
				name string
				fn   func(e *env, s Settler, alg ratebudget.Algorithm)
			}{
				{"Cancel", testSettleCancel},
				{"Lower", testSettleLower},
				{"HigherDebt", testSettleHigher},
				{"BoundedDebt", testSettleBoundedDebt},
				{"NeverRefundsALaterWindow", testSettleLaterWindow},
				{"RefusedOrPlainDecision", testSettleNothing},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					e, s := settlerEnv(t, newHarness)
					tt.fn(e, s, alg)
				})
			}
		})
	}
	cases := []struct {
		name string
		fn   func(e *env, s Settler)
	}{
		{"settle/SeveralRulesAtOnce", testSettleSeveral},
		{"settle/InvalidArguments", testSettleInvalid},
		{"inflight/LimitAndRelease", testInFlightLimit},
		{"inflight/ExpiresWithoutRelease", testInFlightExpiry},
		{"inflight/Renew", testInFlightRenew},
		{"inflight/AllOrNothing", testInFlightAllOrNothing},
		{"inflight/Concurrency", testInFlightConcurrency},
		{"inflight/CostMustBeOne", testInFlightCost},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, s := settlerEnv(t, newHarness)
			tt.fn(e, s)
		})
	}
}

func settlerEnv(t *testing.T, newHarness func(t *testing.T) Harness) (*env, Settler) {
	h := newHarness(t)
	s, ok := h.Limiter.(Settler)
	if !ok {
		t.Skipf("%T does not implement Settler", h.Limiter)
	}
	return newEnv(t, h), s
}

func (e *env) reserve(s Settler, checks ...ratebudget.Check) (ratebudget.Decision, []ratebudget.Ticket) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tickets := make([]ratebudget.Ticket, len(checks))
	for i := range tickets {
		tickets[i] = ratebudget.Ticket{At: -1, ID: -1} // must be overwritten
	}
	d, err := s.Reserve(ctx, checks, tickets, nil)
	if err != nil {
		e.t.Fatalf("Reserve(%v): %v", checks, err)
	}
	for i, tk := range tickets {
		if (tk == ratebudget.Ticket{}) == d.Allowed {
			e.t.Fatalf("Reserve(%v) = %+v with ticket %d %+v: want tickets set exactly on admission", checks, d, i, tk)
		}
	}
	return d, tickets
}

func (e *env) settle(s Settler, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Settle(ctx, checks, tickets, costs); err != nil {
		e.t.Fatalf("Settle(%v, %v): %v", checks, costs, err)
	}
	for i, tk := range tickets[:len(checks)] {
		if tk != (ratebudget.Ticket{}) {
			e.t.Fatalf("Settle left ticket %d as %+v, want it cleared", i, tk)
		}
	}
}

// testSettleCancel: a cancelled decision leaves the budget as if it had not been admitted,
// and settling it again changes nothing more.
func testSettleCancel(e *env, s Settler, alg ratebudget.Algorithm) {
	r := e.rule("api", alg, 5, long)
	c := check(r, "mia", 2)
	e.expect(e.allow(check(r, "mia", 1)), true, 4)
	d, tk := e.reserve(s, c)
	e.expect(d, true, 2)
	e.settle(s, []ratebudget.Check{c}, tk, nil)
	e.settle(s, []ratebudget.Check{c}, tk, nil) // the ticket is spent: nothing more
	e.expect(e.allow(check(r, "mia", 4)), true, 0)
	e.expect(e.allow(check(r, "mia", 1)), false, 0)

	// A cancelled first admission leaves no window behind: the next admission starts
	// its own (for the token bucket: a full bucket).
	c = check(r, "nora", 3)
	d, tk = e.reserve(s, c)
	e.expect(d, true, 2)
	step := time.Duration(0)
	if e.fake {
		step = 10 * time.Second
		e.wait(step)
	}
	e.settle(s, []ratebudget.Check{c}, tk, []int64{0})
	e.mark()
	d = e.allow(check(r, "nora", 1))
	e.expect(d, true, 4)
	if alg == ratebudget.TokenBucket {
		e.approx("ResetAfter", d.ResetAfter, long/5)
	} else {
		e.approx("ResetAfter", d.ResetAfter, e.full(alg, long))
	}
}

// testSettleLower: settling below the reserved cost gives the difference back.
func testSettleLower(e *env, s Settler, alg ratebudget.Algorithm) {
	r := e.rule("work", alg, 10, long)
	c := check(r, "olga", 6)
	d, tk := e.reserve(s, c)
	e.expect(d, true, 4)
	e.settle(s, []ratebudget.Check{c}, tk, []int64{2})
	e.expect(e.allow(check(r, "olga", 8)), true, 0)
	e.expect(e.allow(check(r, "olga", 1)), false, 0)
	// Settling at the reserved cost changes nothing.
	c = check(r, "pia", 4)
	_, tk = e.reserve(s, c)
	e.settle(s, []ratebudget.Check{c}, tk, []int64{4})
	e.expect(e.allow(check(r, "pia", 6)), true, 0)
	e.expect(e.allow(check(r, "pia", 1)), false, 0)
}

// testSettleHigher: settling above the reserved cost spends the extra at settle time
// without refusing it; the budget is in debt and the next requests wait.
func testSettleHigher(e *env, s Settler, alg ratebudget.Algorithm) {
	r := e.rule("tokens", alg, 5, long)
	c := check(r, "quinn", 1)
	e.mark()
	d, tk := e.reserve(s, c)
	e.expect(d, true, 4)
	step := time.Duration(0)
	if e.fake && alg != ratebudget.TokenBucket {
		step = 10 * time.Second
		e.wait(step)
	}
	e.settle(s, []ratebudget.Check{c}, tk, []int64{8}) // 3 above the limit
	d = e.allow(check(r, "quinn", 1))
	e.expect(d, false, 0)
	switch alg {
	case ratebudget.FixedWindow, ratebudget.Calendar:
		// Refused until the window of the admission (the period) ends.
		e.approx("RetryAfter", d.RetryAfter, e.full(alg, long)-step)
	case ratebudget.RollingWindow:
		// The extra 7 is an event at settle time: the probe waits for it to leave.
		e.approx("RetryAfter", d.RetryAfter, long)
		e.approx("ResetAfter", d.ResetAfter, long)
	case ratebudget.TokenBucket:
		// Level 4 - 7 = -3 tokens: a token needs 4 tokens of refill, at long/5 each.
		e.approx("RetryAfter", d.RetryAfter, 4*long/5)
		e.approx("ResetAfter", d.ResetAfter, 8*long/5)
	}
}

// testSettleBoundedDebt: one settle takes a budget at most one capacity into debt.
func testSettleBoundedDebt(e *env, s Settler, alg ratebudget.Algorithm) {
	if alg == ratebudget.TokenBucket {
		r := e.rule("huge", alg, 5, long)
		c := check(r, "rhea", 1)
		e.mark()
		_, tk := e.reserve(s, c)
		e.settle(s, []ratebudget.Check{c}, tk, []int64{bound.MaxLimit})
		d := e.allow(check(r, "rhea", 1))
		e.expect(d, false, 0)
		// The level stops at -5 tokens: a token needs 6 tokens of refill.
		e.approx("RetryAfter", d.RetryAfter, 6*long/5)
		return
	}
	if alg == ratebudget.Calendar {
		r := e.rule("huge", alg, 5, 0)
		c := check(r, "rhea", 1)
		e.mark()
		_, tk := e.reserve(s, c)
		e.settle(s, []ratebudget.Check{c}, tk, []int64{bound.MaxLimit})
		d := e.allow(check(r, "rhea", 1))
		e.expect(d, false, 0)
		// A period's debt ends with the period.
		e.approx("RetryAfter", d.RetryAfter, e.full(alg, 0))
		if e.fake {
			e.wait(d.RetryAfter)
			e.expect(e.allow(check(r, "rhea", 5)), true, 0)
		}
		return
	}
	e.timed("rhea", func(w time.Duration, id string) bool {
		r := e.rule("huge", alg, 5, w)
		c := check(r, id, 1)
		e.mark()
		_, tk := e.reserve(s, c)
		e.settle(s, []ratebudget.Check{c}, tk, []int64{bound.MaxLimit})
		d := e.allow(check(r, id, 1))
		if !e.fake && !decides(e.since, w) {
			return false // the window may have ended, debt and all
		}
		e.expect(d, false, 0)
		// A window's debt ends with the window.
		e.approx("RetryAfter", d.RetryAfter, w)
		e.wait(d.RetryAfter)
		e.expect(e.allow(check(r, id, 5)), true, 0)
		return true
	})
}

// testSettleLaterWindow: a spend that no longer counts gives nothing back; a token bucket
// never holds more than its capacity.
func testSettleLaterWindow(e *env, s Settler, alg ratebudget.Algorithm) {
	if alg == ratebudget.Calendar && !e.fake {
		e.t.Skip("a calendar period lasts an hour at least; crossed on a driven clock only")
	}
	e.timed("sam", func(w time.Duration, id string) bool {
		r := e.rule("old", alg, 3, w)
		back := w // how long until budget comes back after a spend
		if alg == ratebudget.TokenBucket {
			// A token every 2 windows, so that none refills between two close checks.
			r.Limit, r.Burst, r.Window = 1, 3, 2*w
			back = 2 * w
		}
		c := check(r, id, 3)
		start := time.Now()
		d, tk := e.reserve(s, c)
		e.expect(d, true, 0)
		d = e.allow(check(r, id, 1))
		if !e.fake && !decides(start, back) {
			return false
		}
		e.expect(d, false, 0)
		if alg == ratebudget.TokenBucket {
			e.wait(d.ResetAfter) // full again
		} else {
			e.wait(d.RetryAfter) // the window closed, the event left it
		}
		start = time.Now()
		e.expect(e.allow(check(r, id, 3)), true, 0)
		e.settle(s, []ratebudget.Check{c}, tk, nil)
		if alg == ratebudget.TokenBucket {
			// The tokens came back (the bucket was empty again), but no more than one bucket.
			e.expect(e.allow(check(r, id, 3)), true, 0)
		}
		d = e.allow(check(r, id, 1))
		if !e.fake && !decides(start, back) {
			return false
		}
		e.expect(d, false, 0)
		return true
	})
}

// testSettleNothing: a refused decision's tickets are zero and settle nothing; a decision
// made by Allow has no tickets and keeps its spend.
func testSettleNothing(e *env, s Settler, alg ratebudget.Algorithm) {
	r := e.rule("api", alg, 2, long)
	c := check(r, "tara", 2)
	d, tk := e.reserve(s, c)
	e.expect(d, true, 0)
	d, tk2 := e.reserve(s, c)
	e.expect(d, false, 0)
	e.settle(s, []ratebudget.Check{c}, tk2, nil)
	e.expect(e.allow(check(r, "tara", 1)), false, 0)
	e.settle(s, []ratebudget.Check{c}, tk, []int64{1})
	e.expect(e.allow(check(r, "tara", 1)), true, 0)
}

// testSettleSeveral: one Settle adjusts every check of a decision, each by its own cost.
func testSettleSeveral(e *env, s Settler) {
	checks := []ratebudget.Check{
		check(e.rule("f", ratebudget.FixedWindow, 10, long), "uma", 5),
		check(e.rule("t", ratebudget.TokenBucket, 10, long), "", 5),
		check(e.rule("r", ratebudget.RollingWindow, 10, long), "vic", 5),
	}
	d, tk := e.reserve(s, checks...)
	if !d.Allowed {
		e.t.Fatalf("reserve: %+v", d)
	}
	e.settle(s, checks, tk, []int64{0, 2, 7})
	for i, want := range []int64{10, 8, 3} {
		c := checks[i]
		c.Cost = want
		e.expect(e.allow(c), true, 0)
		c.Cost = 1
		e.expect(e.allow(c), false, 0)
	}
}

func testSettleInvalid(e *env, s Settler) {
	r := e.rule("api", ratebudget.FixedWindow, 5, long)
	c := []ratebudget.Check{check(r, "walt", 2)}
	_, tk := e.reserve(s, c...)
	ctx := context.Background()
	for _, bad := range []struct {
		tickets []ratebudget.Ticket
		costs   []int64
	}{
		{nil, nil},
		{tk, []int64{}},
		{tk, []int64{1, 1}},
		{tk, []int64{-1}},
		{tk, []int64{bound.MaxLimit + 1}},
	} {
		if err := s.Settle(ctx, c, bad.tickets, bad.costs); !IsConfigError(err) {
			e.t.Fatalf("Settle(%v, %v) = %v, want a configuration error", bad.tickets, bad.costs, err)
		}
	}
	if err := s.Settle(ctx, nil, tk, nil); !IsConfigError(err) {
		e.t.Fatalf("Settle without checks = %v, want a configuration error", err)
	}
	if _, err := s.Reserve(ctx, c, nil, nil); !IsConfigError(err) {
		e.t.Fatalf("Reserve without tickets = %v, want a configuration error", err)
	}
	// A reservation that is not admitted, an invalid one included, leaves zero tickets:
	// tickets reused from an earlier decision are never settled twice.
	stale := []ratebudget.Ticket{{At: 7, ID: 7}, {At: 7, ID: 7}}
	for _, bad := range [][]ratebudget.Check{
		{check(r, "walt", 0)},
		{check(r, "walt", 1), check(r, "walt", 1)},
	} {
		tickets := append([]ratebudget.Ticket(nil), stale...)
		if _, err := s.Reserve(ctx, bad, tickets, nil); !IsConfigError(err) {
			e.t.Fatalf("Reserve(%v) = %v, want a configuration error", bad, err)
		}
		for i, tk := range tickets[:len(bad)] {
			if tk != (ratebudget.Ticket{}) {
				e.t.Fatalf("Reserve(%v) failed and left ticket %d as %+v, want it zero", bad, i, tk)
			}
		}
	}
	// The invalid calls settled nothing.
	e.expect(e.allow(check(r, "walt", 3)), true, 0)
}

func leaseRule(name string, limit int64, ttl time.Duration) ratebudget.Rule {
	return rule(name, ratebudget.InFlight, limit, ttl)
}

// testInFlightLimit: at most Limit leases at once; settling releases one, whatever the
// cost it is settled at.
func testInFlightLimit(e *env, s Settler) {
	r := leaseRule("running", 2, long)
	c := []ratebudget.Check{check(r, "xena", 1)}
	e.mark()
	d, first := e.reserve(s, c...)
	e.expect(d, true, 1)
	if d.Limit != 2 || d.Index != 0 {
		e.t.Fatalf("admission %+v: want Limit 2 of check 0", d)
	}
	e.approx("ResetAfter", d.ResetAfter, long)
	d, second := e.reserve(s, c...)
	e.expect(d, true, 0)
	d, _ = e.reserve(s, c...)
	e.expect(d, false, 0)
	// Until a holder releases, the wait is bounded by the oldest lease's expiry.
	e.approx("RetryAfter", d.RetryAfter, long)
	e.approx("ResetAfter", d.ResetAfter, long)
	e.settle(s, c, first, []int64{1})
	d, third := e.reserve(s, c...)
	e.expect(d, true, 0)
	e.settle(s, c, second, nil)
	e.settle(s, c, third, []int64{5})
	e.expect(e.allow(c...), true, 1) // a plain Allow holds its lease until it expires
	e.expect(e.allow(c...), true, 0)
	e.expect(e.allow(c...), false, 0)
}

// testInFlightExpiry: a lease never released (its holder crashed, or Allow took it)
// expires after the rule's Window.
func testInFlightExpiry(e *env, s Settler) {
	e.timed("yara", func(w time.Duration, id string) bool {
		c := check(leaseRule("crashed", 1, w), id, 1)
		e.mark()
		d, _ := e.reserve(s, c)
		e.expect(d, true, 0)
		d = e.allow(c)
		if !e.fake && !decides(e.since, w) {
			return false // the lease may have expired already
		}
		e.expect(d, false, 0)
		e.approx("RetryAfter", d.RetryAfter, w)
		if e.fake {
			e.wait(d.RetryAfter - time.Millisecond)
			e.expect(e.allow(c), false, 0)
			e.wait(time.Millisecond)
		} else {
			e.wait(d.RetryAfter)
		}
		e.expect(e.allow(c), true, 0)
		return true
	})
}

// testInFlightRenew: a renewed lease lives Window from its renewal; a lease that expired
// is reported lost and not taken again.
func testInFlightRenew(e *env, s Settler) {
	e.timed("zoe", func(w time.Duration, id string) bool {
		c := []ratebudget.Check{check(leaseRule("long", 1, w), id, 1)}
		start := time.Now()
		_, tk := e.reserve(s, c...)
		reserved := time.Now() // the lease expires Window after a time before this
		e.wait(w / 2)
		renewed := time.Now()
		err := s.Renew(context.Background(), c, tk)
		if !e.fake && !decides(start, w) {
			return false // the renewal may have come after the expiry
		}
		if err != nil {
			e.t.Fatalf("Renew: %v", err)
		}
		if e.fake {
			e.wait(w/2 + w/4) // past the first expiry, before the renewed one
		} else {
			e.wait(time.Until(reserved.Add(w)))
		}
		d := e.allow(c...)
		if !e.fake && !decides(renewed, w) {
			return false // the renewed lease may have expired too
		}
		e.expect(d, false, 0)
		e.wait(d.RetryAfter)
		if err := s.Renew(context.Background(), c, tk); !errors.Is(err, ratebudget.ErrLeaseLost) {
			e.t.Fatalf("Renew of an expired lease = %v, want ErrLeaseLost", err)
		}
		taken := time.Now()
		e.expect(e.allow(c...), true, 0) // the lease was not renewed: this one takes its slot
		d = e.allow(c...)
		if !e.fake && !decides(taken, w) {
			return false
		}
		e.expect(d, false, 0) // and the expired one was not taken again
		return true
	})
}

// testInFlightAllOrNothing: a lease is taken only when every rule of the request admits,
// and a refusal by a full in-flight rule spends nothing of the others.
func testInFlightAllOrNothing(e *env, s Settler) {
	lease := check(leaseRule("slots", 1, long), "ada", 1)
	rate := check(e.rule("rate", ratebudget.FixedWindow, 2, long), "ada", 1)
	both := []ratebudget.Check{lease, rate}
	d, tk := e.reserve(s, both...)
	if !d.Allowed {
		e.t.Fatalf("first: %+v", d)
	}
	d, _ = e.reserve(s, both...)
	if d.Allowed || d.Rule != "slots" {
		e.t.Fatalf("second while the slot is held: %+v, want refused by slots", d)
	}
	e.settle(s, both, tk, []int64{1, 1}) // the rate spend stays, the lease goes
	d, tk = e.reserve(s, both...)
	if !d.Allowed {
		e.t.Fatalf("after release: %+v", d)
	}
	e.settle(s, both, tk, []int64{1, 1})
	d, _ = e.reserve(s, both...)
	if d.Allowed || d.Rule != "rate" {
		e.t.Fatalf("rate spent: %+v, want refused by rate", d)
	}
	e.expect(e.allow(lease), true, 0) // the refused request took no lease
}

// testInFlightConcurrency: concurrent requests hold at most Limit leases.
func testInFlightConcurrency(e *env, s Settler) {
	const workers, limit = 32, 5
	c := []ratebudget.Check{check(leaseRule("slots", limit, long), "bea", 1)}
	for round := range 2 {
		start := make(chan struct{})
		var mu sync.Mutex
		var held [][]ratebudget.Ticket
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				tk := make([]ratebudget.Ticket, 1)
				d, err := s.Reserve(context.Background(), c, tk, nil)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					mu.Lock()
					held = append(held, tk)
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			e.t.Fatal(err)
		}
		if len(held) != limit {
			e.t.Fatalf("round %d: %d goroutines took %d leases, want exactly %d", round, workers, len(held), limit)
		}
		for _, tk := range held {
			e.settle(s, c, tk, nil)
		}
	}
}

func testInFlightCost(e *env, s Settler) {
	c := []ratebudget.Check{check(leaseRule("slots", 5, long), "cleo", 2)}
	if _, err := s.Reserve(context.Background(), c, make([]ratebudget.Ticket, 1), nil); !IsConfigError(err) {
		e.t.Fatalf("Reserve with cost 2 = %v, want a configuration error", err)
	}
	if _, err := e.h.Limiter.Allow(context.Background(), c); !IsConfigError(err) {
		e.t.Fatalf("Allow with cost 2 = %v, want a configuration error", err)
	}
}
