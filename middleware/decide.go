package middleware

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/delivery"
	"github.com/ratebudget/ratebudget/internal/meta"
)

// group is the checks of one limiter within a stack.
type group struct {
	key    any    // the limiter's identity (mw.limKey)
	parts  []part // the parts of this limiter, in layer order
	m      *mw    // the innermost of them: its deadline and breaker apply
	checks []ratebudget.Check
	index  []int // index[i] is checks[i]'s index in the stack
}

// decideStack decides every check of st and answers or calls next.
func decideStack(w http.ResponseWriter, r *http.Request, st *stack, next http.Handler) {
	st.decided, st.req = true, r
	if observing(st.parts, nil) > 1 {
		st.req, st.mark = delivery.Request(r)
	}
	ctx := r.Context()
	innermost := st.parts[len(st.parts)-1].m
	var ev Event
	ev.Request = st.req
	var outcomes []ratebudget.Outcome
	single := true
	for i := range st.parts {
		if st.parts[i].m.limKey != innermost.limKey {
			single = false
			break
		}
	}
	// Once reserved, a decision's spend is settled when the handler returns
	// (serveSettled) or given back when the request is answered without it. A callback
	// that panics before the handler runs (an observer, the refusal handler) gives it
	// back too: http.Server recovers the panic, and a lease left held would refuse the
	// client until it expired.
	served := false
	defer func() {
		if !served && st.settle != nil {
			st.settle.cancelAll(ctx)
		}
	}()
	var err error
	var failed *group
	open := false // a limiter failed under fail-open, and its rules went unenforced
	switch {
	case len(st.checks) == 0:
		// Every rule is in shadow mode: nothing is enforced.
		ev.Decision = ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}}
	case single:
		// The group's parts are the layers with enforced rules: a layer whose rules are
		// all in shadow mode never changes a response, so neither its policy nor its
		// local fallback applies.
		g := group{key: innermost.limKey, parts: enforcing(st.parts), m: innermost, checks: st.checks}
		out := st.obuf[:0]
		if len(st.checks) > len(st.obuf) {
			out = make([]ratebudget.Outcome, 0, len(st.checks))
		}
		if st.settles {
			tickets := make([]ratebudget.Ticket, len(st.checks))
			ev.Decision, outcomes, ev.Latency, err = g.m.reserveEach(ctx, st.checks, out[:len(st.checks)], tickets)
			if err == nil && ev.Decision.Allowed {
				st.addTarget(g.m, g.m.settler, st.checks, tickets, st.enforcedRules(0, len(st.checks)))
			}
		} else {
			ev.Decision, outcomes, ev.Latency, err = g.m.decideEach(ctx, st.checks, out[:len(st.checks)])
		}
		if err != nil {
			failed = &g
		}
	default:
		ev.Decision, outcomes, ev.Latency, failed, ev.Fallback, open, err = decideGroups(ctx, st)
	}
	if err != nil {
		if errors.Is(err, ratebudget.ErrInvalidConfig) {
			if st.settle != nil {
				st.settle.cancelAll(ctx) // an earlier limiter's reservation
			}
			innermost.misconfigured(w, r, st, err)
			return
		}
		var se *ratebudget.StoreError
		if !errors.As(err, &se) {
			err = &ratebudget.StoreError{Class: "other", Err: err}
		}
		ev.Err = err
		if ended(ctx) {
			ev.Result = Canceled
			observeAll(st, &ev)
			if st.settle != nil {
				st.settle.cancelAll(ctx)
			}
			return
		}
		policy := strictest(failed.parts)
		// decideGroups applies a policy other than fail-closed itself and goes on with the
		// other limiters, whose refusal refuses: the request was decided, and an
		// admission is degraded when a limiter failed under fail-open (whatever the local
		// fallback decided for another), whose rules went unenforced.
		decided := !single && policy != failClosed
		switch {
		case policy == failOpen && !decided, decided && ev.Decision.Allowed && open:
			ev.Result = Degraded
			ev.Decision = ratebudget.Decision{}
			observeAll(st, &ev)
			if st.settle != nil {
				served = true
				serveSettled(w, r, st.settle, next) // the limiters that did decide
				return
			}
			next.ServeHTTP(w, r)
			return
		case decided:
		case policy == localFallback:
			ev.Decision, outcomes = fallback(ctx, st, failed)
			ev.Fallback = true
		default:
			ev.Result = Unavailable
			observeAll(st, &ev)
			if st.settle != nil {
				st.settle.cancelAll(ctx)
			}
			headers.WriteUnavailable(w, r, unavailableRetryAfter(failed.parts))
			return
		}
	}
	d := &ev.Decision
	rep := st.partOf(d.Index)
	infos := st.infos[:0]
	if len(st.checks) > len(st.infos) {
		infos = make([]meta.Info, 0, len(st.checks))
	}
	for i := range st.checks {
		infos = append(infos, st.info(i, d, outcomes))
	}
	infos, index := st.visible(infos, d.Index)
	switch {
	case d.Allowed:
		ev.Result = Allowed
		if len(st.shadow) > 0 {
			var lat time.Duration
			var serr error
			ev.Shadow, lat, serr = decideShadow(ctx, st)
			ev.Latency += lat
			if ev.Err == nil {
				ev.Err = serr // a shadow decision's store failure: observed, never answered
			}
		}
		observeAll(st, &ev)
		if len(infos) > 0 {
			meta.Write(w.Header(), rep.m.cfg.style, infos, index)
		}
		if st.settle != nil {
			served = true
			serveSettled(w, r, st.settle, next)
			return
		}
		next.ServeHTTP(w, r)
	case rep.m.cfg.onRefusal != nil:
		ev.Result = Denied
		if d.Exceeded {
			ev.Result = Exceeded
		}
		observeAll(st, &ev)
		meta.Write(w.Header(), rep.m.cfg.style, infos, index)
		rd := *d
		if d.Index >= 0 && d.Index < len(st.checks) && st.checks[d.Index].Rule.Algorithm == ratebudget.InFlight {
			rd.RetryAfter = leaseRetryAfter(rd.RetryAfter)
		}
		rep.m.cfg.onRefusal(w, r, rd)
	case d.Exceeded:
		ev.Result = Exceeded
		observeAll(st, &ev)
		meta.WriteCostExceeded(w, r, rep.m.cfg.style, infos, index, rep.cost)
	default:
		ev.Result = Denied
		observeAll(st, &ev)
		meta.WriteTooManyRequests(w, r, rep.m.cfg.style, infos, index)
	}
}

// decideGroups decides a stack whose layers use different limiters: one all-or-nothing
// call per limiter, in the order the layers were mounted (outermost first). A group's
// refusal stops the walk: later groups spend nothing; earlier groups' spend is given
// back when their limiter implements ratebudget.Settler (it was reserved), and stays
// spent otherwise. A group's store failure under fail-open or local fallback is decided
// by that policy (fellBack reports a local decision, open an admission under fail-open)
// and the walk goes on, so that the other limiters' rules still apply; failed and err
// are then the last failure. Any other failure (fail-closed, a configuration error, a
// canceled request) stops the walk with the earlier groups' reservations standing:
// decideStack answers it. The decision
// reported is the refusing group's, or when all admit the most restrictive rule of all.
func decideGroups(ctx context.Context, st *stack) (d ratebudget.Decision, outcomes []ratebudget.Outcome, latency time.Duration, failed *group, fellBack, open bool, err error) {
	var groups []*group
	for i := range st.parts {
		p := st.parts[i]
		if p.from == p.to {
			continue // every rule of the layer is in shadow mode: nothing to ask its limiter
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
	all := make([]ratebudget.Outcome, len(st.checks))
	known := true
	best := -1
	for _, g := range groups {
		var gd ratebudget.Decision
		var gout []ratebudget.Outcome
		var lat time.Duration
		var gerr error
		if g.m.settler != nil {
			// Reserved, so that a later limiter's refusal gives this spend back.
			tickets := make([]ratebudget.Ticket, len(g.checks))
			gd, gout, lat, gerr = g.m.reserveEach(ctx, g.checks, make([]ratebudget.Outcome, len(g.checks)), tickets)
			if gerr == nil && gd.Allowed {
				rules := make([]*compiledRule, len(g.index))
				for i, k := range g.index {
					p := st.partOf(k)
					rules[i] = p.rule(k-p.from, false)
				}
				st.addTarget(g.m, g.m.settler, g.checks, tickets, rules)
			}
		} else {
			gd, gout, lat, gerr = g.m.decideEach(ctx, g.checks, make([]ratebudget.Outcome, len(g.checks)))
		}
		latency += lat
		if gerr == nil && !gd.Allowed && st.settle != nil {
			st.settle.cancelAll(ctx)
		}
		if gerr != nil {
			policy := strictest(g.parts)
			if policy == failClosed || ended(ctx) || errors.Is(gerr, ratebudget.ErrInvalidConfig) {
				return ratebudget.Decision{}, nil, latency, g, false, false, gerr
			}
			failed, err = g, gerr
			known = false // the failed group's state is not known
			if policy == failOpen {
				open = true
				continue
			}
			gd, _ = fallback(ctx, st, g) // its Index is the stack's already
			fellBack = true
			if !gd.Allowed {
				return gd, nil, latency, failed, true, open, err
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
			// The refusing group spent nothing, and reports so; the groups before it
			// that reserved were given their spend back (cancelAll); the others' spend
			// stands.
			for _, x := range groups {
				if x == g {
					break
				}
				if x.m.settler != nil {
					for _, k := range x.index {
						givenBack(st.checks[k:k+1], all[k:k+1])
					}
				}
			}
			if known {
				outcomes = all
				st.unasked = unasked(st, groups, g)
			}
			return gd, outcomes, latency, failed, fellBack, open, err
		}
		if best < 0 || tighter(&gd, &d) {
			d, best = gd, gd.Index
		}
	}
	if best < 0 {
		d.Allowed = true // every group failed under fail-open: degraded
	}
	if known {
		outcomes = all
	}
	return d, outcomes, latency, failed, fellBack, open, err
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

// unavailableRetryAfter is the Retry-After of a 503 for a failed limiter's parts: the
// setting of its innermost layer under fail-closed, whose policy refuses.
func unavailableRetryAfter(parts []part) time.Duration {
	for i := len(parts) - 1; i >= 0; i-- {
		if parts[i].m.cfg.policy == failClosed {
			return parts[i].m.cfg.retryAfter
		}
	}
	return parts[len(parts)-1].m.cfg.retryAfter
}

// fallback decides the failed group's checks on each layer's local budget, layer by
// layer (a degraded mode: each layer's local decision is all-or-nothing on its own).
// Every admission is reserved on the local budget, so that a refusal, by a later layer's
// local budget or by a later limiter, gives the spend back as it gives a healthy
// limiter's back. Layers under fail-open admit.
func fallback(ctx context.Context, st *stack, g *group) (ratebudget.Decision, []ratebudget.Outcome) {
	d := ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}, Index: -1}
	for _, p := range g.parts {
		if p.m.fallback == nil {
			continue
		}
		// Settled on the local budget when the handler returns (rules that count
		// attempts settle nothing), or given back on a refusal.
		checks := make([]ratebudget.Check, p.to-p.from)
		rules := make([]*compiledRule, len(checks))
		copy(checks, st.checks[p.from:p.to])
		for i := range checks {
			rules[i] = p.rule(i, false)
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
			pd.RetryAfter = max(pd.RetryAfter, p.m.cfg.retryAfter)
		}
		if !pd.Allowed {
			if st.settle != nil {
				st.settle.cancelAll(ctx) // the earlier layers' local spend
			}
			return pd, nil
		}
		if d.Index < 0 || tighter(&pd, &d) {
			d = pd
		}
	}
	if d.Index < 0 {
		d.Index = 0
	}
	return d, nil
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
				st.addTarget(p.m, p.m.settler, checks, tickets, p.shadowRules())
			}
		} else {
			d, lat, derr = p.m.decide(ctx, checks)
		}
		latency += lat
		if derr != nil {
			if !ended(ctx) {
				var se *ratebudget.StoreError
				if !errors.As(derr, &se) && !errors.Is(derr, ratebudget.ErrInvalidConfig) {
					derr = &ratebudget.StoreError{Class: "other", Err: derr}
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
func (st *stack) addTarget(m *mw, s ratebudget.Settler, checks []ratebudget.Check, tickets []ratebudget.Ticket, rules []*compiledRule) {
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

// enforcedRules returns the rule of each of st.checks[from:to].
func (st *stack) enforcedRules(from, to int) []*compiledRule {
	rules := make([]*compiledRule, 0, to-from)
	for i := from; i < to; i++ {
		p := st.partOf(i)
		rules = append(rules, p.rule(i-p.from, false))
	}
	return rules
}

// shadowRules returns the rule of each shadow check of part p.
func (p *part) shadowRules() []*compiledRule {
	rules := make([]*compiledRule, 0, p.to-p.from)
	for k := 0; k < p.to-p.from; k++ {
		rules = append(rules, p.rule(k, true))
	}
	return rules
}
