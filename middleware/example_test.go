package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// Mounting on a chi router: r.Use for every route of a group, r.With for one route.
func Example_chi() {
	lim, _ := ratebudget.NewMemory()
	perClient, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "per-client", Limit: 2, Window: time.Minute},
		Identity: func(r *http.Request) (string, error) { return r.Header.Get("X-Client-Id"), nil },
	}})
	if err != nil {
		panic(err)
	}

	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {}) // never limited
	r.Group(func(r chi.Router) {
		r.Use(perClient)
		r.Get("/api/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") })
	})

	for range 3 {
		req := httptest.NewRequest("GET", "/api/hello", nil)
		req.Header.Set("X-Client-Id", "alice")
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		fmt.Printf("%d remaining=%s retry-after=%q\n", rec.Code, rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="60"
}

// Wrapping a plain net/http handler with a service-wide token bucket.
func Example_netHTTP() {
	lim, _ := ratebudget.NewMemory()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: time.Second, Burst: 2},
		Identity: func(*http.Request) (string, error) { return "", nil }, // everyone shares one budget
	}})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /work", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "done") })))

	for range 3 {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/work", nil))
		fmt.Printf("%d limit=%s remaining=%s cache-control=%q\n", rec.Code, rec.Header().Get("X-RateLimit-Limit"), rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("Cache-Control"))
	}
	// Output:
	// 200 limit=2 remaining=1 cache-control=""
	// 200 limit=2 remaining=0 cache-control=""
	// 429 limit=2 remaining=0 cache-control="no-store"
}
