package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// panicOnce returns whatever a panic through h carries for one GET /, as http.Server's
// recovery would see it (nil when h did not panic).
func panicOnce(h http.Handler, hdr map[string]string) (p any) {
	defer func() { p = recover() }()
	do(h, "GET", "/", hdr)
	return nil
}

// errCallback is what the callbacks of these tests panic with.
var errCallback = errors.New("callback bug")

// A user callback that panics after the request was admitted (http.Server recovers the
// panic and goes on serving) must not leave the request's in-flight lease held: the
// client would be refused until the lease expired. The panic itself goes on.
func TestCallbackPanicReleasesLease(t *testing.T) {
	t.Parallel()
	conc := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	cases := []struct {
		name string
		// rules and options of a layer whose callback panics once armed is set.
		build func(armed *atomic.Bool) ([]middleware.Rule, []middleware.Option)
	}{
		{"observer on admission", func(armed *atomic.Bool) ([]middleware.Rule, []middleware.Option) {
			return []middleware.Rule{{Rule: conc, Identity: global}},
				[]middleware.Option{middleware.WithObserver(func(ev middleware.Event) {
					if ev.Result == middleware.Allowed && armed.CompareAndSwap(true, false) {
						panic(errCallback)
					}
				})}
		}},
		{"observer with a shadow rule", func(armed *atomic.Bool) ([]middleware.Rule, []middleware.Option) {
			return []middleware.Rule{{Rule: rule("api", 100, time.Minute), Identity: global}, {Rule: conc, Identity: global, Shadow: true}},
				[]middleware.Option{middleware.WithObserver(func(ev middleware.Event) {
					if ev.Result == middleware.Allowed && armed.CompareAndSwap(true, false) {
						panic(errCallback)
					}
				})}
		}},
		{"CountActual callback", func(armed *atomic.Bool) ([]middleware.Rule, []middleware.Option) {
			work := middleware.CountActual(1, func(*http.Request, int, http.Header) int64 {
				if armed.CompareAndSwap(true, false) {
					panic(errCallback)
				}
				return 1
			})
			return []middleware.Rule{{Rule: conc, Identity: global}, {Rule: rule("work", 100, time.Minute), Identity: global, Counts: work}}, nil
		}},
		{"CountSuccesses callback", func(armed *atomic.Bool) ([]middleware.Rule, []middleware.Option) {
			charged := middleware.CountSuccesses(func(int) bool {
				if armed.CompareAndSwap(true, false) {
					panic(errCallback)
				}
				return true
			})
			return []middleware.Rule{{Rule: rule("ok", 100, time.Minute), Identity: global, Counts: charged}, {Rule: conc, Identity: global}}, nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := newMemory(t, newClock()) // the lease never expires on its own
			var armed atomic.Bool
			rules, opts := tc.build(&armed)
			var decided atomic.Int64
			opts = append(opts, middleware.WithObserver(func(ev middleware.Event) {
				if ev.Result == middleware.Allowed {
					decided.Add(1)
				}
			}))
			h := mustNew(t, lim, rules, opts...)(ok)
			armed.Store(true)
			if p := panicOnce(h, nil); p != errCallback {
				t.Fatalf("first request: panic %v, want the callback's", p)
			}
			for i := range 3 {
				if rec := do(h, "GET", "/", nil); rec.Code != 200 {
					t.Fatalf("request %d after the panic: %d, want 200: the panicking request's lease is still held", i+2, rec.Code)
				}
			}
			// The shadow rule's lease does not refuse: its decision shows whether it is held.
			if tc.name == "observer with a shadow rule" {
				if shadowLeft := freeSlots(t, lim, conc); shadowLeft != 1 {
					t.Fatalf("shadow lease: %d slots left after the panicking request, want 1", shadowLeft)
				}
			}
		})
	}
}

// A limiter without Ping that panics while deciding the open breaker's probe (a bug in a
// wrapping limiter, a panicking go-redis hook) must not leave the breaker waiting for
// that probe's result forever: every later decision would be refused as breaker_open,
// the store never asked again.
func TestBreakerProbePanicDoesNotWedgeTheBreaker(t *testing.T) {
	t.Parallel()
	next := newMemory(t, newClock())
	var calls atomic.Int64
	var mode atomic.Int32 // 0 fail, 1 panic, 2 healthy
	lim := limiterFunc(func(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
		calls.Add(1)
		switch mode.Load() {
		case 0:
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("connection refused")}
		case 1:
			panic(errCallback)
		}
		return next.Allow(ctx, checks)
	})
	var states []string
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 100, time.Minute), Identity: global}},
		middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) { states = append(states, strconv.FormatBool(open)) }}), middleware.WithBreakerTuning(0, 1, 0, time.Millisecond))(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 503 {
		t.Fatalf("failing store: %d, want 503", rec.Code)
	}
	mode.Store(1)
	// The breaker is open: requests are answered 503 without the store until the
	// cool-down ends, and the first request after it is the probe, which panics.
	for calls.Load() < 2 {
		func() {
			defer func() {
				if p := recover(); p != nil && p != errCallback {
					panic(p)
				}
			}()
			do(h, "GET", "/", nil)
		}()
		runtime.Gosched()
	}
	mode.Store(2)
	// The probe is gone: a request after the next cool-down must be a probe.
	if rec := do(h, "GET", "/", nil); rec.Code != 200 {
		t.Fatalf("healthy store after a panicking probe: %d (limiter called %d times, breaker states %v), want 200", rec.Code, calls.Load(), states)
	}
}

// For a limiter without Ping, exactly one probe reaches the open breaker's store however many requests arrive at once;
// a probe whose request is canceled frees its place for the next.
func TestBreakerHalfOpenProbesOneAtATime(t *testing.T) {
	t.Parallel()
	next := newMemory(t, newClock())
	var inStore, most, calls atomic.Int64
	var failing atomic.Bool
	failing.Store(true)
	release := make(chan struct{})
	lim := limiterFunc(func(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
		n := inStore.Add(1)
		defer inStore.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if calls.Add(1) == 1 || failing.Load() {
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("connection refused")}
		}
		select { // the probe is held until every other request has been answered
		case <-release:
		case <-ctx.Done():
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassCanceled, Err: ctx.Err()}
		}
		return next.Allow(ctx, checks)
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 1000, time.Minute), Identity: global}},
		middleware.WithTimeout(time.Hour),
		middleware.WithBreakerTuning(0, 1, 0, time.Millisecond))(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 503 {
		t.Fatalf("failing store: %d", rec.Code)
	}
	failing.Store(false)
	// A canceled probe: the request ends while the store is asked.
	for calls.Load() < 2 {
		ctx, cancel := context.WithCancel(context.Background())
		req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(httptest.NewRecorder(), req)
		}()
		for calls.Load() < 2 && inStore.Load() == 0 {
			select {
			case <-done:
			default:
				runtime.Gosched()
				continue
			}
			break
		}
		cancel()
		<-done
	}
	// Now many requests at once: one is the probe, held in the store; the others are
	// answered 503 without it.
	const n = 64
	codes := make(chan int, n)
	for range n {
		go func() { codes <- do(h, "GET", "/", nil).Code }()
	}
	got := map[int]int{}
	for range n - 1 {
		got[<-codes]++
	}
	close(release)
	got[<-codes]++
	if got[200] != 1 || got[503] != n-1 || most.Load() != 1 {
		t.Fatalf("codes %v, at most %d in the store at once; want one probe answered 200, the others 503, one in the store at a time", got, most.Load())
	}
}
