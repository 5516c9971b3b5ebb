// Package argcheck checks the arguments of a limiter's methods that package ratebudget's
// validation does not cover, with the same errors in every limiter.
package argcheck

import (
	"strconv"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// Outcomes returns nil when an outcomes slice of n elements fits checks checks (one
// element per check), else a *[ratebudget.ConfigError] naming the field "outcomes".
func Outcomes(checks, n int) error {
	if n == checks {
		return nil
	}
	return &ratebudget.ConfigError{Field: "outcomes", Problem: "must have one element per check"}
}

// Reset returns nil when checks may be reset (a limiter's Reset): at least one check,
// each of a valid rule; else the *[ratebudget.ConfigError] of the first problem.
func Reset(checks []ratebudget.Check) error {
	if len(checks) == 0 {
		return &ratebudget.ConfigError{Field: "checks", Problem: "must not be empty"}
	}
	for i := range checks {
		if err := checks[i].Rule.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Settle returns nil when the arguments of a limiter's Settle or Renew (costs nil for
// Renew or a cancel) are valid: the checks as [ratebudget.ValidateChecks] accepts them,
// at least one ticket per check, and one cost per check in 0..2^40. Otherwise it returns
// a *[ratebudget.ConfigError] naming the field at fault.
func Settle(checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error {
	if err := ratebudget.ValidateChecks(checks); err != nil {
		return err
	}
	if len(tickets) < len(checks) {
		return &ratebudget.ConfigError{Field: "tickets", Problem: "has " + strconv.Itoa(len(tickets)) + " entries for " + strconv.Itoa(len(checks)) + " checks"}
	}
	if costs == nil {
		return nil
	}
	if len(costs) != len(checks) {
		return &ratebudget.ConfigError{Field: "costs", Problem: "has " + strconv.Itoa(len(costs)) + " entries for " + strconv.Itoa(len(checks)) + " checks"}
	}
	for i, a := range costs {
		if a < 0 || a > bound.MaxLimit {
			return &ratebudget.ConfigError{Rule: checks[i].Rule.Name, Field: "costs", Problem: "must be in 0..1099511627776, got " + strconv.FormatInt(a, 10)}
		}
	}
	return nil
}
