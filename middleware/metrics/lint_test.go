package metrics_test

import (
	"net/http"
	"net/http/httptest"
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

// With every metric holding series (decisions, latency, store errors, shadow refusals,
// breaker state and transitions), the Collector passes Prometheus's own linter (names,
// units, HELP, counters ending in _total) and a pedantic registry's checks that what it
// collects is what it describes, with the HELP of its descriptors.
func TestCollectorPassesPromlint(t *testing.T) {
	mem, _ := memory.New()
	lim := &switchable{next: mem}
	m := metrics.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	mw, err := middleware.New(lim, []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "api", Limit: 2, Window: time.Minute}, Identity: keyfuncs.Global()},
		{Rule: ratebudget.Rule{Name: "trial", Limit: 1, Window: time.Minute}, Identity: keyfuncs.Global(), Shadow: true},
	}, middleware.WithObserver(m.Observe),
		middleware.WithBreaker(middleware.Breaker{OnChange: m.BreakerChanged}),
		middleware.WithFailOpen())
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 { // allowed, allowed with a shadow refusal, denied
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	lim.down.Store(true)
	for range 3 { // degraded; 3 calls in a row that could not connect open the breaker
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	if n, err := testutil.GatherAndCount(reg, "ratebudget_shadow_refusals_total", "ratebudget_store_errors_total"); err != nil || n != 2 {
		t.Fatalf("%d shadow refusal and store error series (%v), want 2: the lint would not see every metric", n, err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
