package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// A refusal handler that records the refusal, then answers a 429 as the default does.
// The middleware has set the budget metadata, Retry-After and Cache-Control: no-store
// before it calls the handler; headers.WriteTooManyRequests adds the status and the
// body. A cost above the rule's capacity (d.Exceeded) can never be admitted: it is
// answered 413, without Retry-After (the middleware has set none).
func ExampleWithRefusalHandler() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) // a clock that stands still
	lim, _ := memory.New(memory.WithClock(func() time.Time { return now }))
	limit, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "api", Limit: 1, Window: time.Minute},
		Identity: keyfuncs.Global(),
	}}, middleware.WithRefusalHandler(func(w http.ResponseWriter, r *http.Request, d ratebudget.Decision) {
		fmt.Printf("refused %s %s by %q\n", r.Method, r.URL.Path, d.Rule)
		if d.Exceeded {
			http.Error(w, "the cost of this request exceeds the capacity of rate limit "+strconv.Quote(d.Rule), http.StatusRequestEntityTooLarge)
			return
		}
		headers.WriteTooManyRequests(w, r, d)
	}))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") }))
	for range 2 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/hello", nil))
		fmt.Print(rec.Code, " remaining=", rec.Header().Get("X-RateLimit-Remaining"), " retry-after=", rec.Header().Get("Retry-After"), ": ", rec.Body.String())
	}
	// Output:
	// 200 remaining=0 retry-after=: hello
	// refused GET /api/hello by "api"
	// 429 remaining=0 retry-after=60: Too Many Requests: rate limit "api" exhausted; retry in 60s
}
