package middleware

import (
	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/meta"
	"github.com/ratebudget/ratebudget/internal/timerule"
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
	cr := st.ruleOf[i]
	in := meta.Info{Policy: c.Rule.Name, Plan: cr.plan, Limit: cr.limit, LimitText: cr.limitText, Window: c.Rule.Window, Cost: c.Cost, Unit: cr.unit}
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
		in.Available = timerule.UntilAvailable(&c.Rule, in.Limit, in.Remaining, in.Reset)
	}
	if lease {
		in.RetryAfter = timerule.LeaseRetry(in.RetryAfter)
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

// givenBack turns the outcomes of a limiter's admission, which it reports after the
// spend, into the state of the budgets once the middleware gave that spend back (a
// later limiter of a stacked decision refused), as timerule.GivenBack estimates it. A
// limiter's own refusal needs no such turn: it spends nothing, and reports so (see
// "Reporting every check" in package ratebudget).
func givenBack(checks []ratebudget.Check, outcomes []ratebudget.Outcome) {
	for i := range outcomes {
		if i < len(checks) {
			outcomes[i] = timerule.GivenBack(&checks[i].Rule, checks[i].Cost, outcomes[i])
		}
	}
}
