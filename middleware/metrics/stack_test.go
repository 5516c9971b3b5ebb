package metrics_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

// failClosed stands for the default policy, fail-closed, in tables of policies: it
// needs no option, and this one changes nothing.
var failClosed = middleware.WithObserver(func(middleware.Event) {})

// stack is how stackedServer mounts its three layers; the zero value is three layers on
// lim, each with the Collector.
type stack struct {
	lim ratebudget.Limiter
	// lims replaces the limiter of a layer (by index), rules its rule.
	lims  map[int]ratebudget.Limiter
	rules map[int]middleware.Rule
	// opts are given to every layer, after the Collector's; layerOpts to one layer.
	opts      []middleware.Option
	layerOpts map[int][]middleware.Option
	// collectors replaces the observers of a layer: the Collectors given to it.
	collectors map[int][]*metrics.Collector
	handler    http.HandlerFunc
}

// stackedServer serves GET /r through three stacked layers, as a service mounts them
// with one Collector given to every layer: a top-level r.Use (rule "ip"), a group's
// r.Use (rule "account", keyed by the X-Account header) and the route's r.With (rule
// "route"). It returns the server and its router.
func stackedServer(t *testing.T, m *metrics.Collector, s stack) (*httptest.Server, http.Handler) {
	t.Helper()
	layers := []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "ip", Limit: 100, Window: time.Minute}, Identity: keyfuncs.Global()},
		{Rule: ratebudget.Rule{Name: "account", Limit: 50, Window: time.Minute}, Identity: keyfuncs.Header("X-Account")},
		{Rule: ratebudget.Rule{Name: "route", Limit: 2, Window: time.Minute}, Identity: keyfuncs.Global()},
	}
	var mws [3]func(http.Handler) http.Handler
	for i, r := range layers {
		if x, ok := s.rules[i]; ok {
			r = x
		}
		lim := s.lim
		if x, ok := s.lims[i]; ok {
			lim = x
		}
		var all []middleware.Option
		cs, ok := s.collectors[i]
		if !ok {
			cs = []*metrics.Collector{m}
		}
		for _, c := range cs {
			all = append(all, middleware.WithObserver(c.Observe))
		}
		all = append(all, middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
			for _, c := range cs {
				c.BreakerChanged(open)
			}
		}}))
		all = append(append(all, s.opts...), s.layerOpts[i]...)
		mw, err := middleware.New(lim, []middleware.Rule{r}, all...)
		if err != nil {
			t.Fatal(err)
		}
		mws[i] = mw
	}
	handler := s.handler
	if handler == nil {
		handler = func(http.ResponseWriter, *http.Request) {}
	}
	r := chi.NewRouter()
	r.Use(mws[0])
	r.Group(func(r chi.Router) {
		r.Use(mws[1])
		r.With(mws[2]).Get("/r", handler)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv, r
}

// get sends GET /r with the X-Account header account (none when empty) and returns the
// status.
func get(t *testing.T, srv *httptest.Server, account string) int {
	t.Helper()
	hdr := map[string]string{}
	if account != "" {
		hdr["X-Account"] = account
	}
	return send(t, srv, hdr)
}

// send sends GET /r with the headers hdr and returns the status.
func send(t *testing.T, srv *httptest.Server, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequest("GET", srv.URL+"/r", nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// decisionsSum is the sum of ratebudget_decisions_total over every rule and outcome.
func decisionsSum(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "ratebudget_decisions_total" {
			for _, s := range mf.GetMetric() {
				n += s.GetCounter().GetValue()
			}
		}
	}
	return n
}

const (
	decisionsHelp = `# HELP ratebudget_decisions_total Rate-limit decisions by reported rule and outcome (allowed, denied, exceeded, degraded, unavailable, invalid, canceled).
# TYPE ratebudget_decisions_total counter
`
	storeErrorsHelp = `# HELP ratebudget_store_errors_total Budget-store failures by class; uncertain=true when budget may have been spent before the failure.
# TYPE ratebudget_store_errors_total counter
`
	shadowHelp = `# HELP ratebudget_shadow_refusals_total Requests served that rules in shadow mode would have refused, by the rule that would have refused.
# TYPE ratebudget_shadow_refusals_total counter
`
	settleHelp = `# HELP ratebudget_settle_failures_total Failed budget-store calls settling admitted requests or renewing their in-flight leases (a request can fail several): a failed settle leaves the reservation spent as reserved (an uncertain one may have applied), a failed renewal may let a lease expire early.
# TYPE ratebudget_settle_failures_total counter
`
)

// One Collector given to every layer of a stacked route counts each request once: by
// the rule the one decision reported (the refusing rule, or the most restrictive of an
// admission), so that the decisions sum to the requests served, a refusal is counted
// once, and the rules a refused request was admitted by are counted nowhere.
func TestStackedLayersCountEachRequestOnce(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	srv, _ := stackedServer(t, m, stack{lim: mem})
	codes := map[int]int{}
	for range 5 {
		codes[get(t, srv, "alice")]++
	}
	codes[get(t, srv, "")]++ // no X-Account: 400 by the account layer's key function
	if codes[200] != 2 || codes[429] != 3 || codes[400] != 1 {
		t.Fatalf("statuses %v, want 2 200, 3 429 and 1 400", codes)
	}
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="route"} 2
ratebudget_decisions_total{outcome="denied",rule="route"} 3
ratebudget_decisions_total{outcome="invalid",rule="none"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total"); err != nil {
		t.Fatal(err)
	}
	if n := decisionsSum(t, reg); n != 6 {
		t.Fatalf("decisions sum to %v, want the 6 requests", n)
	}
	// One decision each for the 5 requests the limiter decided (the 400 was answered
	// before it was asked).
	if got := latencySamples(t, reg); got["ok"] != 5 || got["error"] != 0 {
		t.Fatalf("latency samples %v, want ok 5 and error 0", got)
	}
}

// A store failure of a stacked route is one decision, one store error and one latency
// sample under each policy, however many layers the Collector was given to.
func TestStackedStoreFailureCountedOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opt      middleware.Option
		code     int
		decision string
	}{
		{"FailOpen", middleware.WithFailOpen(), 200, `ratebudget_decisions_total{outcome="degraded",rule="none"} 1`},
		{"FailClosed", failClosed, 503, `ratebudget_decisions_total{outcome="unavailable",rule="none"} 1`},
		{"LocalFallback", middleware.WithLocalFallback(1), 200, `ratebudget_decisions_total{outcome="allowed",rule="route"} 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := memory.New()
			if err != nil {
				t.Fatal(err)
			}
			lim := &switchable{next: mem}
			lim.down.Store(true)
			m := metrics.New()
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(m)
			srv, _ := stackedServer(t, m, stack{lim: lim, opts: []middleware.Option{tc.opt, middleware.WithBreaker(middleware.Breaker{Disabled: true})}})
			if code := get(t, srv, "alice"); code != tc.code {
				t.Fatalf("%d, want %d", code, tc.code)
			}
			want := decisionsHelp + tc.decision + "\n" + storeErrorsHelp + `ratebudget_store_errors_total{class="connection",uncertain="true"} 1
`
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total", "ratebudget_store_errors_total"); err != nil {
				t.Fatal(err)
			}
			if got := latencySamples(t, reg); got["ok"] != 0 || got["error"] != 1 {
				t.Fatalf("latency samples %v, want ok 0 and error 1", got)
			}
		})
	}
}

// A shadow rule's refusal on a stacked route is counted once, as is the admission that
// served it.
func TestStackedShadowRefusalCountedOnce(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	shadow := middleware.Rule{Rule: ratebudget.Rule{Name: "route", Limit: 1, Window: time.Minute}, Identity: keyfuncs.Global(), Shadow: true}
	srv, _ := stackedServer(t, m, stack{lim: mem, rules: map[int]middleware.Rule{2: shadow}})
	for range 3 {
		if code := get(t, srv, "alice"); code != 200 {
			t.Fatalf("%d, want 200: a shadow rule never refuses", code)
		}
	}
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="account"} 3
` + shadowHelp + `ratebudget_shadow_refusals_total{rule="route"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total", "ratebudget_shadow_refusals_total"); err != nil {
		t.Fatal(err)
	}
}

// A failed settle of a stacked route's admitted request is one settle failure and one
// store error, besides its one decision.
func TestStackedSettleFailureCountedOnce(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	settling := middleware.Rule{Rule: ratebudget.Rule{Name: "route", Limit: 2, Window: time.Minute}, Identity: keyfuncs.Global(), Counts: middleware.CountSuccesses(nil)}
	srv, _ := stackedServer(t, m, stack{lim: settleDown{mem}, rules: map[int]middleware.Rule{2: settling},
		handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) }})
	if code := get(t, srv, "alice"); code != 500 {
		t.Fatalf("%d, want the handler's 500", code)
	}
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="route"} 1
` + settleHelp + `ratebudget_settle_failures_total 1
` + storeErrorsHelp + `ratebudget_store_errors_total{class="timeout",uncertain="true"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ratebudget_decisions_total", "ratebudget_settle_failures_total", "ratebudget_store_errors_total"); err != nil {
		t.Fatal(err)
	}
}

// headerCost is a cost read from the X-Cost header, 1 without it.
func headerCost(r *http.Request) (int64, error) {
	if v := r.Header.Get("X-Cost"); v != "" {
		return strconv.ParseInt(v, 10, 64)
	}
	return 1, nil
}

// A request a stacked layer answers before any decision (an identity its key function
// cannot determine, a cost above a rule's capacity, a client gone) is counted once,
// whichever layer answered it: not once per layer it had passed.
func TestStackedAnswersWithoutDecisionCountedOnce(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	client := func(name string, limit int64, header string) middleware.Rule {
		return middleware.Rule{Rule: ratebudget.Rule{Name: name, Limit: limit, Window: time.Minute}, Identity: keyfuncs.Header(header)}
	}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	srv, router := stackedServer(t, m, stack{lim: mem, opts: []middleware.Option{middleware.WithCost(headerCost)}, rules: map[int]middleware.Rule{
		0: client("ip", 100, "X-Client"),
		1: client("account", 50, "X-Account"),
		2: client("route", 20, "X-Route"),
	}})
	ok := map[string]string{"X-Client": "c", "X-Account": "a", "X-Route": "r"}
	with := func(k, v string) map[string]string {
		h := maps.Clone(ok)
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	for _, tc := range []struct {
		hdr  map[string]string
		code int
	}{
		{with("X-Client", ""), 400},  // the outermost layer's identity
		{with("X-Account", ""), 400}, // the middle layer's
		{with("X-Route", ""), 400},   // the innermost layer's
		{with("X-Cost", "x"), 400},   // the outermost layer's cost
		{with("X-Cost", "30"), 413},  // above the innermost layer's capacity
		{with("X-Cost", "60"), 413},  // above the middle layer's
		{ok, 200},
	} {
		if code := send(t, srv, tc.hdr); code != tc.code {
			t.Fatalf("headers %v: %d, want %d", tc.hdr, code, tc.code)
		}
	}
	// A client gone before the decision, through the same router.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest("GET", "/r", nil).WithContext(ctx)
	for k, v := range ok {
		req.Header.Set(k, v)
	}
	router.ServeHTTP(httptest.NewRecorder(), req)
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="route"} 1
ratebudget_decisions_total{outcome="canceled",rule="none"} 1
ratebudget_decisions_total{outcome="exceeded",rule="account"} 1
ratebudget_decisions_total{outcome="exceeded",rule="route"} 1
ratebudget_decisions_total{outcome="invalid",rule="none"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total"); err != nil {
		t.Fatal(err)
	}
	if got := latencySamples(t, reg); got["ok"] != 1 || got["error"] != 0 {
		t.Fatalf("latency samples %v, want the one decision the limiter made", got)
	}
}

// Stacked layers on two limiters are still one decision: a limiter failing under
// FailOpen while the other decides is one degraded request and one store error, and a
// refusal by the later limiter whose give-back of the earlier one's reservation failed
// is one refusal and one settle failure.
func TestStackedOnSeveralLimitersCountedOnce(t *testing.T) {
	t.Run("one limiter fails under FailOpen", func(t *testing.T) {
		memA, _ := memory.New()
		memB, _ := memory.New()
		down := &switchable{next: memA}
		down.down.Store(true)
		m := metrics.New()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		srv, _ := stackedServer(t, m, stack{lim: memB, lims: map[int]ratebudget.Limiter{0: down},
			opts: []middleware.Option{middleware.WithFailOpen(), middleware.WithBreaker(middleware.Breaker{Disabled: true})}})
		for range 3 {
			get(t, srv, "alice")
		}
		// The route's budget of 2 still refuses the third; the failed "ip" layer is not
		// enforced on the other two.
		want := decisionsHelp + `ratebudget_decisions_total{outcome="degraded",rule="none"} 2
ratebudget_decisions_total{outcome="denied",rule="route"} 1
` + storeErrorsHelp + `ratebudget_store_errors_total{class="connection",uncertain="true"} 3
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total", "ratebudget_store_errors_total"); err != nil {
			t.Fatal(err)
		}
		if got := latencySamples(t, reg); got["ok"] != 0 || got["error"] != 3 {
			t.Fatalf("latency samples %v, want error 3: one per request", got)
		}
	})
	t.Run("a give-back fails", func(t *testing.T) {
		memA, _ := memory.New()
		memB, _ := memory.New()
		m := metrics.New()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		// The outer layers reserve on a limiter whose settles fail; the route's layer
		// decides on another, and refuses the third request.
		srv, _ := stackedServer(t, m, stack{lim: settleDown{memA}, lims: map[int]ratebudget.Limiter{2: memB}})
		codes := map[int]int{}
		for range 3 {
			codes[get(t, srv, "alice")]++
		}
		if codes[200] != 2 || codes[429] != 1 {
			t.Fatalf("statuses %v, want 2 200 and 1 429", codes)
		}
		want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="route"} 2
ratebudget_decisions_total{outcome="denied",rule="route"} 1
` + settleHelp + `ratebudget_settle_failures_total 1
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total", "ratebudget_settle_failures_total"); err != nil {
			t.Fatal(err)
		}
	})
}

// Each Collector counts a stacked request once, whichever layers it was given to, while
// an observer function given to every layer still sees the event once per layer.
func TestStackedCollectorsOnSomeLayers(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	outer, inner, both := metrics.New(), metrics.New(), metrics.New()
	regs := map[string]*prometheus.Registry{}
	for name, c := range map[string]*metrics.Collector{"outer": outer, "inner": inner, "both": both} {
		regs[name] = prometheus.NewPedanticRegistry()
		regs[name].MustRegister(c)
	}
	var seen atomic.Int64
	srv, _ := stackedServer(t, nil, stack{lim: mem,
		collectors: map[int][]*metrics.Collector{0: {outer, both}, 1: {}, 2: {inner, both}},
		opts:       []middleware.Option{middleware.WithObserver(func(middleware.Event) { seen.Add(1) })}})
	for range 3 {
		get(t, srv, "alice")
	}
	if n := seen.Load(); n != 9 {
		t.Fatalf("the observer function saw %d events, want 3 per layer for 3 requests", n)
	}
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="route"} 2
ratebudget_decisions_total{outcome="denied",rule="route"} 1
`
	for name, reg := range regs {
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total"); err != nil {
			t.Errorf("the Collector of %s: %v", name, err)
		}
	}
}

// Failed lease renewals of a stacked route, observed on the renewal timer's goroutine,
// and its failed settle are each counted once.
func TestStackedRenewalFailuresCountedOnce(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	renewFailed := make(chan struct{}, 1)
	var failures atomic.Int64
	count := middleware.WithObserver(func(e middleware.Event) {
		if e.Result == middleware.SettleFailed {
			failures.Add(1)
			select {
			case renewFailed <- struct{}{}:
			default:
			}
		}
	})
	lease := middleware.Rule{Rule: ratebudget.Rule{Name: "route", Algorithm: ratebudget.InFlight, Limit: 1, Window: 20 * time.Millisecond}, Identity: keyfuncs.Global()}
	srv, _ := stackedServer(t, m, stack{lim: leaseDown{mem}, rules: map[int]middleware.Rule{2: lease},
		layerOpts: map[int][]middleware.Option{0: {count}}, // one layer's: each failure once
		handler: func(http.ResponseWriter, *http.Request) {
			<-renewFailed // runs until a renewal of its lease has failed
		}})
	if code := get(t, srv, "alice"); code != 200 {
		t.Fatalf("%d, want 200", code)
	}
	n := failures.Load()
	if n < 2 {
		t.Fatalf("%d failed calls observed, want a renewal and the settle", n)
	}
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="route"} 1
` + settleHelp + `ratebudget_settle_failures_total ` + strconv.FormatInt(n, 10) + `
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total", "ratebudget_settle_failures_total"); err != nil {
		t.Fatal(err)
	}
}

// Layers with another handler between them are two decisions, each counted once: the
// Collector counts decisions, and a stack is one.
func TestLayersWithHandlerBetweenCountTwoDecisions(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	mk := func(name string, limit int64) func(http.Handler) http.Handler {
		mw, err := middleware.New(mem, []middleware.Rule{{Rule: ratebudget.Rule{Name: name, Limit: limit, Window: time.Minute}, Identity: keyfuncs.Global()}},
			middleware.WithObserver(m.Observe))
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	between := func(next http.Handler) http.Handler { return http.HandlerFunc(next.ServeHTTP) }
	r := chi.NewRouter()
	r.With(mk("outer", 10), between, mk("inner", 1)).Get("/r", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	for range 2 {
		get(t, srv, "")
	}
	want := decisionsHelp + `ratebudget_decisions_total{outcome="allowed",rule="inner"} 1
ratebudget_decisions_total{outcome="allowed",rule="outer"} 2
ratebudget_decisions_total{outcome="denied",rule="inner"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratebudget_decisions_total"); err != nil {
		t.Fatal(err)
	}
}
