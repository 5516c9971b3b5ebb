package middleware

import (
	"net/http"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/delivery"
)

// Result is the class of an [Event]: what became of the request (admitted, refused and
// how, not decided), or a failed settle. Observers, metrics and logs key on it; its
// value is the metric label and the log's outcome: "allowed", "denied", "exceeded",
// "degraded", "unavailable", "invalid", "canceled" or "settle_failed". Every event the
// middleware makes carries one of the named values; the zero value "" is none of them.
// Not to be confused with [ratebudget.Outcome], one check's result within
// Event.Decision.
type Result string

const (
	// Allowed: admitted by the limiter (or by the local fallback: Event.Fallback).
	Allowed Result = "allowed"
	// Denied: refused with 429 (by the limiter or the local fallback).
	Denied Result = "denied"
	// Exceeded: refused with 413, the cost exceeds a rule's capacity.
	Exceeded Result = "exceeded"
	// Degraded: admitted without a decision because the store failed under fail-open
	// (for stacked layers, a failed limiter's layers under fail-open were not enforced;
	// Event.Fallback tells whether a local fallback decided another's).
	Degraded Result = "degraded"
	// Unavailable: refused with 503 because the store failed under fail-closed.
	Unavailable Result = "unavailable"
	// Invalid: identity, scope, plan or cost could not be determined (answered by the
	// error handler), or the limiter rejected the checks as invalid (a
	// *ratebudget.ConfigError, answered 500); nothing counted.
	Invalid Result = "invalid"
	// Canceled: the request's context ended (its client went away, or its deadline
	// passed) before the decision; nothing written. A store failure that comes once the
	// request's deadline has passed is such a request's, not a store failure: no policy
	// applies, and the breaker does not count it.
	Canceled Result = "canceled"
	// SettleFailed: not a decision, but the store failing to settle an admitted
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
	SettleFailed Result = "settle_failed"
)

// Event describes one decision, or one failed settle of an admitted request
// ([SettleFailed]), for observers ([WithObserver]).
type Event struct {
	// Request is the request decided on. Observers must not retain it. When more than
	// one stacked layer of the request has observers, it is a shallow copy of that
	// request, the same for every event of the decision and every layer, whose context
	// also carries what lets package metrics count each event once.
	Request *http.Request
	// Result classifies the decision (or the failed settle) for metrics and logs.
	Result Result
	// Decision is the limiter's (or the local fallback's) decision; zero when none was
	// made. For stacked layers it is the decision of every layer's checks, and every
	// layer's observers see it; Decision.Index counts their checks, outermost first.
	Decision ratebudget.Decision
	// Fallback is true when the local fallback decided because the store could not. For
	// stacked layers on several limiters, it decided a failed limiter's layers, and
	// another limiter may have refused.
	Fallback bool
	// Err is the store error (a *ratebudget.StoreError, for Degraded,
	// Unavailable, SettleFailed and fallback decisions, for the decision
	// of stacked layers' other limiters while one failed, and for an admission whose
	// shadow decision failed (see Shadow); the last one when several failed) or the
	// key-function error or the limiter's *ratebudget.ConfigError (Invalid). Its
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

func (m *mw) observe(ev *Event) {
	for _, f := range m.cfg.observers {
		f(*ev)
	}
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
