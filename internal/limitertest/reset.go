package limitertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
)

// Resetter is a limiter whose budgets an operator can reset, as those of packages memory
// and lua are; Reset's contract is "Resetting a budget" in the [ratebudget] package
// documentation.
type Resetter interface {
	ratebudget.Limiter
	Reset(ctx context.Context, checks ...ratebudget.Check) error
}

// runReset runs the cases of [Resetter]; each skips for a limiter that does
// not implement it.
func runReset(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, alg := range algorithms {
		t.Run("reset/"+algname.Of(alg), func(t *testing.T) {
			t.Parallel()
			e, r := resetterEnv(t, newHarness)
			testResetSpent(e, r, alg)
		})
		t.Run("reset/SettleAfterReset/"+algname.Of(alg), func(t *testing.T) {
			t.Parallel()
			e, r := resetterEnv(t, newHarness)
			testResetThenSettle(e, r, alg)
		})
	}
	cases := []struct {
		name string
		fn   func(e *env, r Resetter)
	}{
		{"reset/InFlight", testResetInFlight},
		{"reset/SeveralBudgets", testResetSeveral},
		{"reset/Untouched", testResetUntouched},
		{"reset/InvalidArguments", testResetInvalid},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, r := resetterEnv(t, newHarness)
			tt.fn(e, r)
		})
	}
}

func resetterEnv(t *testing.T, newHarness func(t *testing.T) Harness) (*env, Resetter) {
	h := newHarness(t)
	r, ok := h.Limiter.(Resetter)
	if !ok {
		t.Skipf("%T has no Reset method", h.Limiter)
	}
	return newEnv(t, h), r
}

func (e *env) reset(r Resetter, checks ...ratebudget.Check) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Reset(ctx, checks...); err != nil {
		e.t.Fatalf("Reset(%v): %v", checks, err)
	}
}

// testResetSpent: a budget spent to refusal, and refused twice (so that a limiter that
// caches refusals holds this one), is reset: its next request is admitted with the full
// limit, and it admits exactly its limit again. Another identity's budget of the same
// rule, and the same identity's budget in another scope, keep what they spent.
func testResetSpent(e *env, r Resetter, alg ratebudget.Algorithm) {
	ru := e.rule("api", alg, 5, long)
	c := check(ru, "olga", 1)
	other := check(ru, "pam", 1)
	scoped := ratebudget.Check{Rule: ru, Identity: "olga", Scope: "/x", Cost: 1}
	for range 5 {
		e.allow(c)
	}
	e.expect(e.allow(other), true, 4)
	e.expect(e.allow(scoped), true, 4)
	e.expect(e.allow(c), false, 0)
	e.expect(e.allow(c), false, 0)
	e.reset(r, ratebudget.Check{Rule: ru, Identity: "olga"}) // Cost is not needed
	e.mark()
	d := e.allow(c)
	e.expect(d, true, 4)
	if alg == ratebudget.TokenBucket {
		e.approx("ResetAfter", d.ResetAfter, long/5) // one token to refill
	} else {
		e.approx("ResetAfter", d.ResetAfter, e.full(alg, long)) // a window of its own, or the period's end
	}
	for i := int64(3); i >= 0; i-- {
		e.expect(e.allow(c), true, i)
	}
	e.expect(e.allow(c), false, 0)
	e.expect(e.allow(other), true, 3)
	e.expect(e.allow(scoped), true, 3)
}

// testResetInFlight: a reset forgets a budget's leases: new ones are admitted up to the
// limit, releasing a lease taken before the reset frees nothing, and renewing one
// reports ErrLeaseLost. Without Settler, leases are taken by Allow.
func testResetInFlight(e *env, r Resetter) {
	ru := leaseRule("running", 2, long)
	c := check(ru, "quinn", 1)
	s, settles := r.(Settler)
	var old []ratebudget.Ticket
	if settles {
		var d ratebudget.Decision
		d, old = e.reserve(s, c)
		e.expect(d, true, 1)
	} else {
		e.expect(e.allow(c), true, 1)
	}
	e.expect(e.allow(c), true, 0)
	e.expect(e.allow(c), false, 0)
	e.reset(r, c)
	e.expect(e.allow(c), true, 1)
	if settles {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Renew(ctx, []ratebudget.Check{c}, old); !errors.Is(err, ratebudget.ErrLeaseLost) {
			e.t.Fatalf("Renew of a lease taken before the reset: %v, want ErrLeaseLost", err)
		}
		e.settle(s, []ratebudget.Check{c}, old, nil) // releases nothing of the new budget
	}
	e.expect(e.allow(c), true, 0)
	e.expect(e.allow(c), false, 0)
}

// testResetThenSettle: a reservation made before a reset and cancelled after it gives
// nothing back to the new budget, but under a token bucket, which records no spends, and
// a calendar rule, whose period is the same: there it refills the budget, to its
// capacity and never above. The new budget's first
// spend comes a few ms after the reservation's (see Resetter).
func testResetThenSettle(e *env, r Resetter, alg ratebudget.Algorithm) {
	s, ok := r.(Settler)
	if !ok {
		e.t.Skipf("%T does not implement Settler", r)
	}
	ru := e.rule("api", alg, 5, long)
	c := check(ru, "wes", 2)
	d, tk := e.reserve(s, c)
	e.expect(d, true, 3)
	e.expect(e.allow(check(ru, "wes", 3)), true, 0)
	e.wait(2 * time.Millisecond)
	e.reset(r, c)
	e.expect(e.allow(check(ru, "wes", 1)), true, 4)
	e.settle(s, []ratebudget.Check{c}, tk, nil)
	want := int64(3) // the cancel gave nothing back
	if alg == ratebudget.TokenBucket || alg == ratebudget.Calendar {
		// refilled to its capacity of 5, then 1 spent; a calendar budget's period is the
		// one the reservation spent in, so its give-back lands, never above the limit
		want = 4
	}
	e.expect(e.allow(check(ru, "wes", 1)), true, want)
}

// testResetSeveral: one call resets the budgets of several checks, of several rules and
// identities (several hash slots on Redis), and only those.
func testResetSeveral(e *env, r Resetter) {
	fixed := rule("fixed", ratebudget.FixedWindow, 2, long)
	token := rule("token", ratebudget.TokenBucket, 2, long)
	checks := []ratebudget.Check{check(fixed, "rita", 1), check(token, "sam", 1), check(fixed, "tess", 1)}
	for _, c := range checks {
		e.allow(c)
		e.expect(e.allow(c), true, 0)
	}
	e.reset(r, checks[0], checks[1])
	e.expect(e.allow(checks[0]), true, 1)
	e.expect(e.allow(checks[1]), true, 1)
	e.expect(e.allow(checks[2]), false, 0)
}

// testResetUntouched: resetting a budget that holds nothing changes nothing.
func testResetUntouched(e *env, r Resetter) {
	c := check(rule("api", ratebudget.RollingWindow, 3, long), "uma", 1)
	e.reset(r, c)
	e.expect(e.allow(c), true, 2)
}

// testResetInvalid: no checks, or an invalid rule, is a *ConfigError, and nothing is
// reset, not even a valid check's budget named with it.
func testResetInvalid(e *env, r Resetter) {
	ctx := context.Background()
	WantConfigError(e.t, r.Reset(ctx), "", "checks")
	good := check(rule("api", ratebudget.FixedWindow, 1, long), "vera", 1)
	e.expect(e.allow(good), true, 0)
	bad := check(rule("api", ratebudget.FixedWindow, 0, long), "vera", 1)
	WantConfigError(e.t, r.Reset(ctx, good, bad), "api", "Limit")
	e.expect(e.allow(good), false, 0)
}
