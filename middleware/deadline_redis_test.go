package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// A request whose own deadline ends while a hung Redis decides is canceled, under every
// policy: nothing is written, its handler does not run, and it is neither a store
// failure to observers nor one toward the breaker. The client's socket deadline (the
// request's) can end the call before the context's own timer has marked it done; that
// must not turn the request into a 503, a degraded admission or a fallback decision.
func TestRequestDeadlineWhileStoreHangsIsCanceled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lim, err := lua.New(srv.Client(t), lua.WithPrefix("deadline"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Freeze(t)
	for name, policy := range map[string]middleware.Option{
		"FailClosed":    failClosed,
		"FailOpen":      middleware.WithFailOpen(),
		"LocalFallback": middleware.WithLocalFallback(2),
	} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var events []middleware.Event
			var transitions []bool
			served := 0
			h := mustNew(t, lim, []middleware.Rule{{Rule: rule("api", 100, time.Minute), Identity: global}}, policy,
				middleware.WithTimeout(time.Minute), // the request's deadline is the one that ends the call
				middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
					mu.Lock()
					transitions = append(transitions, open)
					mu.Unlock()
				}}), middleware.WithBreakerTuning(0, 1, 0.01, time.Hour),
				middleware.WithObserver(func(e middleware.Event) {
					mu.Lock()
					events = append(events, e)
					mu.Unlock()
				}))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
			const n = 10
			for i := range n {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
				cancel()
				if rec.Body.Len() != 0 || len(rec.Header()) != 0 {
					t.Errorf("request %d: wrote %d %v %q, want nothing written", i, rec.Code, rec.Header(), rec.Body)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if served != 0 {
				t.Errorf("the handler ran for %d of %d requests whose deadline ended during the decision", served, n)
			}
			if len(events) != n {
				t.Fatalf("%d events for %d requests", len(events), n)
			}
			for i, e := range events {
				if e.Result != middleware.Canceled || e.Fallback {
					t.Errorf("request %d: outcome %v (fallback %v, err %v), want canceled", i, e.Result, e.Fallback, e.Err)
				}
			}
			if len(transitions) != 0 {
				t.Errorf("breaker went %v: requests that ended on their own deadline were counted as store failures", transitions)
			}
		})
	}
}
