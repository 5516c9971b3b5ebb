package middleware

import (
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/meta"
)

// report returns the metadata of every check of st for the decision d (outcomes as in
// info), without the rules of layers that send none, and the index of the reported
// check among them (see visible).
func (st *stack) report(d *ratebudget.Decision, outcomes []ratebudget.Outcome) ([]meta.Info, int) {
	infos := st.infos[:0]
	if len(st.checks) > len(st.infos) {
		infos = make([]meta.Info, 0, len(st.checks))
	}
	for i := range st.checks {
		infos = append(infos, st.info(i, d, outcomes))
	}
	return st.visible(infos, d.Index)
}

// info is the metadata of check i: from its outcome when the limiter reported each one,
// from the decision for the reported check, and without state otherwise.
func (st *stack) info(i int, d *ratebudget.Decision, outcomes []ratebudget.Outcome) meta.Info {
	c := &st.checks[i]
	p := st.partOf(i)
	cr := p.rule(i-p.from, false)
	in := meta.Info{Policy: c.Rule.Name, Limit: cr.limit, LimitText: cr.limitText, Window: c.Rule.Window, Cost: c.Cost, Unit: p.m.cfg.unit}
	if cr.unit != "" {
		in.Unit = cr.unit
	}
	lease := c.Rule.Algorithm == ratebudget.InFlight
	if lease {
		in.Window = 0 // a lease's TTL is not a window
	}
	switch {
	case st.unasked != nil && st.unasked[i]:
		in.Unreported = true
	case outcomes != nil:
		o := &outcomes[i]
		in.Remaining, in.Reset, in.RetryAfter = max(o.Remaining, 0), o.ResetAfter, o.RetryAfter
		in.Violated = !o.Allowed && !d.Allowed
	case i == d.Index:
		in.Remaining, in.Reset, in.RetryAfter = d.Remaining, d.ResetAfter, d.RetryAfter
		in.Violated = !d.Allowed
	default:
		in.Unreported = true
	}
	if i == d.Index && (d.Remaining != in.Remaining || d.Limit != in.Limit) {
		in.Remaining, in.Limit, in.LimitText = d.Remaining, d.Limit, ""
	}
	if !in.Unreported {
		in.Available = available(&c.Rule, in.Limit, in.Remaining, in.Reset)
	}
	if lease {
		in.RetryAfter = leaseRetryAfter(in.RetryAfter)
	}
	return in
}

// visible drops from infos (one per check) the rules of the layers that send no
// metadata (headers.None), so that a stacked layer with another style, whose rule is
// reported, neither lists them in the RateLimit fields nor names them as violated: such
// a layer guards something (a login) whose remaining attempts help an attacker. It
// returns the rules left and the index of the reported check among them. When the
// reported layer's style is None nothing is written, and infos is returned as it is.
func (st *stack) visible(infos []meta.Info, reported int) ([]meta.Info, int) {
	if st.partOf(reported).m.cfg.style == headers.None {
		return infos, reported
	}
	hidden := false
	for k := range st.parts {
		if st.parts[k].m.cfg.style == headers.None && st.parts[k].to > st.parts[k].from {
			hidden = true
		}
	}
	if !hidden {
		return infos, reported
	}
	kept, index := infos[:0], reported
	for i := range infos {
		if st.partOf(i).m.cfg.style == headers.None {
			if i < reported {
				index--
			}
			continue
		}
		kept = append(kept, infos[i])
	}
	return kept, index
}

// partOf returns the part that holds check i (the first part when i is out of range).
func (st *stack) partOf(i int) *part {
	for k := range st.parts {
		if i >= st.parts[k].from && i < st.parts[k].to {
			return &st.parts[k]
		}
	}
	return &st.parts[0]
}

// leaseRetryAfter is the wait a refusal by an InFlight rule tells the client: at most 1s.
// A slot frees when any of the client's running requests ends: the lease's expiry, which
// the limiter reports, only bounds a crashed holder's.
func leaseRetryAfter(d time.Duration) time.Duration {
	return min(d, time.Second)
}

// givenBack turns the outcomes of a limiter's admission, which it reports after the
// spend, into the state of the budgets once the middleware gave that spend back (a
// later limiter of a stacked decision refused). A limiter's own refusal needs no such
// turn: it spends nothing, and reports so (see ratebudget.Reporter).
//
// Remaining gets the cost back, exactly. ResetAfter is exact for a budget whole again
// (0) and for a fixed window (a spend never moves an open window's end). A token bucket
// is full again sooner by the refill of the cost, Window/Limit per unit, so that the time
// to its next unit is the one the admission implied (a spend of whole units does not
// change it); the limiter rounds waits to whole milliseconds, so this is within a
// millisecond of its own, and available, which rounds it up to whole milliseconds,
// stays at most 1 ms early. For a rolling window or
// leases the admission does not say when the budget's earlier newest event leaves, or
// its earlier newest lease expires: ResetAfter stays the time the given-back one would
// have (an upper bound), which no header sends (their effective window is unknown).
func givenBack(checks []ratebudget.Check, outcomes []ratebudget.Outcome) {
	for i := range outcomes {
		o := &outcomes[i]
		if !o.Allowed || i >= len(checks) {
			continue
		}
		c := &checks[i]
		capacity := c.Rule.Capacity()
		o.Remaining = min(o.Remaining+c.Cost, capacity)
		switch {
		case o.Remaining >= capacity:
			o.ResetAfter = 0
		case c.Rule.Algorithm == ratebudget.TokenBucket:
			per := c.Rule.Window / time.Duration(c.Rule.Limit)
			if per > 0 && time.Duration(c.Cost) > o.ResetAfter/per {
				o.ResetAfter = 0
			} else {
				o.ResetAfter -= time.Duration(c.Cost) * per
			}
		}
	}
}

// available is the t of both drafts for a rule's state (draft-11's effective window):
// the time until more quota is made available, or zero when it cannot be known from the decision (a
// rolling window, whose oldest event is not reported) or nothing is used.
func available(r *ratebudget.Rule, capacity, remaining int64, reset time.Duration) time.Duration {
	if reset <= 0 || remaining >= capacity {
		return 0
	}
	switch r.Algorithm {
	case ratebudget.FixedWindow:
		return reset
	case ratebudget.TokenBucket:
		// The bucket refills Limit units per Window, Limit scaled units (units × window
		// ms) a millisecond: the next whole unit arrives k = capacity-remaining-1 units,
		// k×Window scaled units, before it is full. The reset is the deficit D's refill
		// rounded up to whole ms, R = ceil(D/Limit), which leaves D within Limit scaled
		// units; the next unit comes ceil((D-k×Window)/Limit) ms from now, of which this
		// is the least (exact when Limit divides k×Window, else at most 1 ms early), in
		// integers: a per-unit Duration loses its fraction k times over, or is zero for a
		// unit that refills in under a nanosecond.
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
		return max(time.Duration(next)*time.Millisecond, time.Nanosecond) // sent as t=0 when under a second
	}
	return 0
}
