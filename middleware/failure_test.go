package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/middleware"
)

// flaky is a limiter for policy logic: it fails while down is set, otherwise it delegates.
type flaky struct {
	next  ratebudget.Limiter
	down  atomic.Bool
	hang  atomic.Bool // block until the context ends
	calls atomic.Int64
}

func (f *flaky) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	f.calls.Add(1)
	if f.hang.Load() {
		<-ctx.Done()
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: "timeout", Uncertain: true, Err: ctx.Err()}
	}
	if f.down.Load() {
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: "connection", Err: errors.New("dial tcp 10.1.2.3:6379: connect: connection refused")}
	}
	return f.next.Allow(ctx, checks)
}

func TestStoreErrorPolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opt     middleware.Option
		codes   []int
		outcome []middleware.Outcome
	}{
		{"closed", middleware.WithStoreErrorPolicy(middleware.FailClosed), []int{503, 503}, []middleware.Outcome{middleware.OutcomeUnavailable, middleware.OutcomeUnavailable}},
		{"open", middleware.WithStoreErrorPolicy(middleware.FailOpen), []int{200, 200, 200}, []middleware.Outcome{middleware.OutcomeDegraded, middleware.OutcomeDegraded, middleware.OutcomeDegraded}},
		// 10 / 2 replicas = 5 per process.
		{"local", middleware.WithLocalFallback(2), []int{200, 200, 200, 200, 200, 429, 429}, []middleware.Outcome{0, 0, 0, 0, 0, middleware.OutcomeDenied, middleware.OutcomeDenied}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{next: memory(t, newClock())}
			f.down.Store(true)
			var events []middleware.Event
			var mu sync.Mutex
			h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}}, tc.opt,
				middleware.WithBreaker(0, 0),
				middleware.WithObserver(func(e middleware.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))(ok)
			for i, want := range tc.codes {
				rec := do(h, "GET", "/", nil)
				if rec.Code != want {
					t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
				}
				if rec.Code >= 400 {
					if rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("Retry-After") == "" {
						t.Errorf("refusal without no-store/Retry-After: %v", rec.Header())
					}
					if got := rec.Body.String(); strings.Contains(got, "10.1.2.3") || strings.Contains(got, "refused") {
						t.Errorf("body leaks the store error: %q", got)
					}
				}
				if e := events[i]; e.Outcome != tc.outcome[i] || e.Err == nil || !errors.Is(e.Err, ratebudget.ErrStoreUnavailable) {
					t.Errorf("event %d: outcome %v err %v, want %v with the store error", i, e.Outcome, e.Err, tc.outcome[i])
				}
				if tc.name == "local" && !events[i].Fallback {
					t.Errorf("event %d not marked as a fallback decision", i)
				}
				if tc.name == "local" && rec.Header().Get("X-RateLimit-Limit") != "5" {
					// The local rule's limit, not the configured one's.
					t.Errorf("request %d: X-RateLimit-Limit %q, want 5", i, rec.Header().Get("X-RateLimit-Limit"))
				}
			}
		})
	}
}

func TestDecisionDeadline(t *testing.T) {
	t.Parallel()
	f := &flaky{next: memory(t, newClock())}
	f.hang.Store(true)
	var got middleware.Event
	h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithTimeout(20*time.Millisecond), middleware.WithBreaker(0, 0),
		middleware.WithObserver(func(e middleware.Event) { got = e }))(ok)
	rec := do(h, "GET", "/", nil) // returns only because the decision has its own deadline
	if rec.Code != 503 {
		t.Fatalf("hung store: %d, want 503", rec.Code)
	}
	var se *ratebudget.StoreError
	if !errors.As(got.Err, &se) || se.Class != "timeout" || !se.Uncertain {
		t.Fatalf("event error %v, want an uncertain timeout", got.Err)
	}
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := &flaky{next: memory(t, clk)}
	f.down.Store(true)
	var transitions []string
	h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 100, time.Minute), Identity: global}},
		middleware.WithBreaker(3, 2*time.Second),
		middleware.WithClock(clk.Now),
		middleware.WithBreakerObserver(func(from, to middleware.BreakerState) {
			transitions = append(transitions, from.String()+">"+to.String())
		}))(ok)
	for range 10 {
		if rec := do(h, "GET", "/", nil); rec.Code != 503 {
			t.Fatalf("%d", rec.Code)
		}
	}
	if n := f.calls.Load(); n != 3 {
		t.Fatalf("store called %d times, want 3 (then the breaker opens)", n)
	}
	clk.Advance(2 * time.Second)
	do(h, "GET", "/", nil) // the probe fails: open again
	if n := f.calls.Load(); n != 4 {
		t.Fatalf("store called %d times, want 4 (one probe)", n)
	}
	do(h, "GET", "/", nil)
	if n := f.calls.Load(); n != 4 {
		t.Fatalf("store called %d times during the cool-down, want 4", n)
	}
	f.down.Store(false)
	clk.Advance(2 * time.Second)
	if rec := do(h, "GET", "/", nil); rec.Code != 200 || rec.Header().Get(headers.Remaining) != "99" {
		t.Fatalf("probe after recovery: %d", rec.Code)
	}
	if rec := do(h, "GET", "/", nil); rec.Code != 200 {
		t.Fatalf("after closing: %d", rec.Code)
	}
	want := []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed"}
	if len(transitions) != len(want) {
		t.Fatalf("transitions %v, want %v", transitions, want)
	}
	for i := range want {
		if transitions[i] != want[i] {
			t.Fatalf("transitions %v, want %v", transitions, want)
		}
	}
}

// A limiter's non-store error must not be read as an admission or an empty budget.
func TestNonStoreErrorAppliesPolicy(t *testing.T) {
	t.Parallel()
	bad := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{Allowed: true}, errors.New("weird")
	})
	h := mustNew(t, bad, []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global}})(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 503 {
		t.Fatalf("%d, want 503", rec.Code)
	}
}

type limiterFunc func(context.Context, []ratebudget.Check) (ratebudget.Decision, error)

func (f limiterFunc) Allow(ctx context.Context, c []ratebudget.Check) (ratebudget.Decision, error) {
	return f(ctx, c)
}

var _ http.Handler = ok

// A limiter that ignores its context (a go-redis client without ContextTimeoutEnabled on
// a hung server) still costs a request only the decision deadline. The abandoned call
// reads its own copy of the checks, so requests that follow cannot race with it.
func TestDeadlineHoldsWhenLimiterIgnoresContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var running sync.WaitGroup
	var calls atomic.Int64
	stuck := limiterFunc(func(_ context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
		defer running.Done()
		calls.Add(1)
		select { // ignores the context
		case <-release:
		case <-time.After(5 * time.Second): // without a bound in the middleware, the request waits this long
		}
		for _, c := range checks {
			if c.Rule.Name != "r" || c.Cost != 1 {
				return ratebudget.Decision{}, errors.New("checks changed under an abandoned call")
			}
		}
		return ratebudget.Decision{Allowed: true}, nil
	})
	var mu sync.Mutex
	var events []middleware.Event
	h := mustNew(t, stuck, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithTimeout(20*time.Millisecond), middleware.WithBreaker(0, 0),
		middleware.WithObserver(func(e middleware.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))(ok)
	for i := range 5 {
		running.Add(1) // done by the limiter call, which outlives the request
		start := time.Now()
		rec := do(h, "GET", "/", nil)
		if el := time.Since(start); el > time.Second {
			t.Fatalf("request %d took %v with a 20ms decision deadline", i, el)
		}
		if rec.Code != 503 {
			t.Fatalf("request %d: %d, want 503", i, rec.Code)
		}
	}
	close(release)
	running.Wait()
	if n := calls.Load(); n != 5 {
		t.Fatalf("limiter called %d times, want 5", n)
	}
	for i, e := range events {
		var se *ratebudget.StoreError
		if !errors.As(e.Err, &se) || se.Class != "timeout" || !se.Uncertain || e.Outcome != middleware.OutcomeUnavailable {
			t.Fatalf("event %d: %v %v, want unavailable with an uncertain timeout", i, e.Outcome, e.Err)
		}
	}
}

// within is a ContextBound limiter that also bounds its own time (ratebudget.TimeoutBound).
type within struct {
	flaky
	bounded  bool
	timeouts []time.Duration
	mu       sync.Mutex
}

func (w *within) BoundByContext() bool { return w.bounded }

func (w *within) AllowWithin(ctx context.Context, timeout time.Duration, checks []ratebudget.Check) (ratebudget.Decision, error) {
	w.mu.Lock()
	w.timeouts = append(w.timeouts, timeout)
	w.mu.Unlock()
	if _, ok := ctx.Deadline(); ok {
		return ratebudget.Decision{}, errors.New("AllowWithin got a context with a deadline")
	}
	if w.hang.Load() {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-t.C:
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: "timeout", Uncertain: true, Err: context.DeadlineExceeded}
		case <-ctx.Done():
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: "canceled", Uncertain: true, Err: ctx.Err()}
		}
	}
	return w.flaky.Allow(ctx, checks)
}

// TestTimeoutBoundLimiter: a limiter that bounds its own decisions gets the deadline as
// a timeout, with no context deadline of the middleware's; its timeouts apply the policy
// and count in the breaker like any store failure. One that does not report
// BoundByContext is called through Allow, as before.
func TestTimeoutBoundLimiter(t *testing.T) {
	w := &within{flaky: flaky{next: memory(t, newClock())}, bounded: true}
	var events []middleware.Event
	var mu sync.Mutex
	h := mustNew(t, w, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithTimeout(30*time.Millisecond), middleware.WithBreaker(2, time.Hour),
		middleware.WithObserver(func(e middleware.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 200 {
		t.Fatalf("admitted request: %d", rec.Code)
	}
	w.hang.Store(true)
	for i, want := range []int{503, 503, 503} {
		if rec := do(h, "GET", "/", nil); rec.Code != want {
			t.Fatalf("hung request %d: %d, want %d", i, rec.Code, want)
		}
	}
	if got := w.calls.Load(); got != 1 {
		t.Errorf("Allow called %d times through AllowWithin, want 1 (the admitted request)", got)
	}
	w.mu.Lock()
	if len(w.timeouts) != 3 || w.timeouts[0] != 30*time.Millisecond {
		t.Errorf("AllowWithin timeouts %v, want 30ms for the admitted and the two hung requests before the breaker opened", w.timeouts)
	}
	w.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for i, wantClass := range []string{"timeout", "timeout", "breaker_open"} {
		var se *ratebudget.StoreError
		if !errors.As(events[i+1].Err, &se) || se.Class != wantClass {
			t.Errorf("event %d: %v, want a %s StoreError", i+1, events[i+1].Err, wantClass)
		}
	}

	// Not bounded by its context: the middleware keeps its own deadline and Allow.
	u := &within{flaky: flaky{next: memory(t, newClock())}}
	h = mustNew(t, u, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}})(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 200 || u.calls.Load() != 1 || len(u.timeouts) != 0 {
		t.Fatalf("unbounded limiter: %d, %d Allow calls, AllowWithin %v", rec.Code, u.calls.Load(), u.timeouts)
	}
}

// Checks are pooled with their rules in place; a local-fallback decision swaps in the
// local rules (limit / replicas), and the store must never see them afterwards.
func TestLocalFallbackLeavesPooledRulesIntact(t *testing.T) {
	t.Parallel()
	configured := rule("r", 1000, time.Minute) // locally 500: the fallback admits all 20
	var fail bool
	var seen []ratebudget.Rule
	lim := limiterFunc(func(_ context.Context, c []ratebudget.Check) (ratebudget.Decision, error) {
		seen = append(seen, c[0].Rule)
		if fail {
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: "connection", Err: errors.New("down")}
		}
		return ratebudget.Decision{Allowed: true, Rule: c[0].Rule.Name, Limit: c[0].Rule.Limit, Remaining: 1}, nil
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: configured, Identity: global}},
		middleware.WithLocalFallback(2), middleware.WithBreaker(0, 0))(ok)
	for i := range 40 {
		fail = i%2 == 0
		if rec := do(h, "GET", "/", nil); rec.Code != 200 {
			t.Fatalf("request %d: %d, want 200", i, rec.Code)
		}
	}
	for i, r := range seen {
		if r != configured {
			t.Fatalf("call %d got rule %+v, want the configured %+v", i, r, configured)
		}
	}
}
