// Package metrics exports the middleware's decisions as Prometheus metrics, built on the
// observer hooks: allowed, denied and degraded work are counted side by side.
//
//	metric                                          type       counts (unit)
//	ratebudget_decisions_total{rule,outcome}        counter    decisions
//	ratebudget_decision_duration_seconds{result}    histogram  the limiter's answer time per decision (seconds)
//	ratebudget_store_errors_total{class,uncertain}  counter    store errors reported (failures)
//	ratebudget_breaker_state                        gauge      0 closed, 1 open (any breaker)
//	ratebudget_breaker_transitions_total{to}        counter    breaker transitions
//	ratebudget_shadow_refusals_total{rule}          counter    admitted requests a shadow rule would have refused
//	ratebudget_settle_failures_total                counter    failed settle, give-back and renewal calls
//
// Label values are bounded: rule names, result names (the outcome label), error classes and breaker states.
//
// # What each metric counts
//
// ratebudget_decisions_total counts decisions: one per [middleware.Event] other than a
// failed settle, that is one per request through one layer or through stacked layers
// (which decide together, see below), however it was answered. outcome is the event's
// [middleware.Result]: allowed, denied, exceeded, degraded, unavailable, invalid or
// canceled. rule is the rule the decision reported (Event.Decision.Rule): for a 429 the refusing rule
// (of several, the one with the longest wait), for a 413 the rule whose capacity the
// cost exceeds, for an admission the most restrictive rule of the request (fewest units
// left: the one the metadata headers describe), also when the local fallback decided.
// It is "none" when no rule decided: degraded, unavailable, invalid and canceled
// requests, and admissions of requests whose rules are all in shadow mode. A decision
// counts under one rule only: allowed{rule="x"} counts the admissions x was the most
// restrictive rule of, not every admission x took part in, and the rules that admitted
// a request another rule refused are counted nowhere (the refusal spent nothing from
// them). The sum over every rule and outcome is the number of decisions.
//
// ratebudget_decision_duration_seconds samples the time the limiter took to answer a
// decision (Event.Latency, in seconds): result "error" when the decision's event carries
// a store error (Event.Err), "ok" otherwise. Decisions without an answer time (a 400, a
// 413, an open breaker, a limiter's rejection of the checks as invalid) have no sample,
// nor have canceled requests and failed settles. For stacked layers on several limiters, and for an admission with rules in
// shadow mode, the sample is the sum of the calls' times, "error" when one failed.
//
// ratebudget_store_errors_total counts the store errors the events carry, by the error's
// class (ratebudget.StoreError.Class, a ratebudget.ErrorClass: ratebudget.ClassTimeout, "connection",
// "server", "reply", "breaker_open", "other") and whether budget may have been spent before the failure
// (uncertain "true" or "false"): one per decision whose event carries one (degraded and
// unavailable requests, local fallback decisions, admissions whose shadow decision
// failed, and decisions of stacked layers' other limiters while one failed: the last
// failure when several limiters failed), and one per failed settle or renewal. A request
// whose client went away, or whose own deadline passed, during its decision counts as
// canceled in ratebudget_decisions_total only: the store neither failed nor answered.
//
// ratebudget_shadow_refusals_total counts the admitted requests that their rules in
// shadow mode would have refused (an Event whose Shadow names a rule and is not Allowed), by the shadow rule that would
// have (Event.Shadow.Rule): at most one per request, also when several stacked layers'
// shadow rules would have. The request is counted in ratebudget_decisions_total as the
// admission it was. A shadow decision that failed is no refusal: its store error is
// counted, and its call's time is in the latency's "error" result.
//
// ratebudget_settle_failures_total counts the failed store calls made for requests
// already decided (middleware.SettleFailed): settling an admitted request's
// reservation when its handler returned, giving it back when a later limiter of a stack
// refused the request, and renewing its in-flight leases while the handler ran. A
// request can fail several (each renewal, then its settle), each counted once here and
// once in ratebudget_store_errors_total by its class, and neither in
// ratebudget_decisions_total nor in the latency. A failed settle leaves the reservation
// spent as reserved (an overcount); a failed renewal may let a lease expire early.
//
// ratebudget_breaker_state is 1 while any breaker of the middlewares given
// [Collector.BreakerChanged] is open, else 0. ratebudget_breaker_transitions_total
// counts their transitions by the state entered ("open", "closed"), both series from 0. Each middleware has a breaker of its own;
// stacked layers on one limiter decide their enforced rules under the innermost
// layer's.
//
// # Stacked layers
//
// Layers stacked on one request (an r.Use and an r.With, nested groups, chi.Chain) make
// one decision, and the middleware shows its event, and each failed settle of the
// request, to the observers of every layer it passed. A Collector counts each such
// event once, however many of those layers it was given to, so give one Collector to
// every layer: the counts are those of one layer holding all the layers' rules. A
// request is one decision under the rule reported for all the layers' rules (the
// refusing one, or the most restrictive), a 400 or 413 by any layer is counted once, a
// store failure once whatever policy applied, a shadow refusal once, each failed settle
// once. A layer that answers a request itself (a 400, a 413) shows it to its own
// observers and the outer layers', not to the inner layers': a Collector given to inner
// layers only misses those answers, while the outermost layer sees every event of its
// stacks. Different Collectors
// count independently, each once.
//
// Layers with another handler between them (a logger, an authentication middleware) are
// no stack: each makes a decision of its own, which only its observers see, and a
// request the outer layer admitted is counted again with the inner layer's decision.
package metrics

import (
	"errors"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/delivery"
	"github.com/ratebudget/ratebudget/middleware"
)

// Collector is a prometheus.Collector fed by [Collector.Observe] and
// [Collector.BreakerChanged]. Register it once and pass its methods to every middleware
// that should be counted, every layer of a stacked route included (each event is
// counted once):
//
//	m := metrics.New()
//	prometheus.MustRegister(m)
//	mw, err := middleware.New(lim, rules,
//		middleware.WithObserver(m.Observe),
//		middleware.WithBreaker(middleware.Breaker{OnChange: m.BreakerChanged}))
//
// It is safe for concurrent use. Make one with [New]: the zero Collector has no metrics
// and must not be used.
type Collector struct {
	decisions   *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	breaker     prometheus.Gauge
	transitions *prometheus.CounterVec
	shadow      *prometheus.CounterVec
	settles     prometheus.Counter

	counters sync.Map // counterKey -> prometheus.Counter
	// mu guards the number of breakers open, which the state gauge reports.
	mu     sync.Mutex
	opened int
	ok     prometheus.Observer
	failed prometheus.Observer
}

type counterKey struct {
	rule   string
	result middleware.Result
}

// New returns a Collector whose metric names start with "ratebudget_".
func New() *Collector {
	c := &Collector{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratebudget_decisions_total",
			Help: "Rate-limit decisions by reported rule and outcome (allowed, denied, exceeded, degraded, unavailable, invalid, canceled).",
		}, []string{"rule", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratebudget_decision_duration_seconds",
			Help:    "Time the budget store took to answer, by result (ok or error).",
			Buckets: []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25},
		}, []string{"result"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratebudget_store_errors_total",
			Help: "Budget-store failures by class; uncertain=true when budget may have been spent before the failure.",
		}, []string{"class", "uncertain"}),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratebudget_breaker_state",
			Help: "Circuit breaker state of the budget store: 1 while any breaker is open, else 0.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratebudget_breaker_transitions_total",
			Help: "Circuit breaker transitions by new state.",
		}, []string{"to"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratebudget_shadow_refusals_total",
			Help: "Requests served that rules in shadow mode would have refused, by the rule that would have refused.",
		}, []string{"rule"}),
		settles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratebudget_settle_failures_total",
			Help: "Failed budget-store calls settling admitted requests or renewing their in-flight leases (a request can fail several): a failed settle leaves the reservation spent as reserved (an uncertain one may have applied), a failed renewal may let a lease expire early.",
		}),
	}
	c.ok = c.latency.WithLabelValues("ok")
	c.failed = c.latency.WithLabelValues("error")
	// Every state's series from the start, at 0: one that appeared at 1 on a breaker's
	// first opening would show no increase.
	for _, s := range []string{"closed", "open"} {
		c.transitions.WithLabelValues(s)
	}
	return c
}

// Observe counts one decision, or one failed settle; pass it to middleware.WithObserver.
// An event shown to several stacked layers of a request that were each given c's
// Observe is counted by the first call only.
func (c *Collector) Observe(e middleware.Event) {
	if !delivery.First(e.Request, c) {
		return // shown to another layer of the request's stack already
	}
	var se *ratebudget.StoreError
	if e.Result == middleware.SettleFailed {
		c.settles.Inc()
		if errors.As(e.Err, &se) {
			c.storeErrors.WithLabelValues(string(se.Class), strconv.FormatBool(se.Uncertain)).Inc()
		}
		return
	}
	rule := e.Decision.Rule
	if rule == "" {
		rule = "none"
	}
	k := counterKey{rule, e.Result}
	ctr, ok := c.counters.Load(k)
	if !ok {
		ctr, _ = c.counters.LoadOrStore(k, c.decisions.WithLabelValues(rule, string(e.Result)))
	}
	ctr.(prometheus.Counter).Inc()
	if e.Result == middleware.Canceled {
		return // the request's context ended: the store neither failed nor answered
	}
	if e.Latency > 0 {
		if e.Err != nil {
			c.failed.Observe(e.Latency.Seconds())
		} else {
			c.ok.Observe(e.Latency.Seconds())
		}
	}
	if e.Shadow.Rule != "" && !e.Shadow.Allowed {
		c.shadow.WithLabelValues(e.Shadow.Rule).Inc()
	}
	if errors.As(e.Err, &se) {
		c.storeErrors.WithLabelValues(string(se.Class), strconv.FormatBool(se.Uncertain)).Inc()
	}
}

// BreakerChanged records that a breaker opened (true) or closed (false); give it to
// every middleware counted as middleware.Breaker's OnChange (a breaker starts closed).
func (c *Collector) BreakerChanged(open bool) {
	to, delta := "closed", -1
	if open {
		to, delta = "open", 1
	}
	c.mu.Lock()
	c.opened = max(c.opened+delta, 0)
	state := 0.0
	if c.opened > 0 {
		state = 1
	}
	c.breaker.Set(state)
	c.mu.Unlock()
	c.transitions.WithLabelValues(to).Inc()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	c.latency.Describe(ch)
	c.storeErrors.Describe(ch)
	c.breaker.Describe(ch)
	c.transitions.Describe(ch)
	c.shadow.Describe(ch)
	c.settles.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	c.latency.Collect(ch)
	c.storeErrors.Collect(ch)
	c.breaker.Collect(ch)
	c.transitions.Collect(ch)
	c.shadow.Collect(ch)
	c.settles.Collect(ch)
}
