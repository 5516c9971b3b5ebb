package middleware_test

import (
	"net/http"
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
			lim := memory(t, newClock())
			limit := mustNew(t, lim, []middleware.Rule{{Rule: slots, Identity: byHeader("X-Client")}})
			release := make(chan struct{})
			var running sync.WaitGroup
			first := true
			var mu sync.Mutex
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				f := first
				first = false
				mu.Unlock()
				if f {
					defer running.Done()
					<-release // runs on after TimeoutHandler answered
				}
			})
			running.Add(1)
			var h http.Handler
			if tc.inside {
				h = http.TimeoutHandler(limit(slow), time.Millisecond, "timed out")
			} else {
				h = limit(http.TimeoutHandler(slow, time.Millisecond, "timed out"))
			}
			alice := map[string]string{"X-Client": "alice"}
			if c := do(h, "GET", "/", alice).Code; c != http.StatusServiceUnavailable {
				t.Fatalf("first request: %d, want TimeoutHandler's 503", c)
			}
			// The first handler is still running (it waits for release).
			if c := do(h, "GET", "/", alice).Code; c != tc.second {
				t.Errorf("second request while the first handler runs: %d, want %d", c, tc.second)
			}
			close(release)
			running.Wait()
		})
	}
}
