package metrics_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

// Register a Collector once, pass its methods to the middleware, and the decisions are
// counted by reported rule and outcome: here 2 admitted and 1 refused of a limit of 2.
func ExampleCollector() {
	m := metrics.New()
	reg := prometheus.NewRegistry() // or prometheus.MustRegister(m) for the default one
	reg.MustRegister(m)

	lim, _ := memory.New()
	mw, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "api", Limit: 2, Window: time.Minute},
		Identity: keyfuncs.Global(),
	}}, middleware.WithObserver(m.Observe), middleware.WithBreaker(middleware.Breaker{OnChange: m.BreakerChanged}))
	if err != nil {
		panic(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratebudget_decisions_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := ""
			for _, l := range s.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			fmt.Printf("%s%v\n", labels, s.GetCounter().GetValue())
		}
	}
	// Output:
	// outcome=allowed rule=api 2
	// outcome=denied rule=api 1
}
