// Package timerule is the arithmetic of the time rules, one function per formula: how a
// token bucket refills and how long it takes to hold a number of tokens, how a deficit
// moves between windows, when an event leaves a rolling window, and how an outcome reads
// once its spend is given back, is shared by a coalesced group, or has aged. The engines
// (package memory, the lua limiter's Go code), the middleware's metadata, coalescing and
// the refusal cache keep their own state and call these for the formulas.
//
// The Lua scripts (lua/allow.lua, lua/settle.lua) hold their own copy of the formulas
// they need, by necessity: the tests of this package run the scripts' code on a real
// Redis and hold each function here against its twin there.
//
// Units: times and waits are whole milliseconds (int64) unless a Duration; a token
// bucket's level and deficit are in scaled units, tokens × window ms, and it refills
// at its rule's Limit scaled units per ms (Limit tokens per Window). Every function is
// pure and safe for concurrent use.
package timerule

import (
	"math"
	"math/bits"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// MaxScaled bounds a token bucket's capacity × Window in ms, the scale of its deficit:
// the bound [ratebudget.Rule.Validate] enforces (2^53, exact in a Redis Lua number).
const MaxScaled = bound.MaxScaled

// Capacity is the most cost one identity can ever spend at once under r, in cost units:
// its Burst for a token bucket (its Limit when Burst is zero), its Limit otherwise. A
// check whose cost exceeds it can never be admitted. It is what a [ratebudget.Decision]
// reports as Limit.
func Capacity(r *ratebudget.Rule) int64 {
	if r.Algorithm == ratebudget.TokenBucket && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Duration converts n ms to a Duration, saturating at the longest Duration (about 292
// years): a token bucket of a large capacity and a slow refill may take up to 2^53 ms
// to fill. n is at least 0 wherever a wait is converted.
func Duration(n int64) time.Duration {
	if n > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Millisecond
}

// RoundUp converts ns nanoseconds to a Duration of whole milliseconds, rounded up, and
// 0 for ns at most 0: a wait measured on a local clock, reported as a store reports it.
func RoundUp(ns int64) time.Duration {
	if ns <= 0 {
		return 0
	}
	return time.Duration((ns+int64(time.Millisecond)-1)/int64(time.Millisecond)) * time.Millisecond
}

// CeilDiv is a / b rounded up for a > 0 (b > 0), and 0 for a at most 0: the whole ms
// that a deficit of a scaled units takes to refill at b scaled units per ms.
func CeilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// ConvertDeficit converts a token bucket's deficit d (scaled units, at most 2^53) from
// units of the window from (ms) to units of the window to (ms): the same number of
// tokens, d × to / from rounded up (a partly refilled token is never rounded away), at
// most 2^53. A rule whose Window changed under the same name reads its bucket so.
// Twins: allow.lua (inline) and settle.lua's convert.
func ConvertDeficit(d, from, to int64) int64 {
	hi, lo := bits.Mul64(uint64(d), uint64(to))
	if hi >= uint64(from) {
		return MaxScaled // the quotient is 2^64 or more
	}
	q, r := bits.Div64(hi, lo, uint64(from))
	if q >= MaxScaled {
		return MaxScaled
	}
	if r > 0 {
		q++
	}
	return int64(q)
}

// SinceWrite is the time since a token bucket's timestamp ts (ms) at now (ms): elapsed,
// the ms of refill, and lag, how far the clock is behind ts when it went back (then no
// refill: elapsed is 0, and every wait includes the lag, refill resuming once the clock
// passes ts again). One of the two is 0. The bucket's timestamp after the read is
// max(ts, now). Twin: allow.lua's elapsed = t - PTTL.
func SinceWrite(ts, now int64) (elapsed, lag int64) {
	if now < ts {
		return 0, ts - now
	}
	return now - ts, 0
}

// RefilledDeficit is a token bucket's deficit (scaled units) after elapsed ms (at least
// 0) of refill at rate scaled units per ms (the rule's Limit) from the deficit d (in the
// same window's units): 0 once refilled, else d less the refill, cut at 2 × full (full
// = capacity × window): a bucket in debt is at most one capacity below empty, also when
// the capacity was lowered under the same name. Twin: allow.lua's token-bucket read.
func RefilledDeficit(d, elapsed, rate, full int64) int64 {
	if elapsed >= CeilDiv(d, rate) {
		return 0
	}
	return min(d-elapsed*rate, 2*full)
}

// TokenWait is the time (ms) until a token bucket at level (scaled units, below 0 in
// debt) holds want scaled units, refilling at rate scaled units per ms after the clock's
// lag (ms, see SinceWrite): 0 when it already does. With want = full it is the reset
// (the time until full), with want = cost × window the retry of a refused cost. Twin:
// allow.lua's tofull and retry.
func TokenWait(want, level, lag, rate int64) int64 {
	if want <= level {
		return 0
	}
	return lag + CeilDiv(want-level, rate)
}

// UntilExpiry is a refused token bucket's wait (ms: its retry or its reset), ending at
// the latest when the bucket's state expires, expiry ms from now (negative: no expiry
// known): a bucket written under a faster rate than the rule deciding is full then,
// its state dropped (a Redis key expired). Twin: allow.lua's cap of retry and reset by
// the bucket's PTTL.
func UntilExpiry(wait, expiry int64) int64 {
	if expiry >= 0 && expiry < wait {
		return expiry
	}
	return wait
}

// Tokens is the whole tokens in a token bucket's level (scaled units of a window of w
// ms), rounded toward zero: a check's Remaining. Twin: allow.lua's
// (level - fmod(level, w)) / w.
func Tokens(level, w int64) int64 { return level / w }

// LeavesAfter is the time (ms) from now until an event at (ms) leaves a rolling window
// of w ms, or a lease taken at at-w expires: a rolling window's reset (its newest event)
// and retry (the oldest event whose leaving frees enough). Twin: allow.lua's
// last + w - now.
func LeavesAfter(at, w, now int64) int64 { return at + w - now }

// Unspent is an admitted check's outcome o (reported after its spend of cost units), once
// that spend is given back exactly, knowing idle, the check's reset (ms) as its budget
// was before the spend (allow.lua's modes '4' and '6'): cost more units remain (a token
// bucket's too: the spend took whole units) and the reset is idle's. It is the outcome a
// decision that spent nothing reports for the check (see "Reporting every check" in
// [ratebudget]). Twin: allow.lua's reply for a check that fits, decide only.
func Unspent(o ratebudget.Outcome, cost, idle int64) ratebudget.Outcome {
	o.Remaining += cost
	o.ResetAfter = Duration(idle)
	return o
}

// SpentFewer is an admitted check's outcome o under r, as seen by a decision that spent
// more units fewer than o's (a member of a coalesced group, placed before the others):
// that many more remain, and a token bucket is full again sooner by the time it takes
// to refill them, rounded down to whole ms (against the member, as a store rounds its
// waits up: at most 1 ms late). A fixed window ends, a rolling window's newest event
// leaves and the newest lease expires at the same time whatever was spent; an
// admission has no wait. A refusal is returned as it is.
func SpentFewer(r *ratebudget.Rule, o ratebudget.Outcome, more int64) ratebudget.Outcome {
	if !o.Allowed || more == 0 {
		return o
	}
	o.Remaining += more
	if r.Algorithm == ratebudget.TokenBucket {
		// more × window scaled units refill at Limit per ms. The product may exceed 64
		// bits (more <= 2^40, a window up to 2^35 ms).
		hi, lo := bits.Mul64(uint64(more), uint64(r.Window.Milliseconds()))
		if hi >= uint64(r.Limit) {
			o.ResetAfter = 0 // the quotient itself needs more than 64 bits
		} else if q, _ := bits.Div64(hi, lo, uint64(r.Limit)); q > math.MaxInt64 {
			o.ResetAfter = 0
		} else {
			o.ResetAfter = max(o.ResetAfter-Duration(int64(q)), 0)
		}
	}
	return o
}

// Elapsed is outcome o, reported for a request sent at sent, as of now (both ns on one
// monotonic clock): its waits shortened by the time elapsed, rounded up to whole ms
// (see RoundUp), and its reset no earlier than its retry.
func Elapsed(o ratebudget.Outcome, sent, now int64) ratebudget.Outcome {
	if o.RetryAfter > 0 {
		o.RetryAfter = RoundUp(sent + int64(o.RetryAfter) - now)
	}
	o.ResetAfter = max(RoundUp(sent+int64(o.ResetAfter)-now), o.RetryAfter)
	return o
}

// GivenBack is an admitted check's outcome o (reported after its spend of cost units
// under r) once that spend is given back, estimated from o alone (Unspent is exact, and
// needs the reset before the spend): the state a stacked decision reports for a
// limiter whose admission it gave back because a later limiter refused. A refusal is
// returned as it is: it spent nothing, and reports so (see
// "Reporting every check" in [ratebudget]).
//
// Remaining gets the cost back, exactly (at most the capacity). ResetAfter is exact for a
// budget whole again (0) and for a fixed window (a spend never moves an open window's
// end). A token bucket is full again sooner by the refill of the cost, Window/Limit per
// unit, so that the time to its next unit is the one the admission implied (a spend of
// whole units does not change it); waits are whole milliseconds, so this is within a
// millisecond of the exact reset, later by up to 1 ns more per unit given back
// (Window/Limit is truncated to whole ns), and UntilAvailable, which rounds it up to
// whole milliseconds, stays at most 1 ms early for costs below a million units. For a rolling window or leases the admission
// does not say when the budget's earlier newest event leaves, or its earlier newest
// lease expires: ResetAfter stays the time the given-back one would have (an upper
// bound).
func GivenBack(r *ratebudget.Rule, cost int64, o ratebudget.Outcome) ratebudget.Outcome {
	if !o.Allowed {
		return o
	}
	capacity := Capacity(r)
	o.Remaining = min(o.Remaining+cost, capacity)
	switch {
	case o.Remaining >= capacity:
		o.ResetAfter = 0
	case r.Algorithm == ratebudget.TokenBucket:
		per := r.Window / time.Duration(r.Limit)
		if per > 0 && time.Duration(cost) > o.ResetAfter/per {
			o.ResetAfter = 0
		} else {
			o.ResetAfter -= time.Duration(cost) * per
		}
	}
	return o
}

// UntilAvailable is the time until more of a budget under r is available, for a
// budget of capacity units with remaining left and reset until it is whole (both
// drafts' t, draft-11's effective window): the fixed window's or calendar period's end,
// a token bucket's next whole unit; zero when nothing is used, or when it cannot be known from the outcome (a
// rolling window, whose oldest event is not reported; leases).
//
// A token bucket refills Limit units per Window, Limit scaled units (units × window ms)
// a millisecond: the next whole unit arrives k = capacity-remaining-1 units, k×Window
// scaled units, before it is full. The reset is the deficit D's refill rounded up to
// whole ms, R = ceil(D/Limit), which leaves D within Limit scaled units; the next unit
// comes ceil((D-k×Window)/Limit) ms from now, of which this is the least (exact when
// Limit divides k×Window, else at most 1 ms early), in integers: a per-unit Duration
// loses its fraction k times over, or is zero for a unit that refills in under a
// nanosecond. It is at least 1 ns, for a header to send as 0 s.
func UntilAvailable(r *ratebudget.Rule, capacity, remaining int64, reset time.Duration) time.Duration {
	if reset <= 0 || remaining >= capacity {
		return 0
	}
	switch r.Algorithm {
	case ratebudget.FixedWindow, ratebudget.Calendar:
		return reset
	case ratebudget.TokenBucket:
		w := r.Window.Milliseconds()
		resetMs := int64(reset / time.Millisecond)
		if reset%time.Millisecond != 0 {
			resetMs++
		}
		kw := (capacity - remaining - 1) * w // at most capacity×Window <= 2^53
		next := resetMs - kw/r.Limit
		if kw%r.Limit != 0 {
			next--
		}
		return max(time.Duration(next)*time.Millisecond, time.Nanosecond)
	}
	return 0
}

// LeaseRetry is the wait to tell a client refused by an InFlight rule whose limiter
// reported d: at most 1 s. A slot frees when any of the client's running requests ends:
// the lease's expiry, which the limiter reports, only bounds a crashed holder's.
func LeaseRetry(d time.Duration) time.Duration { return min(d, time.Second) }
