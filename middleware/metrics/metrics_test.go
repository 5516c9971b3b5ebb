package metrics_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

type switchable struct {
	next ratebudget.Limiter
	down atomic.Bool
}

func (s *switchable) Allow(ctx context.Context, c []ratebudget.Check) (ratebudget.Decision, error) {
	if s.down.Load() {
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Uncertain: true, Err: errors.New("EOF")}
	}
	return s.next.Allow(ctx, c)
}

// Ping fails while s is down: an open breaker probes with it, and no decision goes to
// the store until the breaker closes.
func (s *switchable) Ping(context.Context) error {
	if s.down.Load() {
		return errors.New("EOF")
	}
	return nil
}

// After a scripted sequence the counters equal what was sent.
func TestCountersMatchTraffic(t *testing.T) {
	mem, _ := memory.New()
	lim := &switchable{next: mem}
	m := metrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mw, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "api", Limit: 3, Window: time.Minute},
		Identity: keyfuncs.Global(),
	}}, middleware.WithObserver(m.Observe), middleware.WithBreaker(middleware.Breaker{OnChange: m.BreakerChanged}),
		middleware.WithFailOpen())
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	send := func(n int) {
		for range n {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
		}
	}
	send(5) // 3 allowed, 2 denied
	lim.down.Store(true)
	send(5) // 5 degraded: 3 store errors (3 calls in a row could not connect), then the breaker opens and 2 are not sent to the store

	want := `
# HELP ratebudget_decisions_total Rate-limit decisions by reported rule and outcome (allowed, denied, exceeded, degraded, unavailable, invalid, canceled).
# TYPE ratebudget_decisions_total counter
ratebudget_decisions_total{outcome="allowed",rule="api"} 3
ratebudget_decisions_total{outcome="degraded",rule="none"} 5
ratebudget_decisions_total{outcome="denied",rule="api"} 2
# HELP ratebudget_store_errors_total Budget-store failures by class; uncertain=true when budget may have been spent before the failure.
# TYPE ratebudget_store_errors_total counter
ratebudget_store_errors_total{class="breaker_open",uncertain="false"} 2
ratebudget_store_errors_total{class="connection",uncertain="true"} 3
# HELP ratebudget_breaker_state Circuit breaker state of the budget store: 1 while any breaker is open, else 0.
# TYPE ratebudget_breaker_state gauge
ratebudget_breaker_state 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ratebudget_decisions_total", "ratebudget_store_errors_total", "ratebudget_breaker_state"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "ratebudget_decision_duration_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			counts[s.GetLabel()[0].GetValue()] = s.GetHistogram().GetSampleCount()
		}
	}
	// 8 store calls (5 answered, 3 failed); the 2 skipped by the open breaker took none.
	if counts["ok"] != 5 || counts["error"] != 3 {
		t.Fatalf("latency samples %v, want ok 5, error 3", counts)
	}
}

// A rule in shadow mode is counted where it would have refused; nothing is refused.
func TestShadowRefusalsCounted(t *testing.T) {
	mem, _ := memory.New()
	m := metrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mw, err := middleware.New(mem, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "hello", Limit: 1, Window: time.Minute},
		Identity: keyfuncs.Global(),
		Shadow:   true,
	}}, middleware.WithObserver(m.Observe))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != 200 {
			t.Fatalf("a shadow rule refused: %d", rec.Code)
		}
	}
	want := `
# HELP ratebudget_shadow_refusals_total Requests served that rules in shadow mode would have refused, by the rule that would have refused.
# TYPE ratebudget_shadow_refusals_total counter
ratebudget_shadow_refusals_total{rule="hello"} 2
# HELP ratebudget_decisions_total Rate-limit decisions by reported rule and outcome (allowed, denied, exceeded, degraded, unavailable, invalid, canceled).
# TYPE ratebudget_decisions_total counter
ratebudget_decisions_total{outcome="allowed",rule="none"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_shadow_refusals_total", "ratebudget_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

// settleDown is an in-process limiter whose settles fail with a store error.
type settleDown struct{ *memory.Limiter }

func (s settleDown) Settle(_ context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, _ []int64) error {
	clear(tickets[:len(checks)])
	return &ratebudget.StoreError{Class: ratebudget.ClassTimeout, Uncertain: true, Err: context.DeadlineExceeded}
}

// A failed settle is counted as a settle failure and a store error, and neither as a
// decision nor in the decision latency.
func TestSettleFailuresCounted(t *testing.T) {
	mem, _ := memory.New()
	m := metrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mw, err := middleware.New(settleDown{mem}, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute},
		Identity: keyfuncs.Global(),
		Counts:   middleware.CountSuccesses(nil),
	}}, middleware.WithObserver(m.Observe))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) }))
	for range 2 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	want := `
# HELP ratebudget_decisions_total Rate-limit decisions by reported rule and outcome (allowed, denied, exceeded, degraded, unavailable, invalid, canceled).
# TYPE ratebudget_decisions_total counter
ratebudget_decisions_total{outcome="allowed",rule="api"} 2
# HELP ratebudget_settle_failures_total Failed budget-store calls settling admitted requests or renewing their in-flight leases (a request can fail several): a failed settle leaves the reservation spent as reserved (an uncertain one may have applied), a failed renewal may let a lease expire early.
# TYPE ratebudget_settle_failures_total counter
ratebudget_settle_failures_total 2
# HELP ratebudget_store_errors_total Budget-store failures by class; uncertain=true when budget may have been spent before the failure.
# TYPE ratebudget_store_errors_total counter
ratebudget_store_errors_total{class="timeout",uncertain="true"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ratebudget_decisions_total", "ratebudget_settle_failures_total", "ratebudget_store_errors_total"); err != nil {
		t.Fatal(err)
	}
	if got := latencySamples(t, reg); got["ok"] != 2 || got["error"] != 0 {
		t.Fatalf("latency samples %v, want ok 2 and error 0: the decisions alone", got)
	}
}

// goneClient is a limiter whose caller goes away while it decides: it cancels the
// request's context and answers with the error a store call cut short returns.
type goneClient struct{ cancel context.CancelFunc }

func (g goneClient) Allow(ctx context.Context, _ []ratebudget.Check) (ratebudget.Decision, error) {
	g.cancel()
	<-ctx.Done()
	return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassTimeout, Uncertain: true, Err: ctx.Err()}
}

// A request whose client went away during the decision is counted as canceled, and
// neither as a store error nor in the store's latency: the store did not fail.
func TestCanceledIsNoStoreError(t *testing.T) {
	m := metrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mw, err := middleware.New(goneClient{cancel}, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute},
		Identity: keyfuncs.Global(),
	}}, middleware.WithObserver(m.Observe))
	if err != nil {
		t.Fatal(err)
	}
	mw(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	want := `
# HELP ratebudget_decisions_total Rate-limit decisions by reported rule and outcome (allowed, denied, exceeded, degraded, unavailable, invalid, canceled).
# TYPE ratebudget_decisions_total counter
ratebudget_decisions_total{outcome="canceled",rule="none"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ratebudget_decisions_total", "ratebudget_store_errors_total"); err != nil {
		t.Fatal(err)
	}
	if got := latencySamples(t, reg); got["ok"] != 0 || got["error"] != 0 {
		t.Fatalf("latency samples %v, want none", got)
	}
}

// latencySamples returns the decision latency histogram's sample count by result.
func latencySamples(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() == "ratebudget_decision_duration_seconds" {
			for _, s := range mf.GetMetric() {
				n[s.GetLabel()[0].GetValue()] = s.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// One Collector is passed to every middleware, each with its breaker: the state gauge
// reports 1 while any of them is open, not whichever changed last.
func TestBreakerStateOfSeveralBreakers(t *testing.T) {
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	state := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ratebudget_breaker_state" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no ratebudget_breaker_state")
		return 0
	}
	steps := []struct {
		open bool
		want float64
	}{
		{true, 1},  // A opens
		{true, 1},  // B opens
		{false, 1}, // A closes: B is still open
		{true, 1},  // A opens again
		{false, 1}, // B closes: A is open
		{false, 0}, // every breaker closed
	}
	for i, s := range steps {
		m.BreakerChanged(s.open)
		if got := state(); got != s.want {
			t.Fatalf("step %d (open %v): ratebudget_breaker_state %v, want %v", i, s.open, got, s.want)
		}
	}
}

// leaseDown is an in-process limiter whose lease renewals and settles fail.
type leaseDown struct{ *memory.Limiter }

func (l leaseDown) Settle(_ context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, _ []int64) error {
	clear(tickets[:len(checks)])
	return &ratebudget.StoreError{Class: ratebudget.ClassConnection, Uncertain: true, Err: errors.New("EOF")}
}

func (l leaseDown) Renew(context.Context, []ratebudget.Check, []ratebudget.Ticket) error {
	return &ratebudget.StoreError{Class: ratebudget.ClassConnection, Uncertain: true, Err: errors.New("EOF")}
}

// ratebudget_settle_failures_total counts failed store calls, not requests: one request
// whose lease renewals failed and whose settle failed counts once per failed call, as its
// help says.
func TestSettleFailuresCountFailedCalls(t *testing.T) {
	mem, _ := memory.New()
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	renewFailed := make(chan struct{}, 1)
	var failures atomic.Int64
	mw, err := middleware.New(leaseDown{mem}, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "slow", Algorithm: ratebudget.InFlight, Limit: 1, Window: 20 * time.Millisecond},
		Identity: keyfuncs.Global(),
	}}, middleware.WithObserver(m.Observe), middleware.WithObserver(func(e middleware.Event) {
		if e.Result == middleware.SettleFailed {
			failures.Add(1)
			select {
			case renewFailed <- struct{}{}:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		<-renewFailed // the handler runs until a renewal of its lease has failed
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	n := failures.Load() // the renewals that failed, and the settle
	if n < 2 {
		t.Fatalf("%d failed calls observed, want a renewal and the settle", n)
	}
	want := `
# HELP ratebudget_settle_failures_total Failed budget-store calls settling admitted requests or renewing their in-flight leases (a request can fail several): a failed settle leaves the reservation spent as reserved (an uncertain one may have applied), a failed renewal may let a lease expire early.
# TYPE ratebudget_settle_failures_total counter
ratebudget_settle_failures_total ` + strconv.FormatInt(n, 10) + `
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_settle_failures_total"); err != nil {
		t.Fatal(err)
	}
}

// A rule in shadow mode whose store is down refuses nothing and is counted as what it
// is: the store's failure, with its latency, not a silent admission that looks like a
// rule that would never refuse.
func TestShadowStoreFailuresCounted(t *testing.T) {
	mem, _ := memory.New()
	lim := &switchable{next: mem}
	lim.down.Store(true)
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	mw, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "hello", Limit: 1, Window: time.Minute},
		Identity: keyfuncs.Global(),
		Shadow:   true,
	}}, middleware.WithObserver(m.Observe), middleware.WithBreaker(middleware.Breaker{Disabled: true}))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 2 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != 200 {
			t.Fatalf("a shadow rule refused: %d", rec.Code)
		}
	}
	want := `
# HELP ratebudget_store_errors_total Budget-store failures by class; uncertain=true when budget may have been spent before the failure.
# TYPE ratebudget_store_errors_total counter
ratebudget_store_errors_total{class="connection",uncertain="true"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_store_errors_total", "ratebudget_shadow_refusals_total"); err != nil {
		t.Fatal(err)
	}
	if got := latencySamples(t, reg); got["ok"] != 0 || got["error"] != 2 {
		t.Fatalf("latency samples %v, want ok 0 and error 2: the failed shadow decisions", got)
	}
}

// Every breaker transition's series is exported from the start, at 0: a counter that
// appears at 1 on a breaker's first opening shows no increase, and an alert on
// increase(ratebudget_breaker_transitions_total{to="open"}[5m]) would never fire for it.
func TestBreakerTransitionsStartAtZero(t *testing.T) {
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP ratebudget_breaker_transitions_total Circuit breaker transitions by new state.
# TYPE ratebudget_breaker_transitions_total counter
ratebudget_breaker_transitions_total{to="closed"} 0
ratebudget_breaker_transitions_total{to="open"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_breaker_transitions_total"); err != nil {
		t.Fatal(err)
	}
	m.BreakerChanged(true)
	want = strings.Replace(want, `{to="open"} 0`, `{to="open"} 1`, 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_breaker_transitions_total"); err != nil {
		t.Fatal(err)
	}
}
