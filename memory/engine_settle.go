package memory

import (
	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// The in-flight time rule and the settling of admitted spends, in the engine's terms (see
// engine.go): times are Unix milliseconds, and every function works on one budget whose
// shard lock the caller holds.

// decideInFlight admits while fewer than Limit leases are live. A new lease expires
// Window from now, also when an older lease expires later (taken under a longer Window
// of the same rule name, or before the clock went back): leases are kept in order of
// expiry (see insertLease).
func decideInFlight(b *budget, r *ratebudget.Rule, now int64, commit bool, lease int64) ratebudget.Outcome {
	limit, w := r.Limit, r.Window.Milliseconds()
	var leases []event
	if b != nil && b.rolling != nil {
		leases = pruneLeases(b, now)
	}
	live := int64(len(leases))
	reset, last := int64(0), int64(0)
	if live > 0 {
		last = leases[live-1].at
		reset = last - now
	}
	if live+1 > limit {
		return ratebudget.Outcome{Remaining: limit - live, ResetAfter: timerule.Duration(reset), RetryAfter: timerule.Duration(leases[0].at - now)}
	}
	at := now + w
	if commit {
		if b.rolling == nil {
			b.rolling = &rollingEvents{}
		}
		insertLease(b, event{at: at, n: lease})
	}
	return ratebudget.Outcome{Allowed: true, Remaining: limit - live - 1, ResetAfter: timerule.Duration(max(at, last) - now)}
}

// insertLease adds lease e to b's leases in order of expiry, after those that expire at
// the same time, and sets b's expiry to the newest lease's. A lease most often expires
// last: the search starts from the newest.
func insertLease(b *budget, e event) {
	ev := append(b.rolling.events, e)
	i := len(ev) - 1
	for i > 0 && ev[i-1].at > e.at {
		ev[i] = ev[i-1]
		i--
	}
	ev[i] = e
	b.rolling.events = ev
	b.expires = ev[len(ev)-1].at
}

// pruneLeases drops the leases that have expired at now and returns the live ones.
func pruneLeases(b *budget, now int64) []event {
	ev := b.rolling.events
	n := 0
	for n < len(ev) && ev[n].at <= now {
		n++
	}
	if n > 0 {
		// Resliced, not copied, as trimRolling does.
		if n == len(ev) {
			ev = ev[:0]
		} else {
			ev = ev[n:]
		}
		b.rolling.events = ev
	}
	return ev
}

// ticketOf is the ticket of the admission just committed to b at now.
func ticketOf(b *budget, r *ratebudget.Rule, now, lease int64) ratebudget.Ticket {
	switch r.Algorithm {
	case ratebudget.FixedWindow, ratebudget.Calendar:
		return ratebudget.Ticket{At: b.end, ID: 1} // the window's end, the period's start
	case ratebudget.RollingWindow:
		ev := b.rolling.events
		return ratebudget.Ticket{At: ev[len(ev)-1].at, ID: 1}
	case ratebudget.InFlight:
		return ratebudget.Ticket{At: now, ID: lease}
	}
	return ratebudget.Ticket{At: now, ID: 1}
}

// findLease returns the index of the lease numbered id in b, or -1.
func findLease(b *budget, id int64) int {
	if b == nil || b.rolling == nil {
		return -1
	}
	for i, e := range b.rolling.events {
		if e.n == id {
			return i
		}
	}
	return -1
}

// release drops the lease of t from b, if it is still held.
func release(b *budget, t ratebudget.Ticket, now int64) {
	i := findLease(b, t.ID)
	if i < 0 {
		return
	}
	ev := b.rolling.events
	ev = append(ev[:i], ev[i+1:]...)
	b.rolling.events = ev
	b.expires = now // no lease left: the state is no state
	if len(ev) > 0 {
		b.expires = ev[len(ev)-1].at
	}
}

// renew moves the lease of t in b to expire Window from now, keeping the leases in order
// of expiry. It reports false when the lease is no longer held or has expired.
func renew(b *budget, r *ratebudget.Rule, t ratebudget.Ticket, now int64) bool {
	i := findLease(b, t.ID)
	if i < 0 || b.rolling.events[i].at <= now {
		return false
	}
	ev := b.rolling.events
	b.rolling.events = append(ev[:i], ev[i+1:]...)
	insertLease(b, event{at: now + r.Window.Milliseconds(), n: t.ID})
	return true
}

// refund gives n units back to the spend recorded by t, as far as it still counts (see
// "Settling a decision" in [ratebudget]).
func refund(b *budget, r *ratebudget.Rule, t ratebudget.Ticket, n, now int64) {
	switch r.Algorithm {
	case ratebudget.FixedWindow:
		if b.end != t.At || now >= b.end {
			return // another window, or this one closed
		}
		b.count -= n
		if b.count <= 0 {
			// Nothing admitted in the window is left: close it, so that the next admission
			// opens a window of its own, as it would have without the refunded ones.
			b.count, b.end, b.expires = 0, now, now
		}
	case ratebudget.Calendar:
		if b.end != t.At || now >= b.expires {
			return // another period, or this one ended
		}
		if b.count -= n; b.count <= 0 {
			b.count, b.expires = 0, now // nothing admitted in the period is left: no state
		}
	case ratebudget.TokenBucket:
		level, ts, lag := tokenLevel(b, r, now)
		full := timerule.Capacity(r) * r.Window.Milliseconds()
		// An admitted cost is at most the capacity: so is n, and n × window <= 2^53.
		level = min(level+min(n, timerule.Capacity(r))*r.Window.Milliseconds(), full)
		setToken(b, r, level, ts, lag, now)
	case ratebudget.RollingWindow:
		w := r.Window.Milliseconds()
		if b.rolling == nil || t.At <= now-w {
			return // the event has left the window
		}
		ev := b.rolling.events
		lo, hi := 0, len(ev)
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if ev[mid].at < t.At {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo == len(ev) || ev[lo].at != t.At {
			return
		}
		// Every later event's cumulative sum drops by what is given back: time in
		// proportion to the events after this one (few, a spend being settled soon).
		cost := b.rolling.costOf(lo)
		give := min(n, cost)
		b.count -= give
		if give == cost {
			ev = append(ev[:lo], ev[lo+1:]...)
			b.rolling.events = ev
		}
		for j := lo; j < len(ev); j++ {
			ev[j].n -= give
		}
		b.expires = now
		if len(ev) > 0 {
			b.expires = ev[len(ev)-1].at + w
		}
	}
}

// charge spends n extra units at now without refusing them, into debt of at most one
// capacity (see "Settling a decision" in [ratebudget]). A budget just created for the
// charge must first be given the state of no state at all (see freshState). A Calendar
// rule finds its period in cal.
func charge(b *budget, r *ratebudget.Rule, n, now int64, cal *timerule.PeriodCache) {
	limit, w := r.Limit, r.Window.Milliseconds()
	switch r.Algorithm {
	case ratebudget.Calendar:
		if start, end := cal.Of(r, now); b.end != start || now >= b.expires {
			b.count, b.end, b.expires = 0, start, end // the period of now, opened by the extra
		}
		b.count = min(b.count+n, max(2*limit, b.count))
	case ratebudget.FixedWindow:
		if now >= b.end {
			b.count, b.end = 0, now+w // a new window, opened by the extra
		}
		b.count = min(b.count+n, max(2*limit, b.count))
		b.expires = b.end
	case ratebudget.TokenBucket:
		level, ts, lag := tokenLevel(b, r, now)
		full := timerule.Capacity(r) * w
		floor := max(-full, full-timerule.MaxScaled)
		if level > floor {
			// Debt stops at one capacity below zero, so n above twice the capacity is
			// clipped first: then n × window <= 2^54 does not overflow.
			level = max(level-min(n, 2*timerule.Capacity(r))*w, floor)
		}
		setToken(b, r, level, ts, lag, now)
	case ratebudget.RollingWindow:
		var last int64
		if b.rolling == nil {
			b.rolling = &rollingEvents{}
		}
		ev := b.trimRolling(now, w)
		if len(ev) > 0 {
			last = ev[len(ev)-1].at
		}
		n = min(n, 2*limit-b.count)
		if n <= 0 {
			return
		}
		at := max(now, last)
		b.addRolling(at, n)
		b.expires = at + w
	}
}

// tokenLevel is a token bucket's level at now (scaled units, below zero in debt), the
// timestamp it is measured at and the clock's lag behind it, as decideToken reads them
// (there written out, see decideToken). The bucket keeps its deficit, so that the level
// is the rule's capacity less what was spent and not yet refilled, however the capacity
// or the window changed since (a deficit written under another Window is converted to
// this one's units, see timerule.ConvertDeficit); debt is cut at one capacity below
// zero (timerule.RefilledDeficit). The bucket is full at its expiry, when the rule that
// wrote it would have refilled it, also if this rule's Limit is lower.
func tokenLevel(b *budget, r *ratebudget.Rule, now int64) (level, ts, lag int64) {
	w := r.Window.Milliseconds()
	full := timerule.Capacity(r) * w
	elapsed, lag := timerule.SinceWrite(b.end, now)
	ts = max(b.end, now)
	if now >= b.expires {
		return full, ts, lag
	}
	d := b.count
	if bw := b.window(); bw != w && d > 0 {
		d = timerule.ConvertDeficit(d, bw, w)
	}
	return full - timerule.RefilledDeficit(d, elapsed, r.Limit, full), ts, lag
}

// setToken writes a token bucket's level at ts, and its expiry: when it is full again.
func setToken(b *budget, r *ratebudget.Rule, level, ts, lag, now int64) {
	w := r.Window.Milliseconds()
	full := timerule.Capacity(r) * w
	b.count, b.end = full-level, ts
	b.setWindow(w)
	b.expires = now + timerule.TokenWait(full, level, lag, r.Limit)
}

// freshState gives a budget just created the state that equals no state at all: a closed
// fixed window, a full token bucket (no deficit), an empty log.
func freshState(b *budget, r *ratebudget.Rule, now int64) {
	if r.Algorithm == ratebudget.TokenBucket {
		b.count, b.end = 0, now
	}
}

// unspent is the outcome of a check that fits its budget under r at now, in a decision
// that another check refused: admitted, and the budget b (nil: none) as it is, nothing
// having been spent (see "Reporting every check" in [ratebudget]). decide reports such a
// check as if its cost had been spent, which the decision only does when every check
// fits. A Calendar rule finds its period in cal.
func unspent(b *budget, r *ratebudget.Rule, now int64, cal *timerule.PeriodCache) ratebudget.Outcome {
	o := ratebudget.Outcome{Allowed: true, Remaining: r.Limit}
	if b == nil {
		if r.Algorithm == ratebudget.TokenBucket {
			o.Remaining = timerule.Capacity(r)
		}
		return o
	}
	switch r.Algorithm {
	case ratebudget.FixedWindow:
		if now < b.end && b.count != 0 {
			o.Remaining, o.ResetAfter = r.Limit-b.count, timerule.Duration(b.end-now)
		}
	case ratebudget.Calendar:
		if start, _ := cal.Of(r, now); b.end == start && now < b.expires && b.count != 0 {
			o.Remaining, o.ResetAfter = r.Limit-b.count, timerule.Duration(b.expires-now)
		}
	case ratebudget.TokenBucket:
		level, _, lag := tokenLevel(b, r, now)
		w := r.Window.Milliseconds()
		o.Remaining = timerule.Tokens(level, w)
		o.ResetAfter = timerule.Duration(timerule.TokenWait(timerule.Capacity(r)*w, level, lag, r.Limit))
	case ratebudget.RollingWindow:
		if b.rolling != nil {
			if ev := b.trimRolling(now, r.Window.Milliseconds()); len(ev) > 0 {
				o.Remaining, o.ResetAfter = r.Limit-b.count, timerule.Duration(timerule.LeavesAfter(ev[len(ev)-1].at, r.Window.Milliseconds(), now))
			}
		}
	case ratebudget.InFlight:
		if b.rolling != nil {
			if leases := pruneLeases(b, now); len(leases) > 0 {
				o.Remaining, o.ResetAfter = r.Limit-int64(len(leases)), timerule.Duration(leases[len(leases)-1].at-now)
			}
		}
	}
	return o
}
