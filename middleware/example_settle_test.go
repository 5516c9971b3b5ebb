package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// Charging only what succeeded: a response of 500 or more is given back, so a client
// is not refused for the server's own failures.
func ExampleCountSuccesses() {
	lim, _ := memory.New()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "calls", Limit: 2, Window: time.Minute},
		Identity: keyfuncs.Global(),
		Counts:   middleware.CountSuccesses(nil), // nil: charged when the status is below 500
	}})
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.WriteHeader(status)
	}))
	for _, status := range []string{"500", "500", "200", "200", "200"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/?status="+status, nil))
		fmt.Print(rec.Code, " ")
	}
	fmt.Println()
	// Output: 500 500 200 200 429
}

// A rule in shadow mode is decided and spent like an enforced one, but never refuses:
// the observer sees what it would have refused, before the rule is turned on.
func ExampleRule_shadow() {
	lim, _ := memory.New()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "trial", Limit: 1, Window: time.Minute},
		Identity: keyfuncs.Global(),
		Shadow:   true,
	}}, middleware.WithObserver(func(e middleware.Event) {
		fmt.Print("would refuse: ", e.Shadow.Rule != "" && !e.Shadow.Allowed, "; ")
	}))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		fmt.Println("status", rec.Code)
	}
	// Output:
	// would refuse: false; status 200
	// would refuse: true; status 200
	// would refuse: true; status 200
}

// At most two requests per client running at once: the third, while two run, is 429
// with Retry-After: 1. A lease is released when its handler returns.
func ExampleRule_inFlight() {
	lim, _ := memory.New()
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "exports", Algorithm: ratebudget.InFlight, Limit: 2, Window: 30 * time.Second},
		Identity: keyfuncs.Global(),
	}})
	if err != nil {
		panic(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	h := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		started <- struct{}{}
		<-finish
	}))
	done := make(chan int)
	for range 2 {
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/export", nil))
			done <- rec.Code
		}()
		<-started
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/export", nil))
	fmt.Println("a third while two run:", rec.Code, "Retry-After", rec.Header().Get("Retry-After"))
	close(finish)
	fmt.Println("the two:", <-done, <-done)
	go func() { <-started }()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/export", nil))
	fmt.Println("after they returned:", rec.Code)
	// Output:
	// a third while two run: 429 Retry-After 1
	// the two: 200 200
	// after they returned: 200
}
