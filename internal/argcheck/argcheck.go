// Package argcheck checks the arguments of a limiter's methods that package ratebudget's
// validation does not cover, with the same errors in every limiter.
package argcheck

import "github.com/ratebudget/ratebudget"

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
