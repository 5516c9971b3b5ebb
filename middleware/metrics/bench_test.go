package metrics_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkCollector measures an admitted request counted by one Collector: through one
// layer, and through two stacked layers (a chi group's r.Use and a route's r.With) that
// are each given the Collector, on the in-process limiter.
func BenchmarkCollector(b *testing.B) {
	const clients = 256
	reqs := make([]*http.Request, clients)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/x", nil)
		reqs[i].RemoteAddr = "192.0.2." + strconv.Itoa(i%250) + ":" + strconv.Itoa(1000+i)
	}
	byAddr, err := keyfuncs.ClientIP()
	if err != nil {
		b.Fatal(err)
	}
	lim, _ := memory.New()
	m := metrics.New()
	mk := func(name string) func(http.Handler) http.Handler {
		mw, err := middleware.New(lim, []middleware.Rule{{Rule: ratebudget.Rule{Name: name, Limit: 1 << 40, Window: time.Hour}, Identity: byAddr}},
			middleware.WithObserver(m.Observe))
		if err != nil {
			b.Fatal(err)
		}
		return mw
	}
	outer, inner := mk("outer"), mk("inner")
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	one := chi.NewRouter()
	one.Group(func(r chi.Router) { r.Use(outer); r.Get("/x", noop) })
	two := chi.NewRouter()
	two.Group(func(r chi.Router) { r.Use(outer); r.With(inner).Get("/x", noop) })
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"one-layer", one}, {"two-layers", two}} {
		b.Run(tc.name, func(b *testing.B) {
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clear(w.h)
				tc.h.ServeHTTP(w, reqs[i%clients])
				i++
			}
		})
	}
}
