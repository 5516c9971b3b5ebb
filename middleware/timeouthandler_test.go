package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// TestInFlightAndTimeoutHandler: an InFlight lease lasts as long as the handler the
// middleware wraps. Inside http.TimeoutHandler the lease is held until the handler really
// returns, also after the client got TimeoutHandler's 503; around it, the lease goes when
// TimeoutHandler answers while the timed-out handler keeps running, and another request is
// admitted beside it. The package documentation gives this order.
func TestInFlightAndTimeoutHandler(t *testing.T) {
	t.Parallel()
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	for _, tc := range []struct {
		name   string
		inside bool // the middleware inside TimeoutHandler
		second int  // the second request's status while the first handler still runs
	}{
		{"inside", true, http.StatusTooManyRequests},
		{"around", false, http.StatusOK}, // admitted beside the running handler
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := newMemory(t, newClock())
			limit := mustNew(t, lim, []middleware.Rule{{Rule: slots, Identity: byHeader("X-Client")}})
			release := make(chan struct{})
			var running sync.WaitGroup
			// The first request's context ends once its handler runs: TimeoutHandler
			// answers it 503 as at a deadline, while the handler runs on. (A deadline
			// short enough for the test would also time out the second request's
			// decision on a loaded machine.)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first := true
			var mu sync.Mutex
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				f := first
				first = false
				mu.Unlock()
				if f {
					defer running.Done()
					cancel()
					<-release // runs on after TimeoutHandler answered
				}
			})
			running.Add(1)
			var h http.Handler
			if tc.inside {
				h = http.TimeoutHandler(limit(slow), time.Minute, "timed out")
			} else {
				h = limit(http.TimeoutHandler(slow, time.Minute, "timed out"))
			}
			req := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
			req.Header.Set("X-Client", "alice")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("first request: %d, want TimeoutHandler's 503", rec.Code)
			}
			// The first handler is still running (it waits for release).
			if c := do(h, "GET", "/", map[string]string{"X-Client": "alice"}).Code; c != tc.second {
				t.Errorf("second request while the first handler runs: %d, want %d", c, tc.second)
			}
			close(release)
			running.Wait()
		})
	}
}
