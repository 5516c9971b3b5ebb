package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/chiroute"
	"github.com/ratebudget/ratebudget/internal/delivery"
	"github.com/ratebudget/ratebudget/internal/meta"
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
	// ruleOf is the rule of each check, shadowRuleOf of each shadow check: a layer's
	// checks are its rules but those merged into an earlier layer's check (see add).
	ruleOf, shadowRuleOf []*compiledRule
	pbuf                 [3]part
	cbuf                 [4]ratebudget.Check
	rbuf                 [4]*compiledRule
	infos                [4]meta.Info
	obuf                 [4]ratebudget.Outcome
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
	// values is the memory of the metadata headers' values for a stack of a layer's pool,
	// which the requests it serves share (they outlive the request, and are never
	// written again); nil for a stack of its own, whose values are allocated.
	values *meta.Values
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
	clear(st.ruleOf)
	clear(st.shadowRuleOf)
	st.decided, st.answered, st.settles = false, false, false
	st.parts, st.checks, st.ruleOf, st.shadowRuleOf = st.pbuf[:0], st.cbuf[:0], st.rbuf[:0], st.shadowRuleOf[:0]
	st.shadow, st.shadowParts, st.settle, st.req, st.mark, st.unasked = st.shadow[:0], st.shadowParts[:0], nil, nil, nil, nil
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
		ev := Event{Request: r, Result: Canceled, Err: ctx.Err()}
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

// addChecks appends the layer's checks to st, each with the rule it is decided under
// (a rule with plans resolved to the request's plan; one on an Unlimited plan adds no
// check). It reports false when the request has been answered: an undeterminable
// identity, scope, plan or cost (400), or a cost above a rule's capacity (413).
func (m *mw) addChecks(w http.ResponseWriter, r *http.Request, st *stack) (ok bool) {
	defer func() {
		if !ok {
			st.answered = true
		}
	}()
	cost, ok := m.cost(w, r, st)
	if !ok {
		return false
	}
	from, sfrom := len(st.checks), len(st.shadow)
	for i := range m.rules {
		cr, ck, ierr := m.check(r, &m.rules[i], cost)
		switch {
		case ierr != nil:
			st.truncate(from, sfrom)
			m.invalid(w, r, st, ierr)
			return false
		case cr == nil:
			continue // an Unlimited plan: the rule is not checked
		case ck.Cost > cr.limit && !cr.shadow:
			// e.g. a Content-Length above a byte budget, or a cost above a plan's
			// capacity (only these can exceed a capacity here: see cost).
			index := len(st.checks)
			st.truncate(from, sfrom)
			m.exceeded(w, r, st, ck.Cost, cr, index)
			return false
		}
		if outer := st.add(m, cr, ck, &sfrom); outer != nil {
			st.truncate(from, sfrom)
			m.conflict(w, r, st, outer, cr)
			return false
		}
	}
	st.parts = append(st.parts, part{m: m, from: from, to: len(st.checks), cost: cost})
	if len(st.shadow) > sfrom {
		st.shadowParts = append(st.shadowParts, part{m: m, from: sfrom, to: len(st.shadow), cost: cost})
	}
	st.settles = st.settles || m.settles
	return true
}

// check returns the rule r is decided under for cr (cr, or with plans the variant of
// r's plan; nil on an Unlimited plan) and r's check of it, or the error of a key or
// plan that could not be determined. cost is the layer's cost of r.
func (m *mw) check(r *http.Request, cr *compiledRule, cost int64) (*compiledRule, ratebudget.Check, *InputError) {
	if cr.plans != nil {
		var ierr *InputError
		if cr, ierr = cr.resolve(r); ierr != nil {
			return nil, ratebudget.Check{}, ierr
		}
		if cr.unlimited {
			return nil, ratebudget.Check{}, nil
		}
	}
	id, scope, ierr := cr.keys(r)
	if ierr != nil {
		return nil, ratebudget.Check{}, ierr
	}
	c := cost
	if m.settles {
		c = cr.reserve(r, cost)
	}
	return cr, ratebudget.Check{Rule: cr.rule, Identity: id, Scope: scope, Cost: c}, nil
}

// truncate drops the checks of the layer whose checks begin at from (enforced) and sfrom
// (shadow).
func (st *stack) truncate(from, sfrom int) {
	clear(st.checks[from:])
	clear(st.ruleOf[from:])
	clear(st.shadow[sfrom:])
	clear(st.shadowRuleOf[sfrom:])
	st.checks, st.ruleOf = st.checks[:from], st.ruleOf[:from]
	st.shadow, st.shadowRuleOf = st.shadow[:sfrom], st.shadowRuleOf[:sfrom]
}

// add adds check c of rule cr, a rule of layer m, whose shadow checks begin at *sfrom.
// Rules of one name on one limiter name one budget (per identity and scope), so when an
// earlier layer of st has a check of c's budget under a rule defined alike (see alike),
// the two are one check, decided once: the earlier one, its cost the larger of the two,
// enforced when either is (an earlier shadow check is dropped, and c enforced in its
// stead). Otherwise c is appended. add returns the rule of an earlier layer that defines
// c's rule name differently on m's limiter, whatever its keys, and adds nothing then.
func (st *stack) add(m *mw, cr *compiledRule, c ratebudget.Check, sfrom *int) (outer *compiledRule) {
	k, shadow, outer := st.earlier(m, cr, &c)
	switch {
	case outer != nil:
		return outer
	case k >= 0 && !shadow:
		st.checks[k].Cost = max(st.checks[k].Cost, c.Cost)
		return nil
	case k >= 0 && cr.shadow:
		st.shadow[k].Cost = max(st.shadow[k].Cost, c.Cost)
		return nil
	case k >= 0:
		c.Cost = max(c.Cost, st.shadow[k].Cost)
		st.dropShadow(k)
		*sfrom--
	}
	if cr.shadow {
		st.shadow, st.shadowRuleOf = append(st.shadow, c), append(st.shadowRuleOf, cr)
	} else {
		st.checks, st.ruleOf = append(st.checks, c), append(st.ruleOf, cr)
	}
	return nil
}

// earlier looks among the checks of st's layers (not yet c's, of layer m) on m's limiter
// for those of c's rule name. It returns the index of c's budget (same identity and
// scope) in st.checks, or in st.shadow with shadow true, -1 when there is none; or the
// rule of one defined differently (outer).
func (st *stack) earlier(m *mw, cr *compiledRule, c *ratebudget.Check) (k int, shadow bool, outer *compiledRule) {
	k = -1
	for pass, parts := range [2][]part{st.parts, st.shadowParts} {
		checks, rules := st.checks, st.ruleOf
		if pass == 1 {
			checks, rules = st.shadow, st.shadowRuleOf
		}
		for _, p := range parts {
			if p.m.limKey != m.limKey {
				continue
			}
			for i := p.from; i < p.to; i++ {
				switch o := &checks[i]; {
				case o.Rule.Name != c.Rule.Name:
				case !alike(rules[i], cr):
					return -1, false, rules[i]
				case o.Identity == c.Identity && o.Scope == c.Scope:
					k, shadow = i, pass == 1
				}
			}
		}
	}
	return k, shadow, nil
}

// alike reports whether a and b define a budget alike: the same rule (algorithm, limit,
// window, burst) counted the same way.
func alike(a, b *compiledRule) bool {
	return a.rule == b.rule && a.counts.kind == b.counts.kind
}

// dropShadow drops shadow check k of an earlier layer, which an enforced check of the
// same budget replaces, and the shadow part it leaves empty.
func (st *stack) dropShadow(k int) {
	st.shadow = slices.Delete(st.shadow, k, k+1)
	st.shadowRuleOf = slices.Delete(st.shadowRuleOf, k, k+1)
	parts := st.shadowParts[:0]
	for _, p := range st.shadowParts {
		if p.from > k {
			p.from--
		}
		if p.to > k {
			p.to--
		}
		if p.from < p.to {
			parts = append(parts, p)
		}
	}
	clear(st.shadowParts[len(parts):])
	st.shadowParts = parts
}

// cost returns the layer's cost of r. When it cannot be determined (400), or exceeds
// the capacity of a rule it is charged to (413), it answers r and reports false; st
// holds the outer layers' checks.
func (m *mw) cost(w http.ResponseWriter, r *http.Request, st *stack) (int64, bool) {
	cost := int64(1)
	if m.cfg.cost != nil {
		c, err := m.cfg.cost(r)
		switch {
		case err != nil:
			m.invalid(w, r, st, inputError(partCost, "", err, "cost could not be determined"))
			return 0, false
		case c < 1:
			m.invalid(w, r, st, &InputError{Part: partCost, Reason: "cost must be a positive integer"})
			return 0, false
		}
		cost = c
	}
	if m.layerCost && !m.planned && cost > m.rules[m.minCap].limit {
		// No store can admit it, and no store need be asked: decided here, so that a
		// hostile cost never reaches the store, its breaker or the failure policy. (In a
		// layer with plans, which rules are checked, and their capacities, depend on the
		// request's plans: addChecks decides it, before the store too.)
		m.exceeded(w, r, st, cost, &m.rules[m.minCap], m.checksBefore(st, m.minCap))
		return 0, false
	}
	return cost, true
}

// keys returns the rule's identity and scope of r, or the error of one that could not be
// determined (an empty key included).
func (cr *compiledRule) keys(r *http.Request) (id, scope string, _ *InputError) {
	id, err := cr.identity(r)
	if err == nil && id == "" {
		err = errEmptyIdentity
	}
	if err != nil {
		return "", "", inputError(partIdentity, cr.rule.Name, err, "identity could not be determined")
	}
	if cr.scope != nil {
		scope, err = cr.scope(r)
		if err == nil && scope == "" {
			err = errEmptyScope
		}
		if err != nil {
			return "", "", inputError(partScope, cr.rule.Name, err, "scope could not be determined")
		}
	}
	return id, scope, nil
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
