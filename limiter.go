package ratebudget

import (
	"context"
	"math/bits"
	"strconv"
	"time"
)

// Limiter decides whether a request's checks fit their budgets.
//
// Allow decides all checks in one step, all-or-nothing: when it admits, every check's cost
// has been spent; when it refuses, nothing has been spent and no deadline has moved.
// Implementations must be safe for concurrent use. An error means no decision was made:
// it is never a refusal and never an empty budget (see [StoreError]). Checks that
// [ValidateChecks] rejects (none, an invalid rule, a cost out of range, one budget named
// twice) are a *[ConfigError], and nothing is spent. A check whose cost exceeds its
// rule's capacity is refused with the Decision's Exceeded set, not reported as an error.
//
// Allow must return by the context's deadline, whatever its store does: callers such as
// package middleware bound a decision by the context's deadline alone and call Allow on
// their own goroutine. It must not modify checks, nor retain them after it returns
// (callers reuse them).
type Limiter interface {
	Allow(ctx context.Context, checks []Check) (Decision, error)
}

// Check asks for Cost units of Rule's budget for one identity and scope.
type Check struct {
	// Rule is the budget's rule. It must be valid ([Rule.Validate]).
	Rule Rule
	// Identity is whose budget this is (a client IP prefix, an account digest, ...). Empty
	// means the budget is shared by everyone. Its length and bytes are free: the Redis
	// limiter stores its digest, and the in-process one (package memory) a copy of
	// identity and scope up to 256 bytes together and a 32-byte digest of longer ones
	// (never the caller's strings, which may be slices of larger ones).
	Identity string
	// Scope narrows the budget to part of the service (a route pattern, a group). Empty
	// means everywhere the rule is used.
	Scope string
	// Cost is the number of units to spend (a request, a unit of estimated work, a byte),
	// in the rule's cost units: at least 1, at most 2^40 (1,099,511,627,776), and exactly
	// 1 for an InFlight rule.
	Cost int64
}

// Decision is a limiter's answer to one request, reporting one rule: the one that refused
// (a rule whose capacity the cost exceeds first, as waiting cannot help; else the
// refusing rule with the longest wait), or when admitted the most restrictive rule: the
// smallest share of its capacity left (Remaining/Limit, so that a rule counted in
// tokens or bytes compares like with one counted in requests; on a tie, the longest
// reset). The zero Decision admits
// nothing and reports no rule.
type Decision struct {
	// Outcome is the reported rule's outcome, so that Allowed is true exactly when every
	// check was admitted and spent, and Exceeded when a check's cost exceeds its rule's
	// capacity (it can never be admitted, however long the caller waits; Allowed is then
	// false and RetryAfter zero). Remaining is clipped at zero (a budget in debt reports
	// 0), and is a snapshot, not a reservation. RetryAfter, on a refusal, is the earliest
	// time after which the same request could be admitted if nothing else is spent
	// meanwhile: a lower bound, not a promise, as others may spend first. For an
	// [InFlight] rule it is when the first of the leases expires if it is neither released
	// nor renewed: a bound for holders that crashed, while a running request usually
	// releases its lease sooner.
	Outcome
	// Rule is the reported rule's name and Index its position in the checks.
	Rule  string
	Index int
	// Limit is the reported rule's capacity in cost units: its Burst for a [TokenBucket]
	// rule whose Burst is set, its Limit otherwise. Its window is the caller's to know:
	// checks[Index].Rule.Window.
	Limit int64
}

// Outcome is one rule's part of a decision, as computed by a limiter engine. It
// describes the check's budget as it is right after the decision: spent from when the
// decision admits, as it was when the decision refuses (see "Reporting every check" in
// the package documentation).
type Outcome struct {
	// Allowed is true when the check fits its budget (the request as a whole is admitted
	// only when every check's is). In a refused decision, a check that fits keeps
	// Allowed true although nothing was spent: its Remaining and ResetAfter are then
	// those of its budget without its cost.
	Allowed bool
	// Exceeded is true when the check's cost exceeds its rule's capacity: it can never be
	// admitted, however long the caller waits.
	Exceeded bool
	// Remaining is the number of cost units the identity could still spend under the
	// check's rule right after the decision (after its cost only when the decision
	// admitted). It is negative while the budget is in debt (a settle charged more than
	// was reserved, see "Settling a decision" in the package documentation) or when the
	// rule's Limit was lowered under the same name; a Decision reports 0 then.
	Remaining int64
	// ResetAfter is how long until the check's budget is whole again if nothing more is
	// spent: the end of the fixed window, the time to refill the token bucket, the time
	// until the rolling window's events have all aged out, the time until the last
	// in-flight lease expires, the end of the calendar period. Zero when untouched.
	ResetAfter time.Duration
	// RetryAfter is, when the check does not fit, the earliest time after which it could
	// if nothing else is spent meanwhile; zero when it fits or is Exceeded.
	RetryAfter time.Duration
}

// Combine folds per-check outcomes (in checks order) into the request's Decision. An
// admission requires every outcome to be allowed; the reported rule is chosen as
// described on [Decision]. Limiter implementations use it so that every limiter reports
// the same rule for the same outcomes.
func Combine(checks []Check, outcomes []Outcome) Decision {
	if len(outcomes) == 1 {
		return decisionOf(&checks[0].Rule, &outcomes[0], 0, outcomes[0].Allowed)
	}
	best := -1
	allowed := true
	for i := range outcomes {
		if !outcomes[i].Allowed {
			allowed = false
			break
		}
	}
	for i := range outcomes {
		o := &outcomes[i]
		if best < 0 {
			if allowed || !o.Allowed {
				best = i
			}
			continue
		}
		b := &outcomes[best]
		if allowed {
			if c := leftCmp(o, &checks[i].Rule, b, &checks[best].Rule); c < 0 || c == 0 && o.ResetAfter > b.ResetAfter {
				best = i
			}
			continue
		}
		if o.Allowed {
			continue
		}
		// Among refusals an Exceeded one wins (waiting will not help), then the longest wait.
		if o.Exceeded != b.Exceeded {
			if o.Exceeded {
				best = i
			}
			continue
		}
		if o.RetryAfter > b.RetryAfter {
			best = i
		}
	}
	if best < 0 {
		return Decision{}
	}
	return decisionOf(&checks[best].Rule, &outcomes[best], best, allowed)
}

// leftCmp compares the shares of their capacities that outcomes o (of rule or) and b (of
// rule br) have left, -1 when o's is smaller, 0 when equal, +1 when larger: rules of
// different units (requests, tokens, bytes) compare like with like. A budget in debt
// has none left.
func leftCmp(o *Outcome, or *Rule, b *Outcome, br *Rule) int {
	// o.Remaining/or.capacity() against b.Remaining/br.capacity(), exactly: both sides
	// are below 2^40, so each product fits in 128 bits.
	ohi, olo := bits.Mul64(uint64(max(o.Remaining, 0)), uint64(br.capacity()))
	bhi, blo := bits.Mul64(uint64(max(b.Remaining, 0)), uint64(or.capacity()))
	switch {
	case ohi != bhi:
		if ohi < bhi {
			return -1
		}
		return 1
	case olo < blo:
		return -1
	case olo > blo:
		return 1
	}
	return 0
}

func decisionOf(r *Rule, o *Outcome, index int, allowed bool) Decision {
	d := Decision{
		Outcome: Outcome{
			Allowed:    allowed,
			Exceeded:   o.Exceeded,
			Remaining:  max(o.Remaining, 0),
			ResetAfter: o.ResetAfter,
		},
		Rule:  r.Name,
		Index: index,
		Limit: r.capacity(),
	}
	if !d.Allowed && !d.Exceeded {
		d.RetryAfter = o.RetryAfter
	}
	return d
}

// checksValid is ValidateChecks' fast path: the same conditions, checked without
// building errors, so that valid checks are validated without allocating, in a few ns a
// check. When it reports false, ValidateChecks finds the error.
func checksValid(checks []Check) bool {
	for i := range checks {
		c := &checks[i]
		r := &c.Rule
		if r.Name == "" || len(r.Name) > maxNameLen || r.Algorithm > Calendar ||
			r.Limit <= 0 || r.Limit > maxLimit || !(r.windowValid() || r.Algorithm == Calendar && r.calendarValid()) ||
			uint64(c.Cost-1) >= maxLimit || r.Algorithm == InFlight && c.Cost != 1 { // a Cost of 1..maxLimit
			return false
		}
		for k := 0; k < len(r.Name); k++ {
			if !nameByte[r.Name[k]] {
				return false
			}
		}
		if (r.Burst != 0 || r.Algorithm == TokenBucket) && !r.burstValid() {
			return false
		}
		if i > 0 && namedBefore(checks, i) {
			return false
		}
	}
	return len(checks) > 0
}

// namedBefore reports whether a check before checks[i] names its budget: the same rule
// name, identity and scope.
func namedBefore(checks []Check, i int) bool {
	c := &checks[i]
	for j := 0; j < i; j++ {
		if checks[j].Rule.Name == c.Rule.Name && checks[j].Identity == c.Identity && checks[j].Scope == c.Scope {
			return true
		}
	}
	return false
}

// ValidateChecks checks what a limiter must verify before it spends anything: at least one
// check, valid rules, costs in 1..2^40 (exactly 1 for an [InFlight] rule) and no
// budget named twice: two checks of one rule name, identity and scope, whatever their
// rules' other fields (one name with several identities or scopes is several budgets).
// It returns a *[ConfigError] naming the field at fault (and a rule without a name by
// its check's index: "checks[1]: Name must not be empty"). Valid checks are validated
// without allocating.
func ValidateChecks(checks []Check) error {
	if checksValid(checks) {
		return nil
	}
	if len(checks) == 0 {
		return &ConfigError{Field: "checks", Problem: "must not be empty"}
	}
	for i := range checks {
		c := &checks[i]
		if err := c.Rule.Validate(); err != nil {
			return locate(err, "checks", i)
		}
		if c.Cost <= 0 {
			return &ConfigError{Rule: c.Rule.Name, Field: "Cost", Problem: "must be positive"}
		}
		if c.Cost > maxLimit {
			return &ConfigError{Rule: c.Rule.Name, Field: "Cost", Problem: "must be at most 1099511627776 (2^40), got " + strconv.FormatInt(c.Cost, 10)}
		}
		if c.Rule.Algorithm == InFlight && c.Cost != 1 {
			return &ConfigError{Rule: c.Rule.Name, Field: "Cost", Problem: "must be 1 for an InFlight rule (one lease), got " + strconv.FormatInt(c.Cost, 10)}
		}
		if namedBefore(checks, i) {
			return &ConfigError{Rule: c.Rule.Name, Field: "checks", Problem: "names the same budget twice"}
		}
	}
	return nil
}
