package middleware

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/deadline"
	"github.com/ratebudget/ratebudget/internal/delivery"
	"github.com/ratebudget/ratebudget/internal/meta"
	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// group is the checks of one limiter within a stack.
type group struct {
	key    any    // the limiter's identity (mw.limKey)
	parts  []part // the parts of this limiter, in layer order
	m      *mw    // the innermost of them: its deadline and breaker apply
	checks []ratebudget.Check
	index  []int // index[i] is checks[i]'s index in the stack
}

// verdict is what asking the limiters of a stack came to, before the failure policy of
// a failed one applies (see applyPolicy), with the event that the request is answered
// with, whose Decision, Latency (the limiter calls' time), Err (of the last limiter
// that failed; nil when none did) and Fallback (a local fallback decided a failed
// limiter's checks) it sets.
type verdict struct {
	ev Event
	// outcomes is every check's outcome, nil when not every one is known.
	outcomes []ratebudget.Outcome
	// failed is the parts of the last limiter that failed.
	failed []part
	// walked is set when the stack's layers use several limiters, asked one by one
	// (decideGroups): a failure under a policy other than fail-closed was then applied
	// in the walk, and ev.Decision is the other limiters' decision. open is set when a
	// limiter failed under fail-open, so that its rules went unenforced.
	walked, open bool
}

// answer is how a request is answered once its checks were asked.
type answer uint8

const (
	answerDecision      answer = iota // served with metadata, or refused (429, 413)
	answerDegraded                    // served without a decision: a limiter failed under fail-open
	answerUnavailable                 // 503: a limiter failed under fail-closed
	answerCanceled                    // nothing written: the request's context ended
	answerMisconfigured               // 500: a limiter rejected the checks as invalid
)

// decideStack decides every check of st and answers or calls next, in four steps:
// decide (ask the limiters), apply the failure policy, report (the metadata) and answer.
func decideStack(w http.ResponseWriter, r *http.Request, st *stack, next http.Handler) {
	st.decided, st.req = true, r
	if observing(st.parts, nil) > 1 {
		st.req, st.mark = delivery.Request(r)
	}
	ctx := r.Context()
	// Once reserved, a decision's spend is settled when the handler returns
	// (serveSettled) or given back when the request is answered without it: a refusal
	// and a rejected configuration give it back before their event (a failed give-back
	// is observed first), any other answer when decideStack returns. A callback that
	// panics before the handler runs (an observer, the refusal handler) gives it back
	// too: http.Server recovers the panic, and a lease left held would refuse the client
	// until it expired.
	served := false
	defer func() {
		if !served {
			st.giveBack(ctx)
		}
	}()
	var v verdict
	v.ev.Request = st.req
	st.decide(ctx, &v)
	how := st.applyPolicy(ctx, &v)
	ev := &v.ev
	if how == answerMisconfigured || how == answerDecision && !ev.Decision.Allowed {
		st.giveBack(ctx)
	}
	switch how {
	case answerMisconfigured:
		st.parts[len(st.parts)-1].m.misconfigured(w, r, st, ev.Err)
		return
	case answerCanceled:
		ev.Result = Canceled
		observeAll(st, ev)
		return
	case answerUnavailable:
		ev.Result = Unavailable
		observeAll(st, ev)
		headers.WriteUnavailable(w, r, unavailableRetryAfter)
		return
	case answerDegraded:
		ev.Result, ev.Decision = Degraded, ratebudget.Decision{}
		observeAll(st, ev) // the limiters that did decide are settled below
	default:
		if !st.answer(w, r, ev, v.outcomes) {
			return // refused
		}
	}
	served = true
	if st.settle != nil {
		serveSettled(w, r, st.settle, next)
		return
	}
	next.ServeHTTP(w, r)
}

// decide asks the limiters of st, into v: the one limiter of every layer in one call,
// or several limiter by limiter (decideGroups).
func (st *stack) decide(ctx context.Context, v *verdict) {
	if len(st.checks) == 0 {
		// Every rule is in shadow mode: nothing is enforced.
		v.ev.Decision = ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}}
		return
	}
	innermost := st.parts[len(st.parts)-1].m
	for i := range st.parts {
		if st.parts[i].m.limKey != innermost.limKey {
			decideGroups(ctx, st, v)
			return
		}
	}
	out := st.obuf[:0]
	if len(st.checks) > len(st.obuf) {
		out = make([]ratebudget.Outcome, 0, len(st.checks))
	}
	out = out[:len(st.checks)]
	d := &v.ev
	if st.settles {
		d.Decision, v.outcomes, d.Latency, d.Err = st.reserve(ctx, innermost, st.checks, nil, out)
	} else {
		d.Decision, v.outcomes, d.Latency, d.Err = innermost.decideEach(ctx, st.checks, out)
	}
	if d.Err != nil {
		// The layers with enforced rules: a layer whose rules are all in shadow mode
		// never changes a response, so neither its policy nor its local fallback applies.
		v.failed = enforcing(st.parts)
	}
}

// reserve asks m's limiter to reserve checks, those of st at the indexes index (nil:
// all of st's, in order), and records an admission to be settled once the handler
// returns, or given back. out receives every check's outcome when the limiter reports
// them (see decideEach).
func (st *stack) reserve(ctx context.Context, m *mw, checks []ratebudget.Check, index []int, out []ratebudget.Outcome) (ratebudget.Decision, []ratebudget.Outcome, time.Duration, error) {
	tickets := make([]ratebudget.Ticket, len(checks))
	d, outcomes, lat, err := m.reserveEach(ctx, checks, out, tickets)
	if err == nil && d.Allowed {
		st.addTarget(m, m.settler, checks, tickets, st.enforcedRules(len(checks), index))
	}
	return d, outcomes, lat, err
}

// applyPolicy says how a request whose checks were asked is answered: by the decision
// when no limiter failed, or when a limiter failed under fail-open or local fallback
// and the others decided (decideGroups applied those policies already). Otherwise the
// strictest policy of the failed limiter's layers applies: fail-open admits without a
// decision, local fallback decides on the per-replica budgets (v then holds that
// decision), fail-closed answers 503. A canceled request and a configuration error take
// no policy. A store error that is not a *ratebudget.StoreError becomes one (class
// "other").
func (st *stack) applyPolicy(ctx context.Context, v *verdict) answer {
	ev := &v.ev
	if ev.Err == nil {
		return answerDecision
	}
	if isConfigError(ev.Err) {
		return answerMisconfigured
	}
	var se *ratebudget.StoreError
	if !errors.As(ev.Err, &se) {
		ev.Err = &ratebudget.StoreError{Class: ratebudget.ClassOther, Err: ev.Err}
	}
	if deadline.Ended(ctx) {
		return answerCanceled
	}
	policy := strictest(v.failed)
	// In a walk, the other limiters' refusal refuses: the request was decided, and an
	// admission is degraded when a limiter failed under fail-open (whatever the local
	// fallback decided for another), whose rules went unenforced.
	decided := v.walked && policy != failClosed
	switch {
	case policy == failOpen && !decided, decided && ev.Decision.Allowed && v.open:
		return answerDegraded
	case decided:
		return answerDecision
	case policy == localFallback:
		ev.Decision, v.outcomes = fallback(ctx, st, v.failed), nil
		ev.Fallback = true
		return answerDecision
	}
	return answerUnavailable
}

// answer answers by the decision ev.Decision: it writes the metadata (of every check
// when the limiter reported each outcome, see report) and shows ev to the observers.
// It reports true for an admission, which the caller serves, having decided the rules
// in shadow mode; a refusal is answered here.
func (st *stack) answer(w http.ResponseWriter, r *http.Request, ev *Event, outcomes []ratebudget.Outcome) bool {
	d := &ev.Decision
	rep := st.partOf(d.Index)
	infos, index := st.report(d, outcomes)
	if !d.Allowed {
		st.refuse(w, r, ev, rep, infos, index)
		return false
	}
	ev.Result = Allowed
	if len(st.shadow) > 0 {
		shadow, lat, err := decideShadow(r.Context(), st)
		ev.Shadow, ev.Latency = shadow, ev.Latency+lat
		if ev.Err == nil {
			ev.Err = err // a shadow decision's store failure: observed, never answered
		}
	}
	observeAll(st, ev)
	if len(infos) > 0 {
		st.values.Write(w.Header(), rep.m.cfg.style, infos, index)
	}
	return true
}

// refuse answers a refusal, 429 or 413 (the cost exceeds a rule's capacity), or by the
// refusal handler of rep, the layer of the reported rule, whose style writes infos.
func (st *stack) refuse(w http.ResponseWriter, r *http.Request, ev *Event, rep *part, infos []meta.Info, index int) {
	d := &ev.Decision
	ev.Result = Denied
	if d.Exceeded {
		ev.Result = Exceeded
	}
	observeAll(st, ev)
	cfg := &rep.m.cfg
	switch {
	case cfg.onRefusal != nil:
		st.values.Write(w.Header(), cfg.style, infos, index)
		rd := *d
		if d.Index >= 0 && d.Index < len(st.checks) && st.checks[d.Index].Rule.Algorithm == ratebudget.InFlight {
			rd.RetryAfter = timerule.LeaseRetry(rd.RetryAfter) // an InFlight refusal: at most 1s
		}
		presetRefusal(w.Header(), &rd)
		cfg.onRefusal(w, r, rd)
	case d.Exceeded:
		meta.WriteCostExceeded(w, r, cfg.style, infos, index, rep.cost)
	default:
		meta.WriteTooManyRequests(w, r, cfg.style, infos, index)
	}
}

// presetRefusal sets on h what the default refusal of d sends besides its metadata and
// body, for a refusal handler to keep or overwrite: Cache-Control: no-store, and for a
// 429 Retry-After in whole seconds (rounded up, at least 1) from d.RetryAfter. A 413
// (d.Exceeded) gets no Retry-After: waiting cannot help.
func presetRefusal(h http.Header, d *ratebudget.Decision) {
	h.Set("Cache-Control", "no-store")
	if !d.Exceeded {
		h.Set("Retry-After", strconv.FormatInt(problem.RetryAfterSeconds(d.RetryAfter), 10))
	}
}

// giveBack gives back the spend of every reservation of st that has not been settled:
// the request is answered without being served.
func (st *stack) giveBack(ctx context.Context) {
	if st.settle != nil {
		st.settle.cancelAll(ctx)
	}
}

// decideGroups decides, into v, a stack whose layers use different limiters: one
// all-or-nothing call per limiter, in the order the layers were mounted (outermost
// first). A group's refusal stops the walk: later groups spend nothing; earlier groups'
// spend is given back (by decideStack) when their limiter can settle (it was reserved),
// and stays spent otherwise. A group's store failure under fail-open or local fallback
// is decided by that policy (see tolerate) and the walk goes on, so that the other
// limiters' rules still apply; v's failed and error are then the last
// failure. Any other failure (fail-closed, a configuration error, a canceled request)
// stops the walk with the earlier groups' reservations standing: decideStack answers
// it. The decision reported is the refusing group's, or when all admit the most
// restrictive rule of all.
func decideGroups(ctx context.Context, st *stack, v *verdict) {
	groups := st.groups()
	v.walked = true
	all := make([]ratebudget.Outcome, len(st.checks))
	known := true // every group asked reported every check's outcome
	best := -1
	for _, g := range groups {
		var gd ratebudget.Decision
		var gout []ratebudget.Outcome
		var lat time.Duration
		var err error
		out := make([]ratebudget.Outcome, len(g.checks))
		if g.m.settler != nil {
			// Reserved, so that a later limiter's refusal gives this spend back.
			gd, gout, lat, err = st.reserve(ctx, g.m, g.checks, g.index, out)
		} else {
			gd, gout, lat, err = g.m.decideEach(ctx, g.checks, out)
		}
		v.ev.Latency += lat
		if err != nil {
			known = false // the failed group's state is not known
			var decided, stop bool
			if gd, decided, stop = st.tolerate(ctx, g, err, v); stop {
				return
			}
			if !decided {
				continue // fail-open: the group's rules go unenforced
			}
		} else {
			if gout == nil {
				known = false
			} else {
				for i, k := range g.index {
					all[k] = gout[i]
				}
			}
			gd.Index = g.index[gd.Index]
		}
		if !gd.Allowed {
			v.ev.Decision = gd
			if known {
				v.outcomes = st.refusedBy(groups, g, all)
			}
			return
		}
		if d := &v.ev.Decision; best < 0 || tighter(&gd, d) {
			*d, best = gd, gd.Index
		}
	}
	if best < 0 {
		v.ev.Decision.Allowed = true // every group failed under fail-open: degraded
	}
	if known {
		v.outcomes = all
	}
}

// groups returns the enforced checks of st by limiter, in the order of each limiter's
// first layer.
func (st *stack) groups() []*group {
	var groups []*group
	for i := range st.parts {
		p := st.parts[i]
		if p.from == p.to {
			continue // every rule of the layer is in shadow mode or merged into an earlier layer's check
		}
		var g *group
		for _, x := range groups {
			if x.key == p.m.limKey {
				g = x
			}
		}
		if g == nil {
			g = &group{key: p.m.limKey}
			groups = append(groups, g)
		}
		g.parts = append(g.parts, p)
		g.m = p.m
		for k := p.from; k < p.to; k++ {
			g.checks = append(g.checks, st.checks[k])
			g.index = append(g.index, k)
		}
	}
	return groups
}

// tolerate applies, within decideGroups' walk, the policy of g, whose limiter failed
// with err. Under fail-closed, and for a canceled request or a configuration error, it
// stops the walk (stop) with v the stack's verdict: no decision, g failed. Otherwise the
// walk goes on with g the last failure: under fail-open without a decision of g's rules
// (open), under local fallback with its decision (decided: d, whose Index is the
// stack's; a refusal stops the walk too, with v that refusal).
func (st *stack) tolerate(ctx context.Context, g *group, err error, v *verdict) (d ratebudget.Decision, decided, stop bool) {
	policy := strictest(g.parts)
	v.failed, v.ev.Err = g.parts, err
	if policy == failClosed || deadline.Ended(ctx) || isConfigError(err) {
		v.ev.Decision, v.ev.Fallback, v.outcomes, v.open = ratebudget.Decision{}, false, nil, false
		return ratebudget.Decision{}, false, true
	}
	if policy == failOpen {
		v.open = true
		return ratebudget.Decision{}, false, false
	}
	d = fallback(ctx, st, g.parts)
	v.ev.Fallback = true
	if !d.Allowed {
		v.ev.Decision, v.outcomes = d, nil
		return d, true, true
	}
	return d, true, false
}

// refusedBy returns the outcomes of a walk that refused's limiter refused, from all,
// those of every check of the groups asked (the groups after refused are marked
// unasked): the refusing group spent nothing, and reports so; the groups before it that
// reserved are given their spend back, and report the state after it; the others' spend
// stands.
func (st *stack) refusedBy(groups []*group, refused *group, all []ratebudget.Outcome) []ratebudget.Outcome {
	for _, x := range groups {
		if x == refused {
			break
		}
		if x.m.settler != nil {
			for _, k := range x.index {
				givenBack(st.checks[k:k+1], all[k:k+1])
			}
		}
	}
	st.unasked = unasked(st, groups, refused)
	return all
}

// unasked marks the checks of the groups after refused, which a refusal left unasked;
// nil when refused is the last group.
func unasked(st *stack, groups []*group, refused *group) []bool {
	var marks []bool
	after := false
	for _, g := range groups {
		if after {
			if marks == nil {
				marks = make([]bool, len(st.checks))
			}
			for _, k := range g.index {
				marks[k] = true
			}
		}
		after = after || g == refused
	}
	return marks
}

// enforcing returns the parts that have enforced checks: parts itself when every part
// has some.
func enforcing(parts []part) []part {
	for i := range parts {
		if parts[i].from == parts[i].to {
			var some []part
			for _, p := range parts {
				if p.from < p.to {
					some = append(some, p)
				}
			}
			return some
		}
	}
	return parts
}

// strictest returns the strictest store-error policy of parts: fail-closed, then
// local fallback, then fail-open.
func strictest(parts []part) policy {
	p := failOpen
	for i := range parts {
		switch parts[i].m.cfg.policy {
		case failClosed:
			return failClosed
		case localFallback:
			p = localFallback
		}
	}
	return p
}

// fallback decides the checks of parts, a failed limiter's, on each layer's local budget, layer by
// layer (a degraded mode: each layer's local decision is all-or-nothing on its own).
// Every admission is reserved on the local budget, so that a refusal, by a later layer's
// local budget or by a later limiter, gives the spend back (decideStack) as it gives a
// healthy limiter's back. Layers under fail-open admit. It reports no outcome of each
// check.
func fallback(ctx context.Context, st *stack, parts []part) ratebudget.Decision {
	d := ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}, Index: -1}
	for _, p := range parts {
		if p.m.fallback == nil {
			continue
		}
		// Settled on the local budget when the handler returns (rules that count
		// attempts settle nothing), or given back on a refusal.
		checks := make([]ratebudget.Check, p.to-p.from)
		rules := make([]*compiledRule, len(checks))
		copy(checks, st.checks[p.from:p.to])
		copy(rules, st.ruleOf[p.from:p.to])
		for i := range checks {
			checks[i].Rule = rules[i].local
		}
		tickets := make([]ratebudget.Ticket, len(checks))
		pd, _ := p.m.fallback.Reserve(ctx, checks, tickets, nil)
		if pd.Allowed {
			st.addTarget(p.m, p.m.fallback, checks, tickets, rules)
		}
		pd.Index += p.from
		if pd.Exceeded {
			// The cost fits the rule (a cost that does not is refused before any limiter
			// is asked), only not its per-replica share: a 429 until the store answers
			// again, not a 413 that says it can never be admitted.
			pd.Exceeded = false
			pd.RetryAfter = max(pd.RetryAfter, unavailableRetryAfter)
		}
		if !pd.Allowed {
			return pd // the earlier layers' local spend is given back with the rest
		}
		if d.Index < 0 || tighter(&pd, &d) {
			d = pd
		}
	}
	if d.Index < 0 {
		d.Index = 0
	}
	return d
}

// decideShadow decides the checks of rules in shadow mode, layer by layer, once the
// enforced rules admitted the request. It returns the first refusal, or the first
// layer's admission, with the time its limiter calls took; a store failure leaves its
// layer out of the decision and is returned as err (the last one), unless the request's
// context ended.
func decideShadow(ctx context.Context, st *stack) (shadow ratebudget.Decision, latency time.Duration, err error) {
	for i := range st.shadowParts {
		p := &st.shadowParts[i]
		checks := st.shadow[p.from:p.to]
		var d ratebudget.Decision
		var lat time.Duration
		var derr error
		if p.m.settles && p.m.settler != nil {
			tickets := make([]ratebudget.Ticket, len(checks))
			d, lat, derr = p.m.decideWith(ctx, func(ctx context.Context) (ratebudget.Decision, error) {
				return p.m.settler.Reserve(ctx, checks, tickets, nil)
			})
			if derr == nil && d.Allowed {
				st.addTarget(p.m, p.m.settler, checks, tickets, slices.Clone(st.shadowRuleOf[p.from:p.to]))
			}
		} else {
			d, lat, derr = p.m.decide(ctx, checks)
		}
		latency += lat
		if derr != nil {
			if !deadline.Ended(ctx) {
				var se *ratebudget.StoreError
				if !errors.As(derr, &se) && !isConfigError(derr) {
					derr = &ratebudget.StoreError{Class: ratebudget.ClassOther, Err: derr}
				}
				err = derr
			}
			continue
		}
		if shadow.Rule == "" || shadow.Allowed && !d.Allowed {
			shadow = d
		}
	}
	return shadow, latency, err
}

// addTarget records a reserved decision to settle once the handler returns. checks must
// stay valid until then (the stack's own, or a copy), and so must st.parts, whose layers'
// observers see a failure to settle it.
func (st *stack) addTarget(m *mw, s settler, checks []ratebudget.Check, tickets []ratebudget.Ticket, rules []*compiledRule) {
	if st.settle == nil {
		st.settle = &settlement{req: st.req, mark: st.mark, parts: st.parts}
	}
	se := st.settle
	se.targets = append(se.targets, target{s: s, m: m, checks: checks, tickets: tickets, rules: rules})
	for i, cr := range rules {
		if cr.rule.Algorithm == ratebudget.InFlight && (se.ttl == 0 || checks[i].Rule.Window < se.ttl) {
			se.ttl = checks[i].Rule.Window
		}
		if cr.counts.kind == countRequestBytes {
			se.body = true
		}
	}
}

// enforcedRules returns the rule of each of n checks of st, those at the indexes index
// (nil: the first n).
func (st *stack) enforcedRules(n int, index []int) []*compiledRule {
	rules := make([]*compiledRule, n)
	for i := range rules {
		k := i
		if index != nil {
			k = index[i]
		}
		rules[i] = st.ruleOf[k]
	}
	return rules
}
