// Package middleware mounts ratebudget limits on HTTP handlers: a constructor that returns
// func(http.Handler) http.Handler, which works with chi's r.Use, r.With, r.Group and
// chi.Chain, and wraps any net/http handler.
//
// For every request the middleware computes each rule's identity and scope (package
// keyfuncs), asks the [ratebudget.Limiter] to decide all rules at once (all-or-nothing),
// writes budget metadata (package headers) and either calls the next handler or refuses:
//
//	condition                                 status  headers
//	admitted                                  handler's  metadata
//	a rule's budget is exhausted              429     metadata, Retry-After, Cache-Control: no-store
//	the cost exceeds a rule's capacity        413     Cache-Control: no-store (no Retry-After: waiting cannot help;
//	                                                  decided before the limiter is asked, so no metadata)
//	identity, scope, plan or cost             400     Cache-Control: no-store; the body names identity, scope, plan
//	  undeterminable (an empty key included)          or cost and a reason ("header X-Api-Key is missing or empty")
//	route scope where no route is known       500     Cache-Control: no-store, one log line on how to mount it
//	  (outside any router)                            (keyfuncs.RoutePattern's error: a mounting mistake)
//	the limiter rejects the checks as invalid 500     Cache-Control: no-store, one log line (a *ratebudget.ConfigError:
//	  or stacked layers define one rule name          never a store failure)
//	  differently (see Stacking)
//	store unavailable (default: fail-closed)  503     Retry-After: 1, Cache-Control: no-store
//	store unavailable, WithFailOpen           handler's  none (the event is Degraded)
//	store unavailable, WithLocalFallback      handler's or 429 from the per-replica budget
//	request context already canceled          nothing is written, nothing is spent
//	request canceled while the store decides  nothing is written; the store may have spent (uncertain)
//	  (its client gone, or its own deadline   (Canceled): no policy applies, the breaker does not count it
//	  passed)
//
// 5xx answers from the handler itself are passed through untouched.
//
// # Stacking
//
// Any number of layers on one request (an r.Use on a group and an r.With on a route,
// nested groups, chi.Chain, plain wrapping, a top-level r.Use with r.With routes) make
// one decision: each layer computes its checks where it is mounted, the innermost decides
// them all in one Limiter.Allow call (one script call per hash-slot group on Redis; one
// in all with lua.WithOneServer), and a refusal, 400 or 413 by any layer leaves every
// layer's budget as it was. The metadata and the refusal describe the most restrictive
// rule of all layers, but a layer with headers.None keeps its rules out of the fields and
// the refusal body that another layer's style writes ([WithHeaders]). A layer hands its
// checks on when the next thing to run is another layer: its next handler, or the first
// handler of the route a chi router will run. A handler of another kind between two
// layers (a logger, an authentication middleware) may answer on its own, so the layer
// before it decides first, and the one after it decides again: two decisions.
//
// A rule's name names its budget on a limiter, so stacked layers that have a rule of one
// name on one limiter, defined alike (Algorithm, Limit, Window, Burst and Counts), with
// the same identity and scope for the request, have one budget, decided once: the same
// LimitByIP in r.Use and r.With spends one unit per request, and the metadata lists it
// once. The check spends the larger of the layers' costs, and is enforced when either
// layer enforces it (Rule.Shadow); the outer layer's settings (headers, refusal handler,
// local fallback) apply to it. Stacked layers that define one rule name differently on
// one limiter (a Limit of 100 in one, 50 in the other) are a configuration mistake found
// when a request first passes through both: every such request is answered 500 before
// anything is spent, its event is Invalid with a *ratebudget.ConfigError naming the
// field, and the first is logged with both definitions.
//
// Layers on different limiters (one in process, one on Redis) cannot decide in one call:
// they decide limiter by limiter, outermost first, each all-or-nothing. A refusal stops
// the walk, so later limiters spend nothing; earlier limiters' spend is given back when
// they can settle (their decisions are then reserved: memory.Limiter and lua.Limiter can,
// see "Settling a decision" in package ratebudget), and stays spent otherwise. On a store
// failure the strictest policy of the failed limiter's layers applies (fail-closed, then
// local fallback, then fail-open; a layer whose rules are all in shadow mode has no say);
// under fail-open and local fallback the other limiters still decide their layers' rules,
// and a refusal gives back the local fallback's spend too. An admission with a limiter
// failed under fail-open is Degraded, without metadata, even when a local fallback
// decided another failed limiter's layers (Event.Fallback is then set too).
//
// # Failure handling
//
// A limiter that does I/O (any whose InProcess method, if it has one, does not report
// true, as memory.Limiter's does) gets a deadline per decision
// ([WithTimeout], default 50ms) and a circuit breaker ([WithBreaker]: opens when the
// store has replied to no call for 100ms, or when half of at least 20 decisions in the
// last 10s failed; while open it sends the store no decision and probes it with the
// limiter's Ping, off the request path, when the limiter has one). A store error
// is never read as an empty budget: the store-error policy decides what is admitted
// (default fail-closed: 503 with Retry-After: 1; [WithFailOpen]: everyone;
// [WithLocalFallback]: a per-replica share of each budget, in process). Only store errors take the policy and count toward the breaker: a request's fault (a bad
// identity or cost, a cost above a rule's capacity), a request whose context ended
// (canceled, or its own deadline passed, also when the store's client returns before
// the context is marked done) and a configuration error never do.
//
// # Plans
//
// A rule's Limit, Window and Burst may come from the request's plan ([Rule.Plans],
// [Rule.Plan], [Plan]): a tenant's tier looked up by its API key, with the plan's name in
// RateLimit-Policy (parameter ratebudget-plan) and in a refusal's body. Plans are
// resolved before the decision, so a request refused by its plan spends nothing of the
// other rules and layers (a per-IP budget), and their metadata is written as without
// plans. The budget is the rule's, not the plan's: a tenant moved to another plan keeps
// what it spent (docs/RULE-CHANGES.md, "Plans").
//
// # In-flight leases and timeouts
//
// An InFlight rule's lease is held while the handler the middleware wraps runs. Mount
// the middleware inside [http.TimeoutHandler] (TimeoutHandler(limit(h), ...)), not
// around it: TimeoutHandler answers at its deadline while the handler it wraps runs on,
// so a lease taken outside it is released when the client gets the 503, and another
// request is admitted beside the one still running.
package middleware

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/chiroute"
	"github.com/ratebudget/ratebudget/internal/meta"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/memory"
)

// Rule is a budget and how requests map to it. Identity and Scope have the shape of
// package keyfuncs's key functions (and of httprate.KeyFunc), so extractors from either
// plug in.
type Rule struct {
	ratebudget.Rule
	// Identity gives whose budget a request spends (required). Use keyfuncs.Global() for a
	// service-wide budget. An error or an empty key answers the request with 400 without
	// counting it (see WithErrorHandler): a missing header never merges clients into one
	// budget.
	Identity func(*http.Request) (string, error)
	// Scope narrows the budget to a part of the service, e.g. keyfuncs.RoutePattern().
	// Nil means the budget is shared by every route that uses a rule of this name. An
	// error or an empty key answers 400, as for Identity.
	Scope func(*http.Request) (string, error)
	// Counts is what an admitted request is charged under this rule (see [Counting]).
	// The zero value counts every admitted attempt at the layer's cost ([WithCost]).
	// Contracts other than attempts, and InFlight rules, need a limiter that can settle
	// its decisions (Reserve, Settle and Renew, as memory.Limiter and lua.Limiter have).
	Counts Counting
	// Shadow decides and observes the rule without enforcing it: its budget is spent as
	// it would be if it were enforced, events report what it would have refused
	// (Event.Shadow), but it never refuses a request and adds no metadata headers. A
	// rule keeps its budget when it goes from shadow to enforced: the budget is named by
	// the rule's name, not by its mode.
	Shadow bool
	// Plans are the plans the rule knows (see [Plan]): a request on one is decided under
	// the plan's Limit, Window and Burst, shadowed or left out as the plan says, in one
	// decision with the other rules and layers. Nil: every request is decided under the
	// rule's own values. Plan is required with Plans.
	Plans []Plan
	// Plan gives the name of the plan a request is on (e.g. a tenant's plan looked up by
	// its API key). "" means the rule's own values; a name not among Plans too, and the
	// first such request is logged (once per rule). An error answers the request with 400,
	// as for Identity (the InputError's Part is "plan"). Called once per request and rule,
	// concurrently: it must be safe for that, and fast (a map lookup, not a database).
	Plan func(*http.Request) (string, error)
}

type compiledRule struct {
	rule      ratebudget.Rule
	local     ratebudget.Rule
	limit     int64  // timerule.Capacity(rule), the Limit its decisions report
	limitText string // limit in decimal, for the metadata headers
	identity  func(*http.Request) (string, error)
	scope     func(*http.Request) (string, error)
	counts    Counting
	shadow    bool
	unit      string // the quota unit in the metadata, when the rule's contract sets one
	plans     *plans // the rule's plans; nil without plans, and in a plan's variant
	plan      string // the plan's name in a plan's variant, "" otherwise
	unlimited bool   // a plan's variant that leaves the rule out of the decision
}

type mw struct {
	cfg      config
	limiter  ratebudget.Limiter
	io       bool // the limiter does I/O: deadline and breaker apply
	rules    []compiledRule
	minCap   int // index of the rule with the smallest capacity
	fallback *memory.Limiter
	breaker  *breaker
	each     reporter // the limiter, when it reports every check's outcome
	settler  settler  // the limiter, when its decisions can be settled
	// settles is set when a rule's checks must be settled once the handler returns;
	// layerCost when a rule without plans is charged the layer's cost (minCap is then
	// among those); planned when a rule has plans.
	settles, layerCost, planned bool
	limKey                      any            // the limiter, or a unique stand-in when it is not comparable
	stacks                      sync.Pool      // *stack, for requests through this layer alone
	probe                       chiroute.Probe // recognises a chi router's routing step
	routes                      chiroute.Cache // what chi routers run after routing
	wrapPC                      uintptr        // the code pointer of every layer's middleware function
	// warnedMount is set once the mounting mistake of a route scope has been logged,
	// warnedAhead once a wrong look-ahead in a router has, warnedConfig once a limiter's
	// rejection of the checks as invalid has, warnedKey once a key function built wrong
	// has, warnedConflict once stacked layers' definitions of one rule name that differ
	// have.
	warnedMount, warnedAhead, warnedConfig, warnedKey, warnedConflict atomic.Bool
}

// New returns middleware that spends each request's cost from every rule's budget in lim.
// Rules and options are validated here; an invalid one returns a *ratebudget.ConfigError
// naming the field or option (a rule without a name by its index, "rules[1]"; a plan's
// field by the rule's name and the plan's index, "Plans[1].Limit"), and so does a
// limiter that cannot serve the rules (field "limiter": one that cannot settle, for
// rules that settle).
//
// The middleware, and every handler it wraps, is safe for concurrent use. The functions
// it is given (the rules' Identity and Scope, WithCost, the Counting callbacks, the
// observers and handlers) are called concurrently for concurrent requests, and must be
// safe for that.
func New(lim ratebudget.Limiter, rules []Rule, opts ...Option) (func(http.Handler) http.Handler, error) {
	m, err := build(lim, rules, opts)
	if err != nil {
		return nil, err
	}
	return m.wrap, nil
}

func build(lim ratebudget.Limiter, rules []Rule, opts []Option) (*mw, error) {
	if lim == nil {
		return nil, configErr("limiter", "must not be nil")
	}
	m := &mw{limiter: lim}
	if err := m.configure(opts); err != nil {
		return nil, err
	}
	if err := m.compile(rules); err != nil {
		return nil, err
	}
	if err := m.use(lim); err != nil {
		return nil, err
	}
	m.stacks.New = func() any {
		st := &stack{values: new(meta.Values)}
		st.reset()
		return st
	}
	m.probe = chiroute.NewProbe()
	m.wrapPC = chiroute.FuncPC(m.wrap)
	return m, nil
}

// configure sets m.cfg: the defaults, then opts in order.
func (m *mw) configure(opts []Option) error {
	m.cfg = config{
		style:   headers.XRateLimit,
		timeout: 50 * time.Millisecond,
		tuning:  defaultBreakerTuning,
	}
	m.cfg.breaker, _ = Breaker{}.withDefaults()
	for _, o := range opts {
		if o == nil {
			return configErr("options", "must not contain nil")
		}
		if err := o(&m.cfg); err != nil {
			return err
		}
	}
	return nil
}

// compile validates rules and sets m.rules, and what the layer derives from them (see
// index). The configuration must be set.
func (m *mw) compile(rules []Rule) error {
	plain := make([]ratebudget.Rule, len(rules))
	for i, r := range rules {
		plain[i] = r.Rule
	}
	if err := ratebudget.ValidateRules(plain); err != nil {
		return err
	}
	for _, r := range rules {
		if r.Identity == nil {
			return &ratebudget.ConfigError{Rule: r.Name, Field: "Identity", Problem: "must not be nil (use keyfuncs.Global() for a service-wide budget)"}
		}
		cr := compiledRule{rule: r.Rule, identity: r.Identity, scope: r.Scope, limit: timerule.Capacity(&r.Rule), counts: r.Counts, shadow: r.Shadow}
		cr.limitText = strconv.FormatInt(cr.limit, 10)
		if err := cr.compileCounts(); err != nil {
			return err
		}
		replicas := 0
		if m.cfg.policy == localFallback {
			replicas = m.cfg.replicas
			cr.local = localRule(r.Rule, replicas)
		}
		if err := cr.compilePlans(&r, replicas); err != nil {
			return err
		}
		m.rules = append(m.rules, cr)
	}
	m.index()
	return nil
}

// index sets what m derives from its rules: settles, planned, and the rule of smallest
// capacity that the layer's cost is charged to (minCap, layerCost), among the rules
// without plans (a rule with plans has its capacity per request).
func (m *mw) index() {
	m.minCap = -1
	for i := range m.rules {
		cr := &m.rules[i]
		if cr.settles() {
			m.settles = true
		}
		if cr.plans != nil {
			m.planned = true
			continue
		}
		if cr.counts.layerCost() && !cr.shadow && cr.rule.Algorithm != ratebudget.InFlight && (m.minCap < 0 || cr.limit < m.rules[m.minCap].limit) {
			m.minCap = i
		}
	}
	m.layerCost = m.minCap >= 0
	if !m.layerCost {
		m.minCap = 0
	}
}

// use sets how m asks lim: through its optional interfaces (settler, reporter, pinger,
// inProcess), under a deadline and a breaker when it does I/O, with a local fallback
// under that policy. The rules and the configuration must be set.
func (m *mw) use(lim ratebudget.Limiter) error {
	m.settler, _ = lim.(settler)
	if m.settles && m.settler == nil {
		return configErr("limiter", "must have the methods Reserve, Settle and Renew (as memory.Limiter and lua.Limiter have) for rules that count other than attempts or that are InFlight")
	}
	ip, ok := lim.(inProcess)
	m.io = !ok || !ip.InProcess()
	if m.io && !m.cfg.breaker.Disabled {
		var ping func(context.Context) error
		if p, ok := lim.(pinger); ok {
			ping = p.Ping
		}
		m.breaker = newBreaker(m.cfg.breaker, m.cfg.tuning, m.cfg.timeout, ping)
	}
	if m.cfg.policy == localFallback {
		fb, err := memory.New()
		if err != nil {
			return err
		}
		m.fallback = fb
	}
	if s := m.cfg.style; s != headers.XRateLimit && s != headers.None {
		// Every rule's outcome is asked for only when the RateLimit fields list them: a
		// limiter may answer Allow more cheaply (the lua limiter's refusal cache repeats
		// a refusal to any request that names the refused budget, but its outcomes only
		// to the same checks).
		m.each, _ = lim.(reporter)
	}
	m.limKey = lim
	if !reflect.TypeOf(lim).Comparable() {
		m.limKey = new(byte) // a func or map limiter: equal only to itself through this layer
	}
	return nil
}

// inProcess is implemented by limiters that decide without I/O (memory.Limiter): they
// get no per-decision deadline and no circuit breaker.
type inProcess interface{ InProcess() bool }

// reporter is implemented by limiters that report every check's outcome, as "Reporting
// every check" in package ratebudget says (memory.Limiter and lua.Limiter do).
type reporter interface {
	AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
}

// settler is implemented by limiters whose decisions can be reserved, then settled and
// their leases renewed, as "Settling a decision" in package ratebudget says
// (memory.Limiter and lua.Limiter do).
type settler interface {
	ratebudget.Limiter
	Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
	Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error
	Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error
}
