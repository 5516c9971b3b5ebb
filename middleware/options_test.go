package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// A fail-closed 503 carries Retry-After: 1.
func TestUnavailableRetryAfter(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.down.Store(true)
	h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithBreaker(middleware.Breaker{Disabled: true}))(ok)
	rec := do(h, "GET", "/", nil)
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("store down: %d Retry-After %q, want 503 and 1", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// A zero memory.Limiter is ready to use with the defaults: New accepts it, and it limits.
func TestNewAcceptsZeroMemory(t *testing.T) {
	t.Parallel()
	h, err := middleware.New(&memory.Limiter{}, []middleware.Rule{{Rule: rule("api", 1, time.Minute), Identity: keyfuncs.Global()}})
	if err != nil {
		t.Fatalf("New with a zero memory.Limiter: %v", err)
	}
	srv := h(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code != want {
			t.Fatalf("request %d: status %d, want %d", i, rec.Code, want)
		}
	}
}
