// Package metrics exports the middleware's decisions as Prometheus metrics, built on the
// observer hooks: allowed, denied and degraded work are counted side by side.
//
//	ratebudget_decisions_total{rule,outcome}        counter    every decision, by reported rule and outcome
//	ratebudget_decision_duration_seconds{result}    histogram  time the store took to answer: result "ok" or "error"
//	ratebudget_store_errors_total{class,uncertain}  counter    budget-store failures by class
//	ratebudget_breaker_state                        gauge      0 closed, 1 open, 2 half-open (the worst breaker's)
//	ratebudget_breaker_transitions_total{to}        counter    breaker transitions (every state's series from 0)
//	ratebudget_shadow_refusals_total{rule}          counter    requests that rules in shadow mode would have refused
//	ratebudget_settle_failures_total                counter    failed settles and lease renewals of admitted requests
//
// The rule label is the rule the decision reported ("none" when no limiter decided:
// degraded, unavailable, invalid and canceled requests, and admissions of requests whose
// rules are all in shadow mode, which ratebudget_shadow_refusals_total counts by rule). Label values are bounded: rule
// names, outcome names and error classes. A failed settle or renewal
// (middleware.OutcomeSettleFailed) is no decision: it is counted, once per failed store
// call (a request whose lease renewals fail counts each one, and its settle), by
// ratebudget_settle_failures_total and, by its class, ratebudget_store_errors_total, and
// in neither ratebudget_decisions_total nor the decision latency. A request whose client
// went away during its decision counts as canceled in ratebudget_decisions_total only:
// the store neither failed nor answered. A rule in shadow mode whose decision failed is
// an admission counted in ratebudget_store_errors_total, its call's time in the
// latency's "error" result.
//
// Each middleware has a breaker of its own: with several, ratebudget_breaker_state is
// open while any of them is open, else half-open while any is half-open, else closed.
//
// Stacked layers make one decision, and every layer's observers see its one event (and
// its failed settles): pass a Collector's Observe to one layer of a stack (the
// outermost), or each request is counted once per layer that has it. Layers with
// another handler between them are no stack: each makes a decision of its own, which
// only its observers see.
package metrics

import (
	"errors"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// Collector is a prometheus.Collector fed by [Collector.Observe] and
// [Collector.BreakerChanged]. Register it once and pass its methods to every middleware
// that should be counted:
//
//	m := metrics.New()
//	prometheus.MustRegister(m)
//	mw, err := middleware.New(lim, rules,
//		middleware.WithObserver(m.Observe),
//		middleware.WithBreakerObserver(m.BreakerChanged))
//
// It is safe for concurrent use.
type Collector struct {
	decisions   *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	breaker     prometheus.Gauge
	transitions *prometheus.CounterVec
	shadow      *prometheus.CounterVec
	settles     prometheus.Counter

	counters sync.Map // counterKey -> prometheus.Counter
	// mu guards the number of breakers open and half-open, which the state gauge
	// reports the worst of.
	mu             sync.Mutex
	opened, probed int
	ok             prometheus.Observer
	failed         prometheus.Observer
}

type counterKey struct {
	rule    string
	outcome middleware.Outcome
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
			Help: "Circuit breaker state of the budget store: 0 closed, 1 open, 2 half-open.",
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
	for _, s := range []middleware.BreakerState{middleware.BreakerClosed, middleware.BreakerOpen, middleware.BreakerHalfOpen} {
		c.transitions.WithLabelValues(s.String())
	}
	return c
}

// Observe counts one decision, or one failed settle; pass it to middleware.WithObserver.
func (c *Collector) Observe(e middleware.Event) {
	var se *ratebudget.StoreError
	if e.Outcome == middleware.OutcomeSettleFailed {
		c.settles.Inc()
		if errors.As(e.Err, &se) {
			c.storeErrors.WithLabelValues(se.Class, strconv.FormatBool(se.Uncertain)).Inc()
		}
		return
	}
	rule := e.Decision.Rule
	if rule == "" {
		rule = "none"
	}
	k := counterKey{rule, e.Outcome}
	ctr, ok := c.counters.Load(k)
	if !ok {
		ctr, _ = c.counters.LoadOrStore(k, c.decisions.WithLabelValues(rule, e.Outcome.String()))
	}
	ctr.(prometheus.Counter).Inc()
	if e.Outcome == middleware.OutcomeCanceled {
		return // the client went away: the store neither failed nor answered
	}
	if e.Latency > 0 {
		if e.Err != nil {
			c.failed.Observe(e.Latency.Seconds())
		} else {
			c.ok.Observe(e.Latency.Seconds())
		}
	}
	if e.ShadowRefused() {
		c.shadow.WithLabelValues(e.Shadow.Rule).Inc()
	}
	if errors.As(e.Err, &se) {
		c.storeErrors.WithLabelValues(se.Class, strconv.FormatBool(se.Uncertain)).Inc()
	}
}

// BreakerChanged records a breaker transition; pass it to
// middleware.WithBreakerObserver of every middleware counted (a breaker starts closed).
func (c *Collector) BreakerChanged(from, to middleware.BreakerState) {
	c.mu.Lock()
	for _, s := range [2]struct {
		state middleware.BreakerState
		delta int
	}{{from, -1}, {to, 1}} {
		switch s.state {
		case middleware.BreakerOpen:
			c.opened = max(c.opened+s.delta, 0)
		case middleware.BreakerHalfOpen:
			c.probed = max(c.probed+s.delta, 0)
		}
	}
	worst := middleware.BreakerClosed
	switch {
	case c.opened > 0:
		worst = middleware.BreakerOpen
	case c.probed > 0:
		worst = middleware.BreakerHalfOpen
	}
	c.breaker.Set(float64(worst))
	c.mu.Unlock()
	c.transitions.WithLabelValues(to.String()).Inc()
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
