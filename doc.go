// Package ratebudget is the vocabulary of the ratebudget rate limiter: rules, checks,
// decisions, outcomes, tickets, the [Limiter] interface and their errors. It holds no
// limiter. The two limiters are packages of their own, read
// alike:
//
//	lim, err := memory.New()    // package memory: in process, exact for one process
//	lim, err := lua.New(rdb)    // package lua: on Redis, one budget shared by every replica
//
// The HTTP middleware lives in package middleware, the client-identity extractors in
// keyfuncs and the response headers in headers. A user of those needs this package for
// [Rule] and the errors; the helpers under "Implementing a Limiter" are for a limiter of
// another store.
//
// A rate limit is a budget of admitted work with four parts, stated before anything is
// counted:
//
//   - unit: what one admission costs ([Check.Cost]: 1 per request, an estimated work cost, or bytes);
//   - identity: whose budget ([Check.Identity]: a client IP prefix, an account, "" nobody = service-wide);
//   - scope: where it applies ([Check.Scope], and the [Rule.Name], which names one budget that
//     every route using the rule shares);
//   - time rule: [FixedWindow], [TokenBucket], [RollingWindow], [InFlight] or [Calendar] ([Rule.Algorithm]).
//
// A [Limiter] decides all checks of one request in one step, all-or-nothing: if any rule
// refuses, no rule is charged. A refusal spends nothing and moves no deadline. The
// remaining budget reported in a [Decision] is a snapshot, never a reservation.
//
// Both limiters also let an admitted decision be settled once the work is done
// ("Settling a decision" below): cancelled (given back in full), or charged at its
// actual cost, which may be lower than the cost reserved (given back) or higher (the
// budget goes into debt).
//
// # Time rules
//
// All times are whole milliseconds.
//
// [FixedWindow] (anchored at first arrival): the first admitted request of an idle key
// opens a window of [Rule.Window]; a request is admitted when count+cost <= Limit; the
// window closes Window after it opened, and the next admission starts a new window at
// cost. A refusal neither counts nor extends the window. Bursts of up to 2×Limit are
// possible across a window boundary.
//
// [TokenBucket]: a bucket of capacity Burst (default Limit) refilled continuously at
// Limit tokens per Window, starting full. A request is admitted when the bucket holds at
// least cost tokens, and takes them. Stored credit can be spent at once: the bucket does
// not pace departures. Refill arithmetic is exact (integer, no floating point).
//
// [RollingWindow]: the sum of the costs admitted in the last Window (the interval
// (now-Window, now]) plus cost must not exceed Limit. Exact, at the price of one stored
// event per millisecond with an admission (admissions of one millisecond are merged).
//
// [InFlight]: at most Limit admitted requests running at once. Each admission holds a
// lease until its decision is settled (Settle, "Settling a decision" below) or until
// Window (the lease's time to live) has passed since it was taken or renewed (Renew); a
// lease taken by Allow, which returns no ticket, is held until it expires.
//
// [Calendar]: at most Limit per calendar period ([Rule.Period]: hour, day, week, month or
// year) of a named time zone ([Rule.Location], UTC when nil): a daily quota resets at the
// zone's midnight, 23 or 25 hours apart on the days its clocks change, a monthly one at
// midnight of the 1st. A request is admitted when count+cost <= Limit in the period that
// contains the current instant; a request of a later period starts from 0. Reset and
// RetryAfter are the time to the period's end. On Redis the period is the one that
// contains the server's clock (docs/CALENDAR.md).
//
// When the clock goes back, stored state keeps its later time: a fixed window keeps its
// end, rolling-window events keep their times, a token bucket refills nothing until the
// clock passes its timestamp again, and leases keep their expiry (a lease taken or
// renewed then expires Window from the current reading). Every reported wait
// (ResetAfter, RetryAfter) is measured from the current clock and includes that lag.
//
// # Reporting every check
//
// The limiters of packages memory and lua report every check's outcome, not only the
// reported rule's, with a method AllowEach; code that holds a [Limiter] declares the
// interface where it needs it (package middleware does, to list every rule in the
// RateLimit header field):
//
//	type reporter interface {
//		AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
//	}
//
// AllowEach decides as Allow does; when it returns no error it has set outcomes[i] to
// checks[i]'s outcome (len(outcomes) must equal len(checks)). On an error the outcomes
// are undefined. It is safe for concurrent use, as Allow is.
//
// Each outcome describes its budget as it is right after the decision. When the decision
// admits, that is after the spend. When it refuses, nothing was spent, and so an outcome
// reports its budget as it was: a check that alone would have been admitted keeps
// Allowed true (it fits; another check refused), with Remaining the units left before
// its cost and ResetAfter the reset of what was spent before: zero for an untouched
// budget, the end of the open fixed window, the time a token bucket takes to refill its
// current deficit, the time until a rolling window's newest event leaves it, the time
// until the last lease expires. That is what a decision that spends nothing (an
// Exceeded one, say) reports for the budget at the same moment.
//
// # Settling a decision
//
// The limiters of packages memory and lua let an admission be settled once the admitted
// work is done: given back in full (cancelled), or charged at its actual cost, its
// [InFlight] leases released then (or renewed while the work runs). It is the shape of
// x/time/rate's Reservation and Cancel, for decisions of several checks; code that
// settles declares the interface where it needs it:
//
//	type settler interface {
//		ratebudget.Limiter
//		Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
//		Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error
//		Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error
//	}
//
// Reserve decides as Allow does. When it admits, tickets[i] records where check i's
// spend landed (a [Ticket]); otherwise (a refusal, an error) every ticket is set to zero.
// tickets must hold at least len(checks) entries. outcomes is nil, or has len(checks)
// elements and receives each check's outcome as AllowEach sets them. Neither slice is
// retained.
//
// Settle adjusts the spend of a decision admitted by Reserve to the actual costs: checks
// are those given to Reserve, in the same order; costs[i] (0 to 2^40) is check i's
// actual cost, and nil costs cancel every check. Settling check i, which reserved
// c = checks[i].Cost units, at a = costs[i] units:
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
// Renew extends every InFlight lease of a decision admitted by Reserve to its rule's
// Window from now; other checks are left alone. It reports [ErrLeaseLost] when a lease
// had already expired (its slot may have been taken since: it is not taken again); the
// others are renewed.
//
// Reserve, Settle and Renew are safe for concurrent use. Settle and Renew return a
// *[ConfigError] for invalid arguments (the checks as [ValidateChecks] refuses them,
// fewer tickets than checks, costs not one per check in 0..2^40), Renew [ErrLeaseLost],
// and otherwise only store failures ([StoreError]).
//
// # Resetting a budget
//
// The limiters of packages memory and lua let an operator reset budgets, with a method
// Reset(ctx context.Context, checks ...Check) error; code that holds a [Limiter] and
// resets declares the interface where it needs it:
//
//	type resetter interface {
//		Reset(ctx context.Context, checks ...ratebudget.Check) error
//	}
//
// Reset forgets the state of each check's budget: the budget that its rule's Name and
// Algorithm, its Identity and its Scope name, whatever the rule's other fields (Cost is
// ignored). The budget's next decision is then made as on a budget never spent: a fixed
// window opens anew, a token bucket is full, a rolling window holds no events, and an
// [InFlight] rule holds no lease (the leases given out before are forgotten: renewing
// one reports [ErrLeaseLost], releasing one changes nothing). A decision admitted
// before the reset and settled after it gives back nothing to the new budget (its spend
// no longer counts), unless the new budget's first spend came in the same millisecond
// as that decision's (a fixed window, or a rolling-window event, of that millisecond):
// then up to its refund may be given to the new budget. A token bucket keeps no record
// of spends, and a [Calendar] budget's period is the one the decision spent in: there a
// refund may refill the budget, never above its capacity.
//
// A limiter that caches refusals in the calling process drops them for the budgets
// reset; another process's limiter may repeat a refusal it cached before the reset for
// as long as it documents (the Redis limiter: at most 1s). Resetting a budget that holds
// no state changes nothing.
//
// Reset is safe for concurrent use: a decision of a budget that runs while it is reset
// is decided either before or after the reset. Checks that are none, or whose rules are
// invalid, are a *[ConfigError] and nothing is reset; any other error is a store
// failure ([StoreError]), after which the budgets may or may not have been reset.
//
// # Implementing a Limiter
//
// A limiter of another store uses three helpers, so that it accepts, refuses and reports
// exactly as packages memory and lua do:
//
//   - [ValidateChecks] before anything is spent: its *[ConfigError] is the error Allow
//     returns for invalid checks (no check, an invalid rule, a cost out of range, one
//     budget named twice), and the first check of Settle's and Renew's arguments. Valid
//     checks are validated without allocating.
//   - [ValidateRules] where rules are given ahead of checks, at construction (package
//     middleware calls it in New).
//   - [Combine] folds the per-check outcomes into the [Decision], so that every limiter
//     reports the same rule for the same outcomes.
//
// The contract is in [Limiter] (return by the context's deadline; a store failure is a
// *[StoreError], never a refusal), and in "Reporting every check" and "Settling a
// decision" for the methods a limiter has when it can, which package middleware looks
// for. It also looks, when present, for a method InProcess() bool (a limiter that reports
// true decides without I/O: no deadline, no circuit breaker) and Ping(ctx) error (the
// breaker's probe of the store, off the request path).
package ratebudget
