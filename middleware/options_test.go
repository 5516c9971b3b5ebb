package middleware_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// A fail-closed 503 carries Retry-After: 1 by default, and WithUnavailableRetryAfter's
// value (whole seconds, rounded up) when set; a value below 1s is refused at
// construction.
func TestUnavailableRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []middleware.Option
		want string
	}{
		{"default", nil, "1"},
		{"30s", []middleware.Option{middleware.WithUnavailableRetryAfter(30 * time.Second)}, "30"},
		{"rounded up", []middleware.Option{middleware.WithUnavailableRetryAfter(2500 * time.Millisecond)}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{next: newMemory(t, newClock())}
			f.down.Store(true)
			opts := append([]middleware.Option{middleware.WithBreaker(middleware.Breaker{Disabled: true})}, tc.opts...)
			h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}}, opts...)(ok)
			rec := do(h, "GET", "/", nil)
			if rec.Code != 503 || rec.Header().Get("Retry-After") != tc.want {
				t.Fatalf("store down: %d Retry-After %q, want 503 and %s", rec.Code, rec.Header().Get("Retry-After"), tc.want)
			}
		})
	}
	_, err := middleware.New(newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithUnavailableRetryAfter(999*time.Millisecond))
	var ce *ratebudget.ConfigError
	if !errors.As(err, &ce) || ce.Field != "WithUnavailableRetryAfter" {
		t.Fatalf("999ms: err %v, want a ConfigError naming WithUnavailableRetryAfter", err)
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
