package ratebudget

import (
	"context"
	"errors"
	"strconv"
)

// Settler is implemented by limiters whose admissions can be settled once the admitted
// work is done: given back in full (cancelled), or charged at its actual cost, and whose
// [InFlight] leases are released then (or renewed while the work runs). It is the shape
// of x/time/rate's Reservation and Cancel, for decisions of several checks: Reserve
// decides as Allow does and records in one [Ticket] per check where the spend landed;
// Settle, given the same checks and the tickets, adjusts each check's spend to its actual
// cost; Renew extends the leases of work that runs long.
//
// Settling check i, which reserved c = checks[i].Cost units, at a = costs[i] units:
//
//   - a == c changes nothing (but releases an InFlight lease).
//   - a < c gives c-a units back to the spend the admission made, while that spend still
//     counts (its fixed window is open, its rolling-window event is in the window; a
//     token bucket, up to its capacity). A refund never creates budget in a later window.
//     a == 0 cancels: the budget is as if the check had not been admitted.
//   - a > c spends the a-c extra units at settle time without refusing them: the budget
//     goes into debt, of at most one capacity, and the next requests are refused until it
//     has recovered.
//   - For an InFlight rule any a releases the lease: the work is over.
//
// A limiter may give back less than that where it documents why (the Redis limiter gives
// a rolling-window event back only while it is the budget's newest): an over-count, never
// an under-count. What each time rule does in each case, and how exact each limiter of
// this module is: docs/SETTLING.md.
//
// Settle clears the tickets it settles, so settling twice changes nothing more; a zero
// Ticket is never settled. Each check's adjustment is atomic with the others' where the
// limiter can make it so (see the implementation). Tickets are the issuing limiter's:
// pass them back unchanged to the same limiter, and never take them from clients. A
// decision that is never settled keeps its spend, and its leases expire after their
// rule's Window.
//
// Implementations must be safe for concurrent use. Settle and Renew return a
// *[ConfigError] for invalid arguments, Renew [ErrLeaseLost] for a lease that had
// expired, and otherwise only store failures ([StoreError]).
type Settler interface {
	Limiter
	// Reserve decides as Allow does. When it admits, tickets[i] records check i's spend;
	// otherwise (a refusal, an error) every ticket is set to zero. tickets must hold at
	// least len(checks) entries. outcomes is nil, or has len(checks) elements and
	// receives each check's outcome as [Reporter.AllowEach] sets them. Neither slice is
	// retained.
	Reserve(ctx context.Context, checks []Check, tickets []Ticket, outcomes []Outcome) (Decision, error)
	// Settle adjusts the spend of a decision admitted by Reserve to the actual costs:
	// checks are those given to Reserve, in the same order; costs[i] (0 to 2^40) is
	// check i's actual cost, and nil costs cancel every check.
	Settle(ctx context.Context, checks []Check, tickets []Ticket, costs []int64) error
	// Renew extends every InFlight lease of a decision admitted by Reserve to its rule's
	// Window from now; other checks are left alone. It reports [ErrLeaseLost] when a
	// lease had already expired (its slot may have been taken since: it is not taken
	// again); the others are renewed.
	Renew(ctx context.Context, checks []Check, tickets []Ticket) error
}

// Ticket records where one admitted check's spend landed (the window, the rolling-window
// event, the lease), so that settling it adjusts exactly that spend (see [Settler]). The
// zero Ticket records nothing: settling it changes nothing.
type Ticket struct {
	// At and ID are the issuing limiter's record of the spend (docs/SETTLING.md lists
	// what each limiter of this module keeps there). Callers only store and pass them
	// back.
	At, ID int64
	// Reservation is the issuing limiter's name for the decision the ticket belongs to,
	// the same in each of its tickets, or 0. The Redis limiter draws one per reservation,
	// so that a settle re-sent after a failure applies at most once; the in-process one
	// (package memory) leaves it 0.
	Reservation int64
}

// ErrLeaseLost is reported by [Settler.Renew] when an [InFlight] lease had expired before
// it was renewed.
var ErrLeaseLost = errors.New("ratebudget: in-flight lease expired before it was renewed")

// ValidateSettle checks a [Settler.Settle] or [Settler.Renew] call's arguments (costs
// nil for Renew or a cancel): the checks as [ValidateChecks] does, at least one ticket per
// check, and one cost per check in 0..2^40. It returns a *[ConfigError] naming the
// field at fault.
func ValidateSettle(checks []Check, tickets []Ticket, costs []int64) error {
	if err := ValidateChecks(checks); err != nil {
		return err
	}
	if len(tickets) < len(checks) {
		return &ConfigError{Field: "tickets", Problem: "has " + strconv.Itoa(len(tickets)) + " entries for " + strconv.Itoa(len(checks)) + " checks"}
	}
	if costs == nil {
		return nil
	}
	if len(costs) != len(checks) {
		return &ConfigError{Field: "costs", Problem: "has " + strconv.Itoa(len(costs)) + " entries for " + strconv.Itoa(len(checks)) + " checks"}
	}
	for i, a := range costs {
		if a < 0 || a > maxLimit {
			return &ConfigError{Rule: checks[i].Rule.Name, Field: "costs", Problem: "must be in 0..1099511627776, got " + strconv.FormatInt(a, 10)}
		}
	}
	return nil
}
