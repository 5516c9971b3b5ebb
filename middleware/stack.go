package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/chiroute"
	"github.com/ratebudget/ratebudget/internal/delivery"
	"github.com/ratebudget/ratebudget/internal/meta"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// # One decision for stacked layers
//
// Every handler that [New]'s middleware returns is a *layer. A request may pass through
// several layers (an r.Use on a group and an r.With on a route, nested groups, plain
// wrapping). They make one decision: each layer computes its own checks where it is
// mounted (so its key functions see what they would see alone), and a layer that knows
// the next thing to run is another layer hands its checks on in the request's context
// instead of deciding. The innermost layer decides every layer's checks in one
// Limiter.Allow call, all-or-nothing, before any non-layer handler runs.
//
// A layer knows that another layer comes next when:
//   - its next handler is a layer (chi.Chain, r.With, r.Group with r.Use, and plain
//     wrapping all compose middlewares directly around each other), or
//   - its next handler is a chi router's routing step (the layer is the last r.Use of a
//     router) and the route the request matches starts with a layer (its first r.With or
//     the subrouter's first r.Use, which runs also when the subrouter answers 404 or 405),
//     found by looking ahead in the router, router by router.
//
// Any other handler between two layers (a logger, an authentication middleware) may do
// work or answer on its own, so the outer layer decides before it runs, and the inner
// layer decides again on its own: two decisions, as without stacking.

// layer is one middleware instance around one next handler.
type layer struct {
	m     *mw
	next  http.Handler
	inner bool // next is a layer
}

func (m *mw) wrap(next http.Handler) http.Handler {
	_, inner := next.(*layer)
	return &layer{m: m, next: next, inner: inner}
}

// stack is the decision state that the layers of one request share.
type stack struct {
	// decided is set once the checks have been decided, answered once a layer has
	// answered the request without a decision (400, 413, a canceled request).
	decided, answered bool
	parts             []part
	checks            []ratebudget.Check
	pbuf              [3]part
	cbuf              [4]ratebudget.Check
	infos             [4]meta.Info
	obuf              [4]ratebudget.Outcome
	// settles is set when a layer's checks must be settled once the handler returns;
	// shadow holds the checks of rules in shadow mode, shadowParts their layers.
	settles     bool
	shadow      []ratebudget.Check
	shadowParts []part
	settle      *settlement   // what the handler's return settles, once admitted
	req         *http.Request // the request of the decision's events (set by decideStack)
	// mark numbers the deliveries of the decision's events when more than one layer has
	// observers (nil otherwise); req is then a copy of the request that carries it.
	mark *delivery.Mark
	// unasked marks the checks of limiters that a refusal left unasked (nil when every
	// limiter was asked): their state is not known.
	unasked []bool
}

// part is one layer's share of a stack: its checks are checks[from:to].
type part struct {
	m        *mw
	from, to int
	cost     int64
}

type stackKey struct{}

func (st *stack) reset() {
	clear(st.checks) // no identity or scope outlives its request
	clear(st.parts)
	clear(st.shadow)
	clear(st.shadowParts)
	st.decided, st.answered, st.settles = false, false, false
	st.parts, st.checks = st.pbuf[:0], st.cbuf[:0]
	st.shadow, st.shadowParts, st.settle, st.req, st.mark, st.unasked = st.shadow[:0], st.shadowParts[:0], nil, nil, nil, nil
}

// rule returns the rule of the part's k-th check (of its enforced checks, or with shadow
// true of its shadow checks).
func (p *part) rule(k int, shadow bool) *compiledRule {
	switch {
	case shadow:
		return &p.m.rules[p.m.shadowed[k]]
	case p.m.enforced != nil:
		return &p.m.rules[p.m.enforced[k]]
	}
	return &p.m.rules[k]
}

// ServeHTTP adds the layer's checks to the request's decision and, when it is the
// innermost layer, decides.
func (l *layer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := l.m
	ctx := r.Context()
	st, _ := ctx.Value(stackKey{}).(*stack)
	if st != nil && (st.decided || st.answered) {
		st = nil // reached again after a decision (through another handler): decide alone
	}
	if ctx.Err() != nil {
		ev := Event{Request: r, Outcome: OutcomeCanceled, Err: ctx.Err()}
		if st != nil {
			st.answered = true
			observeOuter(st, m, &ev) // the layers that handed their checks on, too
			return
		}
		m.observe(&ev)
		return
	}
	ahead := !l.inner && m.layerAhead(l.next, r)
	handOn := l.inner || ahead
	pooled := false
	if st == nil {
		if handOn {
			st = new(stack)
			st.reset()
			r = r.WithContext(context.WithValue(ctx, stackKey{}, st))
		} else {
			// Alone, the common case: the stack never leaves this call.
			st = m.stacks.Get().(*stack)
			pooled = true
		}
	}
	if pooled {
		defer func() { st.reset(); m.stacks.Put(st) }()
	}
	kr := r // the request the key functions see
	if _, mux := l.next.(*http.ServeMux); mux && r.Pattern != "" {
		// Around a ServeMux the route is not known yet: r.Pattern is an enclosing mux's
		// ("/api/"), which a route scope would take for the route's, one budget for
		// every route below it. Unknown, as around a top-level ServeMux.
		kr = r.WithContext(ctx)
		kr.Pattern = ""
	}
	if !m.addChecks(w, kr, st) {
		return // answered: nothing has been spent by any layer
	}
	if handOn {
		l.next.ServeHTTP(w, r)
		if ahead && !st.decided && !st.answered {
			m.undecided(r, st)
		}
		return
	}
	decideStack(w, r, st, l.next)
}

// undecided handles a look-ahead that was wrong: the router did not run the layer it was
// expected to, so the request was served without a decision. Its checks are spent now,
// so that the budgets still count it, and the mistake is logged once.
func (m *mw) undecided(r *http.Request, st *stack) {
	if m.warnedAhead.CompareAndSwap(false, true) {
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: a layer handed its checks to the layer of the route the router was expected to run, "+
			"but none ran; the request was served before its checks were decided (they are spent now). "+
			"Mount the layers directly around each other (r.Group with r.Use, r.With, chi.Chain)",
			slog.String("path", r.URL.Path))
	}
	st.decided = true
	_, _, _ = st.parts[0].m.decide(context.WithoutCancel(r.Context()), st.checks)
}

// addChecks appends the layer's checks to st. It reports false when the request has been
// answered: an undeterminable identity, scope or cost (400), or a cost above a rule's
// capacity (413).
func (m *mw) addChecks(w http.ResponseWriter, r *http.Request, st *stack) (ok bool) {
	defer func() {
		if !ok {
			st.answered = true
		}
	}()
	cost := int64(1)
	if m.cfg.cost != nil {
		c, err := m.cfg.cost(r)
		switch {
		case err != nil:
			m.invalid(w, r, st, inputError(partCost, "", err, "cost could not be determined"))
			return false
		case c < 1:
			m.invalid(w, r, st, &InputError{Part: partCost, Reason: "cost must be a positive integer"})
			return false
		}
		cost = c
	}
	if m.layerCost && cost > m.rules[m.minCap].limit {
		// No store can admit it, and no store need be asked: decided here, so that a
		// hostile cost never reaches the store, its breaker or the failure policy.
		m.exceeded(w, r, st, cost, m.minCap)
		return false
	}
	from, sfrom := len(st.checks), len(st.shadow)
	undo := func() {
		st.checks, st.shadow = st.checks[:from], st.shadow[:sfrom]
	}
	for i := range m.rules {
		cr := &m.rules[i]
		id, err := cr.identity(r)
		if err == nil && id == "" {
			err = errEmptyIdentity
		}
		if err != nil {
			undo()
			m.invalid(w, r, st, inputError(partIdentity, cr.rule.Name, err, "identity could not be determined"))
			return false
		}
		var scope string
		if cr.scope != nil {
			scope, err = cr.scope(r)
			if err == nil && scope == "" {
				err = errEmptyScope
			}
			if err != nil {
				undo()
				m.invalid(w, r, st, inputError(partScope, cr.rule.Name, err, "scope could not be determined"))
				return false
			}
		}
		c := cost
		if m.settles {
			if c = cr.reserve(r, cost); c > cr.limit && !cr.shadow {
				undo()
				m.exceeded(w, r, st, c, i) // e.g. a Content-Length above a byte budget
				return false
			}
		}
		if cr.shadow {
			st.shadow = append(st.shadow, ratebudget.Check{Rule: cr.rule, Identity: id, Scope: scope, Cost: c})
			continue
		}
		st.checks = append(st.checks, ratebudget.Check{Rule: cr.rule, Identity: id, Scope: scope, Cost: c})
	}
	st.parts = append(st.parts, part{m: m, from: from, to: len(st.checks), cost: cost})
	if len(st.shadow) > sfrom {
		st.shadowParts = append(st.shadowParts, part{m: m, from: sfrom, to: len(st.shadow), cost: cost})
	}
	st.settles = st.settles || m.settles
	return true
}

var (
	errEmptyIdentity = errors.New("ratebudget: the identity function returned an empty key")
	errEmptyScope    = errors.New("ratebudget: the scope function returned an empty key")
)

// layerAhead reports whether the next thing to run after this layer is another layer,
// looking through a chi router's routing step.
func (m *mw) layerAhead(next http.Handler, r *http.Request) bool {
	if !m.probe.IsRouting(next) {
		return false
	}
	mux, method, path := m.routes.Level(r)
	if mux == nil {
		return false
	}
	pattern, levels := chiroute.Find(mux, method, path)
	if len(levels) == 0 {
		return false // this router answers 404 or 405: this layer decides
	}
	// A subrouter that answers 404 or 405 (pattern "") still runs its r.Use layers.
	mw, h, ok := m.routes.First(mux, method, pattern, levels)
	if !ok {
		return false
	}
	if mw != nil {
		return chiroute.FuncPC(mw) == m.wrapPC
	}
	_, isLayer := h.(*layer)
	return isLayer
}

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
			ev.Outcome = OutcomeCanceled
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
			ev.Outcome = OutcomeDegraded
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
			ev.Outcome = OutcomeUnavailable
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
		ev.Outcome = OutcomeAllowed
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
		ev.Outcome = OutcomeDenied
		if d.Exceeded {
			ev.Outcome = OutcomeExceeded
		}
		observeAll(st, &ev)
		meta.Write(w.Header(), rep.m.cfg.style, infos, index)
		rd := *d
		if d.Index >= 0 && d.Index < len(st.checks) && st.checks[d.Index].Rule.Algorithm == ratebudget.InFlight {
			rd.RetryAfter = leaseRetryAfter(rd.RetryAfter)
		}
		rep.m.cfg.onRefusal(w, r, rd)
	case d.Exceeded:
		ev.Outcome = OutcomeExceeded
		observeAll(st, &ev)
		meta.WriteCostExceeded(w, r, rep.m.cfg.style, infos, index, rep.cost)
	default:
		ev.Outcome = OutcomeDenied
		observeAll(st, &ev)
		meta.WriteTooManyRequests(w, r, rep.m.cfg.style, infos, index)
	}
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

// observeOuter shows ev to the observers of the layers whose checks are in st and of m,
// the layer that answers without a decision: the request's only event. When more than
// one of these layers has observers, they are shown a copy of the request that carries
// a delivery mark, so that an observer given to several of them (a metrics collector)
// can take the event once.
func observeOuter(st *stack, m *mw, ev *Event) {
	if observing(st.parts, m) > 1 {
		e := *ev
		var mark *delivery.Mark
		e.Request, mark = delivery.Request(ev.Request)
		mark.Next()
		ev = &e
	}
	for i := range st.parts {
		st.parts[i].m.observe(ev)
	}
	m.observe(ev)
}

// observeAll shows ev, an event of st's decision, to the observers of every layer of
// st, as one delivery of st's mark when it has one (its request is then the stack's
// marked copy).
func observeAll(st *stack, ev *Event) {
	if st.mark != nil {
		st.mark.Next()
		ev.Request = st.req
	}
	for i := range st.parts {
		st.parts[i].m.observe(ev)
	}
}

// observing counts the layers of parts, and extra unless nil, that have observers.
func observing(parts []part, extra *mw) int {
	n := 0
	for i := range parts {
		if len(parts[i].m.cfg.observers) > 0 {
			n++
		}
	}
	if extra != nil && len(extra.cfg.observers) > 0 {
		n++
	}
	return n
}

// decideEach is decide, asking a limiter that can report every check's outcome to write
// them into out (len(checks) elements). The outcomes returned are out, or nil when the
// limiter reports the decision's rule only.
func (m *mw) decideEach(ctx context.Context, checks []ratebudget.Check, out []ratebudget.Outcome) (ratebudget.Decision, []ratebudget.Outcome, time.Duration, error) {
	if m.each == nil {
		d, lat, err := m.decide(ctx, checks)
		return d, nil, lat, err
	}
	d, lat, err := m.decideWith(ctx, func(ctx context.Context) (ratebudget.Decision, error) {
		return m.each.AllowEach(ctx, checks, out)
	})
	if err != nil {
		return d, nil, lat, err
	}
	return d, out, lat, nil
}

// InputError is the error given to the error handler ([WithErrorHandler]) and to
// observers (Event.Err, OutcomeInvalid) for a request whose identity, scope or cost
// could not be determined. Nothing is counted for such a request, by any layer.
type InputError struct {
	// Part is what failed: "identity", "scope" or "cost".
	Part string
	// Rule is the rule whose key function failed; empty for the cost.
	Rule string
	// Reason is a client-facing explanation ("header X-Api-Key is missing or empty",
	// "cost must be a positive integer"): from keyfuncs.Reason when it knows the error,
	// a generic text for the part otherwise.
	Reason string
	// Err is the key or cost function's error; nil for a cost below 1.
	Err error
}

// Error names the rule, the part and the reason, then the underlying error, which may
// hold internal details (log it, do not send it).
func (e *InputError) Error() string {
	s := "ratebudget: "
	if e.Rule != "" {
		s += "rule " + e.Rule + ": "
	}
	s += e.Part + ": " + e.Reason
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns Err.
func (e *InputError) Unwrap() error { return e.Err }

// The parts of an [InputError].
const (
	partIdentity = "identity"
	partScope    = "scope"
	partCost     = "cost"
)

func inputError(part, rule string, err error, generic string) *InputError {
	reason, ok := keyfuncs.Reason(err)
	if !ok {
		reason = generic
	}
	return &InputError{Part: part, Rule: rule, Reason: reason, Err: err}
}

func (m *mw) invalid(w http.ResponseWriter, r *http.Request, st *stack, err *InputError) {
	ev := Event{Request: r, Outcome: OutcomeInvalid, Err: err}
	observeOuter(st, m, &ev)
	mount, built := errors.Is(err, keyfuncs.ErrNoRoutePattern), errors.Is(err, ratebudget.ErrInvalidConfig)
	// Not the client's fault: the limiter is mounted where no route is known, or a key
	// function was built wrong (keyfuncs.Header without a name, Join of nothing). Logged
	// also when a custom error handler answers: it answers the client, not the operator.
	switch {
	case mount && m.warnedMount.CompareAndSwap(false, true):
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: a rule's route scope found no route pattern; "+
			"mount the middleware where the route is known: on a chi router (r.Use, r.With, r.Group) or on the handler given to http.ServeMux.Handle, not around a ServeMux",
			slog.String("rule", err.Rule), slog.String("path", r.URL.Path))
	case built && m.warnedKey.CompareAndSwap(false, true):
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: a rule's key function was built wrong, so the route answers 500",
			slog.String("rule", err.Rule), slog.String("part", err.Part), slog.String("error", err.Err.Error()))
	}
	if m.cfg.onError != nil {
		m.cfg.onError(w, r, err)
		return
	}
	if mount || built {
		writeMisconfigured(w, r)
		return
	}
	headers.WriteInvalid(w, r, err.Part, err.Reason)
}
