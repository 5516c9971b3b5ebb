package middleware_test

import (
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

// Building many limiters and middlewares, and serving concurrent requests through them
// (in-flight leases renewed while handlers run, settles, breakers, metrics), leaves no
// goroutine behind once the requests have returned and the Redis client is closed:
// nothing the library starts outlives its work, so dropping a limiter or a middleware
// needs no Close. Not parallel: it counts the process's goroutines.
func TestNoGoroutineOutlivesItsWork(t *testing.T) {
	srv := redistest.Start(t) // its process's waiter is counted in the baseline
	before := runtime.NumGoroutine()
	client := srv.Client(t)
	conc := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 100, Window: 20 * time.Millisecond}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(15 * time.Millisecond) // work long enough for a lease renewal or two
		w.WriteHeader(http.StatusOK)
	})
	m := metrics.New()
	var handlers []http.Handler
	for i := range 20 {
		redisLim, err := lua.New(client, lua.WithPrefix("g"+strconv.Itoa(i)), lua.WithCoalescing(8))
		if err != nil {
			t.Fatal(err)
		}
		for _, lim := range []ratebudget.Limiter{redisLim, newMemory(t, newClock())} {
			rules := []middleware.Rule{{Rule: rule("api", 1000, time.Minute), Identity: global}}
			if _, ok := lim.(*lua.Limiter); ok {
				rules = append(rules, middleware.Rule{Rule: conc, Identity: global})
			}
			handlers = append(handlers, mustNew(t, lim, rules, middleware.WithTimeout(time.Minute),
				middleware.WithObserver(m.Observe), middleware.WithBreaker(middleware.Breaker{OnChange: m.BreakerChanged}))(slow))
		}
	}
	var wg sync.WaitGroup
	for _, h := range handlers {
		for range 4 {
			wg.Go(func() {
				if rec := do(h, "GET", "/", nil); rec.Code != 200 {
					t.Errorf("%d", rec.Code)
				}
			})
		}
	}
	wg.Wait()
	client.Close()
	handlers = nil
	// Goroutines end on their own schedule once their work is done: wait for the count
	// to come back, and fail only if it does not within a generous bound.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%d goroutines left, %d before:\n%s", n, before, buf)
	}
}
