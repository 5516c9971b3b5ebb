package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// Mounting on a chi router: r.Use for every route of a group, r.With for one route.
// The layers of one request decide together: a refusal by either spends from neither.
//
// The identity comes from a header that an authenticating gateway sets. keyfuncs.Header
// refuses a request without it (400, nothing counted): returning "" for a missing
// header instead would put every such client in one shared budget, so the middleware
// refuses an empty identity too.
func Example_chi() {
	lim, _ := memory.New()
	perClient, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "per-client", Limit: 3, Window: time.Minute},
		Identity: keyfuncs.Header("X-Client-Id"),
	}})
	if err != nil {
		panic(err)
	}
	expensive, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "report", Limit: 1, Window: time.Minute},
		Identity: keyfuncs.Header("X-Client-Id"),
		Scope:    keyfuncs.RoutePattern(),
	}})
	if err != nil {
		panic(err)
	}

	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {}) // never limited
	r.Group(func(r chi.Router) {
		r.Use(perClient)
		r.Get("/api/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") })
		r.With(expensive).Get("/api/report", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "report") })
	})

	get := func(path, client string) {
		req := httptest.NewRequest("GET", path, nil)
		if client != "" {
			req.Header.Set("X-Client-Id", client)
		}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		fmt.Printf("%s %d limit=%s remaining=%s\n", path, rec.Code, rec.Header().Get("X-RateLimit-Limit"), rec.Header().Get("X-RateLimit-Remaining"))
	}
	get("/api/report", "alice") // both budgets pay; "report" has least left
	get("/api/report", "alice") // "report" refuses: "per-client" keeps its 2
	get("/api/hello", "alice")
	get("/api/hello", "alice")
	get("/api/hello", "alice")
	get("/api/hello", "") // no identity: 400, nothing counted
	// Output:
	// /api/report 200 limit=1 remaining=0
	// /api/report 429 limit=1 remaining=0
	// /api/hello 200 limit=3 remaining=1
	// /api/hello 200 limit=3 remaining=0
	// /api/hello 429 limit=3 remaining=0
	// /api/hello 400 limit= remaining=
}

// Wrapping a plain net/http handler with a service-wide token bucket.
func Example_netHTTP() {
	lim, _ := memory.New()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: time.Second, Burst: 2},
		Identity: keyfuncs.Global(), // everyone shares one budget, asked for explicitly
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

// One limit per client address in one call, as httprate.LimitByIP gives.
func ExampleLimitByIP() {
	lim, _ := memory.New()
	perIP, err := middleware.LimitByIP(lim, 2, time.Minute)
	if err != nil {
		panic(err)
	}
	r := chi.NewRouter()
	r.Use(perIP)
	r.Get("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hi") })
	for range 3 {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "203.0.113.7:40000"
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
}
