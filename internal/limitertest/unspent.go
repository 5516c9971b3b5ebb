package limitertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// runUnspent runs testRefusalReportsUnspent for every time rule (in-flight leases only
// for a limiter that implements [Settler], as the other in-flight cases).
func runUnspent(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow, ratebudget.InFlight, ratebudget.Calendar} {
		t.Run(algname.Of(alg)+"/RefusalReportsUnspent", func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newHarness(t))
			if _, ok := e.h.Limiter.(Reporter); !ok {
				t.Skip("the limiter reports the decision's rule only")
			}
			if _, ok := e.h.Limiter.(Settler); !ok && alg == ratebudget.InFlight {
				t.Skip("the limiter does not implement Settler")
			}
			testRefusalReportsUnspent(e, alg)
		})
	}
}

// testRefusalReportsUnspent: in a decision refused by another check, a check that alone
// would have been admitted is reported Allowed, with its budget as it is after the
// decision, which spent nothing: an untouched budget whole (ResetAfter 0), a used one
// with the units and the reset of what was spent before (a fixed window's end, a token
// bucket's time to refill its deficit, a rolling window's newest event leaving, the
// newest lease expiring), not as if the refused request had spent. That is also what a
// read of the budget right after reports: a decision Exceeded (which spends nothing) or,
// for leases, a refusal by a lower Limit of the same budget; and a fresh decision then
// admits with that many units less its cost. Both orders (the refusing check first or
// last) and both one identity (one step in Redis) and two (slot by slot, with a refund
// of the earlier slot, or a decide-only call of the later one), through AllowEach and
// Reserve.
func testRefusalReportsUnspent(e *env, alg ratebudget.Algorithm) {
	reporter := e.h.Limiter.(Reporter)
	settler, _ := e.h.Limiter.(Settler)
	ctx := context.Background()
	limit, cost := int64(10), int64(2)
	if alg == ratebudget.InFlight {
		limit, cost = 3, 1
	}
	for _, several := range []bool{false, true} {
		idB := "uma"
		if several {
			idB = "" // a service-wide rule next to a per-identity one: another slot
		}
		a := e.rule(fmt.Sprintf("unspent-%v", several), alg, limit, long)
		// What the budget is first spent with: for leases the same budget with a shorter
		// TTL, so that its lease expires well before one the refused request would take.
		spend := a
		if alg == ratebudget.InFlight {
			spend.Window = long / 2
		}
		full := e.rule(fmt.Sprintf("full-%v", several), ratebudget.FixedWindow, 1, long)
		e.expect(e.allow(check(full, idB, 1)), true, 0)
		ca, cb := check(a, "uma", cost), check(full, idB, 1)
		orders := [][]ratebudget.Check{{ca, cb}, {cb, ca}}

		// refused decides each order, through AllowEach and Reserve, and returns a's
		// outcome, which every call must report alike.
		refused := func(what string) ratebudget.Outcome {
			e.t.Helper()
			var first ratebudget.Outcome
			n := 0
			for _, checks := range orders {
				at := 0
				if checks[1] == ca {
					at = 1
				}
				for _, reserve := range []bool{false, true} {
					if reserve && settler == nil {
						continue
					}
					outs := make([]ratebudget.Outcome, 2)
					var d ratebudget.Decision
					var err error
					if reserve {
						tickets := make([]ratebudget.Ticket, 2)
						d, err = settler.Reserve(ctx, checks, tickets, outs)
						if err == nil && (tickets[0] != (ratebudget.Ticket{}) || tickets[1] != (ratebudget.Ticket{})) {
							e.t.Fatalf("%s: refused Reserve left tickets %+v", what, tickets)
						}
					} else {
						d, err = reporter.AllowEach(ctx, checks, outs)
					}
					if err != nil {
						e.t.Fatalf("%s: %v", what, err)
					}
					if d.Allowed || d.Index != 1-at || outs[1-at].Allowed || outs[1-at].Remaining != 0 {
						e.t.Fatalf("%s (several identities %v, reserve %v, %v first): %+v, outcomes %+v; want refused by %s",
							what, several, reserve, checks[0].Rule.Name, d, outs, full.Name)
					}
					o := outs[at]
					if !o.Allowed || o.Exceeded || o.RetryAfter != 0 {
						e.t.Fatalf("%s (several identities %v, reserve %v, %v first): %s's outcome %+v, want admitted alone",
							what, several, reserve, checks[0].Rule.Name, a.Name, o)
					}
					if n == 0 {
						first = o
					} else if o.Remaining != first.Remaining || o.ResetAfter > first.ResetAfter || o.ResetAfter < first.ResetAfter-e.slack() {
						e.t.Fatalf("%s (several identities %v, reserve %v, %v first): %s's outcome %+v, want the first call's %+v",
							what, several, reserve, checks[0].Rule.Name, a.Name, o, first)
					}
					n++
				}
			}
			return first
		}

		// Untouched: whole, nothing to reset.
		e.mark()
		if o := refused("untouched"); o.Remaining != limit || o.ResetAfter != 0 {
			e.t.Fatalf("untouched (several identities %v): %s's outcome %+v in a refused decision, want Remaining %d and ResetAfter 0",
				several, a.Name, o, limit)
		}
		// A fresh decision admits, with the cost taken off what was reported.
		e.mark()
		d := e.allow(check(spend, "uma", cost))
		e.expect(d, true, limit-cost)
		// The reset right after that spend, and a pause so that a later spend would show.
		reset := e.full(alg, long) // a fixed window opened now, a rolling-window event of now, the period's end
		switch alg {
		case ratebudget.TokenBucket:
			reset = time.Duration(cost) * long / time.Duration(limit) // the deficit's refill
		case ratebudget.InFlight:
			reset = spend.Window
		}
		e.approx("ResetAfter of the spend", d.ResetAfter, reset)
		pause := 20 * time.Millisecond
		if e.fake {
			pause = long / 100 // a token bucket refills a tenth of a unit
		}
		e.wait(pause)

		// Used: the budget as that spend left it, aged by the pause.
		asked := time.Now()
		o := refused("used")
		if o.Remaining != limit-cost {
			e.t.Fatalf("used (several identities %v): %s's outcome %+v in a refused decision, want Remaining %d, its cost unspent",
				several, a.Name, o, limit-cost)
		}
		e.approx(fmt.Sprintf("used (several identities %v): ResetAfter of %s in a refused decision (%+v)", several, a.Name, o), o.ResetAfter, reset-pause)

		// A read right after reports the same.
		var read ratebudget.Outcome
		if alg == ratebudget.InFlight {
			// One lease is held: a Limit of 1 refuses, and reports when it expires.
			one := a
			one.Limit = 1
			rd := e.each(check(one, "uma", 1))
			if rd.Allowed || rd.Exceeded {
				e.t.Fatalf("read with Limit 1: %+v, want refused", rd)
			}
			read = ratebudget.Outcome{Remaining: limit - 1, ResetAfter: rd.ResetAfter}
		} else {
			rd := e.each(check(a, "uma", timerule.Capacity(&a)+1))
			if !rd.Exceeded {
				e.t.Fatalf("read with a cost above the capacity: %+v, want Exceeded", rd)
			}
			read = ratebudget.Outcome{Remaining: rd.Remaining, ResetAfter: rd.ResetAfter}
		}
		slack := time.Since(asked) + 2*time.Millisecond // the server counts whole ms
		if e.fake {
			slack = 0
		}
		if read.Remaining != o.Remaining || read.ResetAfter > o.ResetAfter || read.ResetAfter < o.ResetAfter-slack {
			e.t.Fatalf("used (several identities %v): a read right after reports Remaining %d, ResetAfter %v; the refused decision %+v",
				several, read.Remaining, read.ResetAfter, o)
		}
		e.expect(e.allow(ca), true, o.Remaining-cost)
	}
}

// each decides checks through AllowEach and returns the outcome of the last check.
func (e *env) each(checks ...ratebudget.Check) ratebudget.Outcome {
	e.t.Helper()
	outs := make([]ratebudget.Outcome, len(checks))
	if _, err := e.h.Limiter.(Reporter).AllowEach(context.Background(), checks, outs); err != nil {
		e.t.Fatalf("AllowEach(%v): %v", checks, err)
	}
	return outs[len(outs)-1]
}
