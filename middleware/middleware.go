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
//	identity, scope or cost undeterminable    400     Cache-Control: no-store; the body names identity, scope or cost
//	  (an empty key included)                         and a reason ("header X-Api-Key is missing or empty")
//	route scope where no route is known       500     Cache-Control: no-store, one log line on how to mount it
//	  (outside any router)                            (keyfuncs.ErrNoRoutePattern: a mounting mistake)
//	the limiter rejects the checks as invalid 500     Cache-Control: no-store, one log line (a *ratebudget.ConfigError:
//	  (stacked layers with rules of one name)         never a store failure)
//	store unavailable (default: fail-closed)  503     Retry-After, Cache-Control: no-store
//	store unavailable, WithFailOpen           handler's  none (the event is OutcomeDegraded)
//	store unavailable, WithLocalFallback      handler's or 429 from the per-replica budget
//	request context already canceled          nothing is written, nothing is spent
//	request canceled while the store decides  nothing is written; the store may have spent (uncertain)
//	  (its client gone, or its own deadline   (OutcomeCanceled): no policy applies, the breaker does not count it
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
// Layers on different limiters (one in process, one on Redis) cannot decide in one call: they
// decide limiter by limiter, outermost first, each all-or-nothing. A refusal stops the
// walk, so later limiters spend nothing; earlier limiters' spend is given back when they
// implement ratebudget.Settler (their decisions are then reserved), and stays spent
// otherwise. On a store failure the strictest policy of the
// failed limiter's layers applies (fail-closed, then local fallback, then fail-open; a
// layer whose rules are all in shadow mode has no say); under fail-open and local fallback
// the other limiters still decide their layers' rules, and a refusal gives back the
// local fallback's spend too. An admission with a limiter failed under fail-open is
// OutcomeDegraded, without metadata, even when a local fallback decided another failed
// limiter's layers (Event.Fallback is then set too).
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
// (default fail-closed: 503; [WithFailOpen]: everyone; [WithLocalFallback]: a
// per-replica share of each budget, in process). Only store errors take the policy and count toward the breaker: a request's fault (a bad
// identity or cost, a cost above a rule's capacity), a request whose context ended
// (canceled, or its own deadline passed, also when the store's client returns before
// the context is marked done) and a configuration error never do.
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
	"errors"
	"log/slog"
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
	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/memory"
)

// Rule is a budget and how requests map to it. Identity and Scope have the shape of
// keyfuncs.KeyFunc (and of httprate.KeyFunc), so extractors from either plug in.
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
	// Contracts other than attempts, and InFlight rules, need a limiter that implements
	// ratebudget.Settler.
	Counts Counting
	// Shadow decides and observes the rule without enforcing it: its budget is spent as
	// it would be if it were enforced, events report what it would have refused
	// (Event.Shadow), but it never refuses a request and adds no metadata headers. A
	// rule keeps its budget when it goes from shadow to enforced: the budget is named by
	// the rule's name, not by its mode.
	Shadow bool
}

// Outcome classifies a decision for observers, metrics and logs.
type Outcome uint8

const (
	// OutcomeAllowed: admitted by the limiter (or by the local fallback: Event.Fallback).
	OutcomeAllowed Outcome = iota
	// OutcomeDenied: refused with 429 (by the limiter or the local fallback).
	OutcomeDenied
	// OutcomeExceeded: refused with 413, the cost exceeds a rule's capacity.
	OutcomeExceeded
	// OutcomeDegraded: admitted without a decision because the store failed under fail-open
	// (for stacked layers, a failed limiter's layers under fail-open were not enforced;
	// Event.Fallback tells whether a local fallback decided another's).
	OutcomeDegraded
	// OutcomeUnavailable: refused with 503 because the store failed under fail-closed.
	OutcomeUnavailable
	// OutcomeInvalid: identity, scope or cost could not be determined (answered by the
	// error handler), or the limiter rejected the checks as invalid (a
	// *ratebudget.ConfigError, answered 500); nothing counted.
	OutcomeInvalid
	// OutcomeCanceled: the request's context ended (its client went away, or its deadline
	// passed) before the decision; nothing written. A store failure that comes once the
	// request's deadline has passed is such a request's, not a store failure: no policy
	// applies, and the breaker does not count it.
	OutcomeCanceled
	// OutcomeSettleFailed: not a decision, but the store failing to settle an admitted
	// request's reservation once its handler returned (or to give it back because a
	// later limiter refused the request), or to renew its in-flight leases while the
	// handler ran. It comes in an event of its own for the observers of every layer of
	// the request, as the decision's does, after it (a give-back's, before the
	// refusal's), with Err the store error (a *ratebudget.StoreError), Latency the failed call's time and
	// Decision zero. The reservation stays spent as reserved (an overcount, and an
	// extra above it is not charged), and leases not released or renewed expire after
	// their rule's Window; after an uncertain error (StoreError.Uncertain) the settle may
	// also have been applied. A renewal's event is observed on the renewal timer's
	// goroutine, while the handler runs. A lease found expired when renewed
	// (ratebudget.ErrLeaseLost) is not a failure of the store and is not reported. Such
	// failures do not count toward the breaker.
	OutcomeSettleFailed
)

var outcomeNames = [...]string{"allowed", "denied", "exceeded", "degraded", "unavailable", "invalid", "canceled", "settle_failed"}

// String returns the outcome's metric label: "allowed", "denied", "exceeded", "degraded",
// "unavailable", "invalid", "canceled" or "settle_failed"; "Outcome(n)" for a value
// that is none of the named ones.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Event describes one decision, or one failed settle of an admitted request
// ([OutcomeSettleFailed]), for observers ([WithObserver]).
type Event struct {
	// Request is the request decided on. Observers must not retain it. When more than
	// one stacked layer of the request has observers, it is a shallow copy of that
	// request, the same for every event of the decision and every layer, whose context
	// also carries what lets package metrics count each event once.
	Request *http.Request
	// Outcome classifies the decision (or the failed settle) for metrics and logs.
	Outcome Outcome
	// Decision is the limiter's (or the local fallback's) decision; zero when none was
	// made. For stacked layers it is the decision of every layer's checks, and every
	// layer's observers see it; Decision.Index counts their checks, outermost first.
	Decision ratebudget.Decision
	// Fallback is true when the local fallback decided because the store could not. For
	// stacked layers on several limiters, it decided a failed limiter's layers, and
	// another limiter may have refused.
	Fallback bool
	// Err is the store error (a *ratebudget.StoreError, for OutcomeDegraded,
	// OutcomeUnavailable, OutcomeSettleFailed and fallback decisions, for the decision
	// of stacked layers' other limiters while one failed, and for an admission whose
	// shadow decision failed (see Shadow); the last one when several failed) or the
	// key-function error or the limiter's *ratebudget.ConfigError (OutcomeInvalid). Its
	// text may hold internal details: log it, do not send it.
	Err error
	// Latency is the time the limiter took to answer, error or not (zero when it was not
	// asked, e.g. with the breaker open). For a fallback decision it is the failed store
	// call's time; the local decision itself takes well under a microsecond. For
	// stacked layers on several limiters, and for an admission with a shadow decision
	// (rules in shadow mode), it is the sum of the calls' times.
	Latency time.Duration
	// Shadow is the decision of the rules in shadow mode ([Rule.Shadow]), made once the
	// enforced rules admitted the request: all-or-nothing among a layer's shadow rules,
	// as if they were enforced (stacked layers decide their shadow rules layer by
	// layer). Zero when the request has no shadow rule, or the enforced rules did not
	// admit it. Shadow.Allowed false with Shadow.Rule set is a request the shadow rules
	// would have refused; it was served all the same. A store
	// failure of a shadow decision leaves Shadow zero (without the failed layer's
	// decision when stacked layers have shadow rules) and sets Err when nothing else
	// did: shadow rules never change a response, and their failures are observed.
	Shadow ratebudget.Decision
}

type compiledRule struct {
	rule      ratebudget.Rule
	local     ratebudget.Rule
	limit     int64  // rule.Capacity(), the Limit its decisions report
	limitText string // limit in decimal, for the metadata headers
	identity  func(*http.Request) (string, error)
	scope     func(*http.Request) (string, error)
	counts    Counting
	shadow    bool
	unit      string // the quota unit in the metadata, when the rule's contract sets one
}

type mw struct {
	cfg      config
	limiter  ratebudget.Limiter
	io       bool // the limiter does I/O: deadline and breaker apply
	rules    []compiledRule
	minCap   int // index of the rule with the smallest capacity
	fallback *memory.Limiter
	breaker  *breaker
	each     ratebudget.Reporter // the limiter, when it reports every check's outcome
	settler  ratebudget.Settler  // the limiter, when its decisions can be settled
	// enforced lists the indexes of the rules not in shadow mode, in order (nil when
	// every rule is enforced), shadowed the others.
	enforced, shadowed []int
	// settles is set when a rule's checks must be settled once the handler returns;
	// layerCost when a rule is charged the layer's cost (minCap is then among those).
	settles, layerCost bool
	limKey             any            // the limiter, or a unique stand-in when it is not comparable
	stacks             sync.Pool      // *stack, for requests through this layer alone
	probe              chiroute.Probe // recognises a chi router's routing step
	routes             chiroute.Cache // what chi routers run after routing
	wrapPC             uintptr        // the code pointer of every layer's middleware function
	// warnedMount is set once the mounting mistake of a route scope has been logged,
	// warnedAhead once a wrong look-ahead in a router has, warnedConfig once a limiter's
	// rejection of the checks as invalid has, warnedKey once a key function built wrong
	// has.
	warnedMount, warnedAhead, warnedConfig, warnedKey atomic.Bool
}

// New returns middleware that spends each request's cost from every rule's budget in lim.
// Rules and options are validated here; an invalid one returns a *ratebudget.ConfigError
// naming the field or option (a rule without a name by its index, "rules[1]"), and so
// does a limiter that cannot serve the rules (field "limiter": one that is not a ratebudget.Settler for rules that settle).
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
	m.cfg = config{
		timeout:    50 * time.Millisecond,
		retryAfter: time.Second,
	}
	m.cfg.breaker, _ = Breaker{}.withDefaults()
	for _, o := range opts {
		if o == nil {
			return nil, configErr("options", "must not contain nil")
		}
		if err := o(&m.cfg); err != nil {
			return nil, err
		}
	}
	plain := make([]ratebudget.Rule, len(rules))
	for i, r := range rules {
		plain[i] = r.Rule
	}
	if err := ratebudget.ValidateRules(plain); err != nil {
		return nil, err
	}
	for _, r := range rules {
		if r.Identity == nil {
			return nil, &ratebudget.ConfigError{Rule: r.Name, Field: "Identity", Problem: "must not be nil (use keyfuncs.Global() for a service-wide budget)"}
		}
		cr := compiledRule{rule: r.Rule, identity: r.Identity, scope: r.Scope, limit: r.Rule.Capacity(), counts: r.Counts, shadow: r.Shadow}
		cr.limitText = strconv.FormatInt(cr.limit, 10)
		if err := cr.compileCounts(); err != nil {
			return nil, err
		}
		if m.cfg.policy == localFallback {
			cr.local = localRule(r.Rule, m.cfg.replicas)
		}
		m.rules = append(m.rules, cr)
	}
	m.minCap = -1
	for i := range m.rules {
		cr := &m.rules[i]
		if cr.settles() {
			m.settles = true
		}
		if cr.shadow {
			m.shadowed = append(m.shadowed, i)
		} else {
			m.enforced = append(m.enforced, i)
		}
		if cr.counts.layerCost() && !cr.shadow && cr.rule.Algorithm != ratebudget.InFlight && (m.minCap < 0 || cr.limit < m.rules[m.minCap].limit) {
			m.minCap = i
		}
	}
	m.layerCost = m.minCap >= 0
	if !m.layerCost {
		m.minCap = 0
	}
	if m.shadowed == nil {
		m.enforced = nil // every rule is enforced: checks map to rules one to one
	}
	m.settler, _ = lim.(ratebudget.Settler)
	if m.settles && m.settler == nil {
		return nil, configErr("limiter", "must implement ratebudget.Settler for rules that count other than attempts or that are InFlight")
	}
	ip, ok := lim.(inProcess)
	m.io = !ok || !ip.InProcess()
	if m.io && !m.cfg.breaker.Disabled {
		var ping func(context.Context) error
		if p, ok := lim.(pinger); ok {
			ping = p.Ping
		}
		m.breaker = newBreaker(m.cfg.breaker, m.cfg.timeout, ping)
	}
	if m.cfg.policy == localFallback {
		fb, err := memory.New()
		if err != nil {
			return nil, err
		}
		m.fallback = fb
	}
	if s := m.cfg.style; s != headers.XRateLimit && s != headers.None {
		// Every rule's outcome is asked for only when the RateLimit fields list them: a
		// limiter may answer Allow more cheaply (the lua limiter's refusal cache repeats
		// a refusal to any request that names the refused budget, but its outcomes only
		// to the same checks).
		m.each, _ = lim.(ratebudget.Reporter)
	}
	m.limKey = lim
	if !reflect.TypeOf(lim).Comparable() {
		m.limKey = new(byte) // a func or map limiter: equal only to itself through this layer
	}
	m.stacks.New = func() any {
		st := new(stack)
		st.reset()
		return st
	}
	m.probe = chiroute.NewProbe()
	m.wrapPC = chiroute.FuncPC(m.wrap)
	return m, nil
}

// decide asks the limiter, under the deadline and breaker when it does I/O.
func (m *mw) decide(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, time.Duration, error) {
	return m.decideWith(ctx, func(ctx context.Context) (ratebudget.Decision, error) { return m.limiter.Allow(ctx, checks) })
}

// decideWith makes one limiter call, allow, under the deadline and breaker when the
// limiter does I/O.
func (m *mw) decideWith(ctx context.Context, allow func(context.Context) (ratebudget.Decision, error)) (ratebudget.Decision, time.Duration, error) {
	if !m.io {
		if len(m.cfg.observers) == 0 {
			// Nobody reads the latency: skip the two clock reads.
			d, err := allow(ctx)
			return d, 0, err
		}
		start := time.Now()
		d, err := allow(ctx)
		return d, time.Since(start), err
	}
	var done func(error)
	if m.breaker != nil {
		var err error
		if done, err = m.breaker.allow(); err != nil {
			return ratebudget.Decision{}, 0, err
		}
		defer func() {
			if done != nil {
				// allow panicked: a half-open breaker would wait for this probe's result
				// forever, refusing every other decision. A panic says nothing about the
				// store.
				done(errNotCounted)
			}
		}()
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, m.cfg.timeout)
	d, err := allow(dctx)
	cancel()
	latency := time.Since(start)
	if err != nil && ended(dctx) && !ended(ctx) && !errors.Is(err, ratebudget.ErrInvalidConfig) {
		// The decision's own deadline passed: whatever the limiter returned, it is a
		// store timeout, and the command may have reached the store.
		var se *ratebudget.StoreError
		if !errors.As(err, &se) {
			err = &ratebudget.StoreError{Class: "timeout", Uncertain: true, Err: err}
		}
	}
	if done != nil {
		switch {
		case err == nil:
			done(nil)
		case ended(ctx) || errors.Is(err, ratebudget.ErrInvalidConfig):
			// A canceled request or a rejected input says nothing about the store.
			done(errNotCounted)
		default:
			done(err)
		}
		done = nil
	}
	return d, latency, err
}

// ended reports whether ctx is done or its deadline has passed. A limiter cut short by
// the deadline (a client's socket deadline, set from the context's) can return before
// the context's timer has marked it done: for what the failure says, the context has
// ended all the same. Asked only of a failed call: it reads the clock.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// exceeded answers a request whose cost exceeds the capacity of rule i: 413, decided
// without the limiter (for the layer's cost, rule i is the one of smallest capacity). No
// budget metadata is sent: the store was not asked, so nothing is known of what remains.
// st.checks holds the outer layers' checks only; the decision's Index counts them, then
// this layer's enforced rules before rule i, as the limiter's decisions count checks.
func (m *mw) exceeded(w http.ResponseWriter, r *http.Request, st *stack, cost int64, i int) {
	cr := &m.rules[i]
	index := len(st.checks)
	for j := range i {
		if !m.rules[j].shadow {
			index++
		}
	}
	d := ratebudget.Decision{Outcome: ratebudget.Outcome{Exceeded: true}, Rule: cr.rule.Name, Index: index, Limit: cr.limit, Window: cr.rule.Window}
	observeOuter(st, m, &Event{Request: r, Outcome: OutcomeExceeded, Decision: d})
	if m.cfg.onRefusal != nil {
		m.cfg.onRefusal(w, r, d)
		return
	}
	meta.WriteCostExceeded(w, r, headers.None, []meta.Info{{Policy: d.Rule, Limit: d.Limit, Window: d.Window}}, 0, cost)
}

// misconfigured answers 500 for a limiter that rejected the request's checks: a
// configuration mistake, not the client's and not the store's. Every layer of st sees
// the event, and the first such answer of m logs the error: the response never says
// what is wrong, and the mistake (stacked layers with rules of one name) is found only
// when a request stacks them.
func (m *mw) misconfigured(w http.ResponseWriter, r *http.Request, st *stack, err error) {
	observeAll(st, &Event{Request: r, Outcome: OutcomeInvalid, Err: err})
	if m.warnedConfig.CompareAndSwap(false, true) {
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: the limiter rejected a request's rate-limit checks as invalid, "+
			"so the route answers 500; layers stacked on one request decide their rules together and need distinct rule names",
			slog.String("error", err.Error()), slog.String("path", r.URL.Path))
	}
	writeMisconfigured(w, r)
}

// writeMisconfigured answers 500 for a mistake of the server's configuration, without
// saying which: the log says it.
func writeMisconfigured(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, r, problem.Problem{
		Type:   problem.Blank,
		Title:  "Internal Server Error",
		Status: http.StatusInternalServerError,
		Detail: "the rate limit of this route is misconfigured",
	})
}

func (m *mw) observe(ev *Event) {
	for _, f := range m.cfg.observers {
		f(*ev)
	}
}

// inProcess is implemented by limiters that decide without I/O (memory.Limiter): they
// get no per-decision deadline and no circuit breaker.
type inProcess interface{ InProcess() bool }
