package middleware_test

import (
	"context"
	stdjson "encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/middleware"
)

// failClosed stands for the default policy, fail-closed, in tables of policies: it
// needs no option, and this one changes nothing.
var failClosed = middleware.WithObserver(func(middleware.Event) {})

// flaky is a limiter for policy logic: it fails while down is set, otherwise it delegates.
type flaky struct {
	next  ratebudget.Limiter
	down  atomic.Bool
	hang  atomic.Bool // block until the context ends
	calls atomic.Int64
	class ratebudget.ErrorClass // the failures' StoreError.Class; "" for a refused connection
}

func (f *flaky) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	f.calls.Add(1)
	if f.hang.Load() {
		<-ctx.Done()
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassTimeout, Uncertain: true, Err: ctx.Err()}
	}
	if f.down.Load() {
		if f.class != "" {
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: f.class, Err: errors.New("OOM command not allowed")}
		}
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("dial tcp 10.1.2.3:6379: connect: connection refused")}
	}
	return f.next.Allow(ctx, checks)
}

func TestStoreErrorPolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opt     middleware.Option
		codes   []int
		outcome []middleware.Result
	}{
		{"closed", failClosed, []int{503, 503}, []middleware.Result{middleware.Unavailable, middleware.Unavailable}},
		{"open", middleware.WithFailOpen(), []int{200, 200, 200}, []middleware.Result{middleware.Degraded, middleware.Degraded, middleware.Degraded}},
		// 10 / 2 replicas = 5 per process.
		{"local", middleware.WithLocalFallback(2), []int{200, 200, 200, 200, 200, 429, 429}, []middleware.Result{middleware.Allowed, middleware.Allowed, middleware.Allowed, middleware.Allowed, middleware.Allowed, middleware.Denied, middleware.Denied}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{next: newMemory(t, newClock())}
			f.down.Store(true)
			var events []middleware.Event
			var mu sync.Mutex
			h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}}, tc.opt,
				middleware.WithBreaker(middleware.Breaker{Disabled: true}),
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
				if e := events[i]; e.Result != tc.outcome[i] || e.Err == nil || !errors.Is(e.Err, ratebudget.ErrStoreUnavailable) {
					t.Errorf("event %d: outcome %v err %v, want %v with the store error", i, e.Result, e.Err, tc.outcome[i])
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

// TestDecisionDeadline: a decision has its own deadline, and a limiter error after it
// passed is an uncertain store timeout, whether the limiter said so (a StoreError) or
// returned the context's bare error.
func TestDecisionDeadline(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.hang.Store(true)
	bare := limiterFunc(func(ctx context.Context, _ []ratebudget.Check) (ratebudget.Decision, error) {
		<-ctx.Done()
		return ratebudget.Decision{}, ctx.Err()
	})
	for _, tc := range []struct {
		name string
		lim  ratebudget.Limiter
	}{{"store error", f}, {"bare context error", bare}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got middleware.Event
			h := mustNew(t, tc.lim, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
				middleware.WithTimeout(20*time.Millisecond), middleware.WithBreaker(middleware.Breaker{Disabled: true}),
				middleware.WithObserver(func(e middleware.Event) { got = e }))(ok)
			rec := do(h, "GET", "/", nil) // returns only because the decision has its own deadline
			if rec.Code != 503 {
				t.Fatalf("hung store: %d, want 503", rec.Code)
			}
			var se *ratebudget.StoreError
			if !errors.As(got.Err, &se) || se.Class != ratebudget.ClassTimeout || !se.Uncertain || !errors.Is(got.Err, context.DeadlineExceeded) {
				t.Fatalf("event error %v, want an uncertain timeout wrapping the deadline", got.Err)
			}
		})
	}
}

// A store that refuses connections opens the breaker after a few calls, well before
// the failure ratio's minimum; while open no decision goes to the store, and for a
// limiter without Ping, a decision after the cool-down is the probe whose success
// closes it.
func TestBreaker(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.down.Store(true)
	var mu sync.Mutex
	var transitions []bool
	h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 100, time.Minute), Identity: global}},
		middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
			mu.Lock()
			transitions = append(transitions, open)
			mu.Unlock()
		}}), middleware.WithBreakerTuning(time.Hour, 1000, 0, time.Hour))(ok)
	for range 10 {
		if rec := do(h, "GET", "/", nil); rec.Code != 503 {
			t.Fatalf("%d", rec.Code)
		}
	}
	if n := f.calls.Load(); n != 3 {
		t.Fatalf("store called %d times, want 3: three refused connections in a row open the breaker", n)
	}
	mu.Lock()
	if len(transitions) != 1 || !transitions[0] {
		t.Fatalf("transitions %v, want [true]", transitions)
	}
	mu.Unlock()

	// A short cool-down: the first request after it is the probe.
	f2 := &flaky{next: newMemory(t, newClock())}
	f2.down.Store(true)
	var opened, closed atomic.Int64
	h = mustNew(t, f2, []middleware.Rule{{Rule: rule("r", 100, time.Minute), Identity: global}},
		middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
			if open {
				opened.Add(1)
			} else {
				closed.Add(1)
			}
		}}), middleware.WithBreakerTuning(0, 0, 0, time.Millisecond))(ok)
	for opened.Load() == 0 {
		do(h, "GET", "/", nil)
	}
	f2.down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec := do(h, "GET", "/", nil)
		if rec.Code == 200 {
			break
		}
		if rec.Code != 503 || time.Now().After(deadline) {
			t.Fatalf("after recovery: %d", rec.Code)
		}
		runtime.Gosched()
	}
	if rec := do(h, "GET", "/", nil); rec.Code != 200 || opened.Load() != 1 || closed.Load() != 1 {
		t.Fatalf("after closing: %d, opened %d closed %d times, want 200, 1 and 1", rec.Code, opened.Load(), closed.Load())
	}
}

// A store that replies to no call for Stall (its calls wait out their deadline) opens
// the breaker, before the failure ratio could, even at one decision at a time;
// timeouts among answered calls (a starved host) do not.
func TestBreakerStall(t *testing.T) {
	t.Parallel()
	for _, hung := range []bool{false, true} {
		f := &flaky{next: newMemory(t, newClock())}
		var opened atomic.Int64
		// Longer than one timed-out call takes even on a starved machine, shorter than the
		// timeouts below take together (120 x 5ms): only a gap without replies may open it.
		stall := 500 * time.Millisecond
		if hung {
			stall = time.Millisecond // shorter than one call's deadline
		}
		h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 1<<40, time.Minute), Identity: global}},
			middleware.WithTimeout(5*time.Millisecond),
			middleware.WithBreaker(middleware.Breaker{Stall: stall, OnChange: func(open bool) {
				if open {
					opened.Add(1)
				}
			}}), middleware.WithBreakerTuning(0, 1000, 0, time.Hour))(ok)
		if !hung {
			// Every other call waits out its deadline, 600ms in all; the calls between
			// are answered.
			for i := range 240 {
				f.hang.Store(i%2 == 1)
				do(h, "GET", "/", nil)
			}
			if opened.Load() != 0 || f.calls.Load() != 240 {
				t.Fatalf("breaker opened %d times, store called %d times; want 0 and 240: answers came between the timeouts", opened.Load(), f.calls.Load())
			}
			continue
		}
		f.hang.Store(true)
		for range 10 {
			if rec := do(h, "GET", "/", nil); rec.Code != 503 {
				t.Fatalf("hung store: %d, want 503", rec.Code)
			}
		}
		if opened.Load() != 1 || f.calls.Load() != 1 {
			t.Fatalf("breaker opened %d times, store called %d times; want 1 and 1: the call that waited longer than Stall opened it", opened.Load(), f.calls.Load())
		}
	}
}

// A breaker that stays open shows the store no calls; a few slow answers among many
// good ones (a starved host) do not open it.
func TestBreakerTripRule(t *testing.T) {
	t.Parallel()
	// Error replies (OOM, BUSY): the store answers, so only the ratio can open it.
	f := &flaky{next: newMemory(t, newClock()), class: "server"}
	var opened atomic.Int64
	h := mustNew(t, f, []middleware.Rule{{Rule: rule("r", 1<<40, time.Minute), Identity: global}},
		middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
			if open {
				opened.Add(1)
			}
		}}), middleware.WithBreakerTuning(time.Hour, 10, 0.5, time.Hour))(ok)
	// 40% failures over 50 calls (ok, ok, ok, fail, fail, ...): never at the ratio.
	for i := range 50 {
		f.down.Store(i%5 >= 3)
		do(h, "GET", "/", nil)
	}
	if opened.Load() != 0 || f.calls.Load() != 50 {
		t.Fatalf("breaker opened %d times after 40%% failures, store called %d times; want 0 and 50", opened.Load(), f.calls.Load())
	}
	// Now every call fails: 20 of 50 failed, and the window reaches one half at the
	// tenth failure in a row (30 of 60).
	f.down.Store(true)
	for range 20 {
		do(h, "GET", "/", nil)
	}
	if opened.Load() != 1 || f.calls.Load() != 60 {
		t.Fatalf("breaker opened %d times, store called %d times; want 1 and 60 (opens at 30 of 60 failed)", opened.Load(), f.calls.Load())
	}
}

// Errors that are not the store's (a canceled request, a limiter that rejects its
// checks) never count toward the breaker.
func TestBreakerIgnoresNonStoreErrors(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	lim := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		calls.Add(1)
		return ratebudget.Decision{}, &ratebudget.ConfigError{Field: "checks", Problem: "rejected"}
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithBreakerTuning(0, 1, 0, time.Hour),
		middleware.WithFailOpen())(ok)
	for i := range 20 {
		if rec := do(h, "GET", "/", nil); rec.Code != 500 {
			t.Fatalf("request %d: %d, want 500 (a configuration error, under FailOpen too)", i, rec.Code)
		}
	}
	if calls.Load() != 20 {
		t.Fatalf("limiter called %d times, want 20: configuration errors must not open the breaker", calls.Load())
	}
}

// A store error of a request whose client went away during the decision says nothing
// about the store: it does not count toward opening the breaker.
func TestBreakerIgnoresCanceledRequests(t *testing.T) {
	t.Parallel()
	next := newMemory(t, newClock())
	var calls atomic.Int64
	var cancelRequest context.CancelFunc // set before each canceled request; the limiter runs on its goroutine
	lim := limiterFunc(func(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
		calls.Add(1)
		if cancelRequest != nil {
			cancelRequest()
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassCanceled, Err: ctx.Err()}
		}
		return next.Allow(ctx, checks)
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 100, time.Minute), Identity: global}},
		middleware.WithBreakerTuning(0, 1, 0, time.Hour))(ok)
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cancelRequest = cancel
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
		cancelRequest = nil
		cancel()
	}
	if n := calls.Load(); n != 20 {
		t.Fatalf("limiter called %d times for 20 requests", n)
	}
	// With a minimum of 1 call, one counted failure would have opened the breaker for an
	// hour.
	if rec := do(h, "GET", "/", nil); rec.Code != 200 || calls.Load() != 21 {
		t.Fatalf("after 20 canceled requests: %d, limiter called %d times; want 200 from the store: canceled requests must not open the breaker", rec.Code, calls.Load())
	}
}

// A limiter's non-store error must not be read as an admission or an empty budget.
func TestNonStoreErrorAppliesPolicy(t *testing.T) {
	t.Parallel()
	bad := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}}, errors.New("weird")
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
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("down")}
		}
		return ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true, Remaining: 1}, Rule: c[0].Rule.Name, Limit: c[0].Rule.Limit}, nil
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: configured, Identity: global}},
		middleware.WithLocalFallback(2), middleware.WithBreaker(middleware.Breaker{Disabled: true}))(ok)
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

// TestLocalFallbackShares: the local budget is each rule's Limit and Burst divided by the
// replica count, rounded down but at least 1.
func TestLocalFallbackShares(t *testing.T) {
	t.Parallel()
	down := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("down")}
	})
	for _, tc := range []struct {
		name     string
		rule     ratebudget.Rule
		replicas int
		admitted int
	}{
		{"limit rounded down", rule("r", 11, time.Minute), 2, 5},
		{"limit below the replicas", rule("r", 3, time.Minute), 4, 1},
		// A bucket of 40 that refills 2 a minute: 10 locally, not the refill's 1.
		{"burst", ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 2, Burst: 40, Window: time.Minute}, 4, 10},
		{"burst below the replicas", ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 8, Burst: 3, Window: time.Minute}, 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := mustNew(t, down, []middleware.Rule{{Rule: tc.rule, Identity: global}}, middleware.WithLocalFallback(tc.replicas),
				middleware.WithBreaker(middleware.Breaker{Disabled: true}))(ok)
			for i := range tc.admitted {
				if rec := do(h, "GET", "/", nil); rec.Code != 200 {
					t.Fatalf("request %d: %d, want 200 (a local budget of %d)", i, rec.Code, tc.admitted)
				}
			}
			if rec := do(h, "GET", "/", nil); rec.Code != 429 {
				t.Fatalf("request %d: %d, want 429 (a local budget of %d)", tc.admitted, rec.Code, tc.admitted)
			}
		})
	}
}

// A cost above every store's reach (2^40+1, 2^63-1, or above a rule's capacity) is the
// request's fault: 413 under every policy, decided without asking the limiter, so it
// neither opens the breaker nor takes the failure policy, and another client's next
// request is admitted.
func TestHugeCostIsNeverAStoreFailure(t *testing.T) {
	t.Parallel()
	costs := []string{"1099511627777", "9223372036854775807", "11"}
	for _, pc := range []struct {
		name string
		opt  middleware.Option
	}{
		{"closed", failClosed},
		{"open", middleware.WithFailOpen()},
		{"local", middleware.WithLocalFallback(2)},
	} {
		for _, store := range []string{"memory", "io"} {
			t.Run(pc.name+"/"+store, func(t *testing.T) {
				t.Parallel()
				mem := newMemory(t, newClock())
				var lim ratebudget.Limiter = mem
				f := &flaky{next: mem}
				if store == "io" {
					lim = f
				}
				var mu sync.Mutex
				var events []middleware.Event
				var opened atomic.Int64
				h := mustNew(t, lim, []middleware.Rule{{Rule: rule("jobs", 10, time.Minute), Identity: byHeader("X-Client")}}, pc.opt,
					middleware.WithCost(func(r *http.Request) (int64, error) {
						return strconv.ParseInt(r.URL.Query().Get("cost"), 10, 64)
					}),
					middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
						if open {
							opened.Add(1)
						}
					}}), middleware.WithBreakerTuning(0, 1, 0, time.Hour),
					middleware.WithObserver(func(e middleware.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))(ok)
				for i := range 60 {
					cost := costs[i%len(costs)]
					rec := do(h, "POST", "/?cost="+cost, map[string]string{"X-Client": "hostile"})
					if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get("Retry-After") != "" {
						t.Fatalf("cost %s: %d (Retry-After %q), want 413 without Retry-After", cost, rec.Code, rec.Header().Get("Retry-After"))
					}
					if !strings.Contains(rec.Body.String(), "capacity 10") {
						t.Fatalf("cost %s: body %q does not name the capacity", cost, rec.Body.String())
					}
				}
				if n := f.calls.Load(); n != 0 {
					t.Fatalf("limiter asked %d times for costs that can never fit", n)
				}
				if rec := do(h, "POST", "/?cost=1", map[string]string{"X-Client": "other"}); rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "9" {
					t.Fatalf("another client after the hostile one: %d remaining %q, want 200 and 9", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
				}
				if opened.Load() != 0 {
					t.Fatal("the breaker opened")
				}
				mu.Lock()
				defer mu.Unlock()
				for i, e := range events[:60] {
					if e.Result != middleware.Exceeded || !e.Decision.Exceeded || e.Decision.Limit != 10 || e.Err != nil {
						t.Fatalf("event %d: %+v, want Exceeded with the rule's capacity and no error", i, e)
					}
				}
			})
		}
	}
}

// A limiter that rejects the checks as invalid (a configuration error) gets 500 under
// every policy: no policy can make a configuration mistake right, and it is not the
// client's fault.
func TestLimiterConfigErrorIs500(t *testing.T) {
	t.Parallel()
	lim := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}}, &ratebudget.ConfigError{Field: "checks", Problem: "rejected"}
	})
	for _, opt := range []middleware.Option{
		middleware.WithFailOpen(),
		failClosed,
		middleware.WithLocalFallback(1),
	} {
		var got middleware.Event
		h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}}, opt,
			middleware.WithObserver(func(e middleware.Event) { got = e }))(ok)
		rec := do(h, "GET", "/", nil)
		if rec.Code != 500 || strings.Contains(rec.Body.String(), "rejected") {
			t.Fatalf("%d %q, want 500 without the error's text", rec.Code, rec.Body.String())
		}
		if got.Result != middleware.Invalid || !isConfigError(got.Err) || got.Fallback {
			t.Fatalf("event %+v, want Invalid with the configuration error", got)
		}
	}
}

// A cost that fits the rule but not the per-replica budget of the local fallback is
// refused with 429 (the store may answer again), never with 413 (never admissible).
func TestLocalFallbackRefusesACostAboveItsBudgetWith429(t *testing.T) {
	t.Parallel()
	lim := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("down")}
	})
	var evs events
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}}, middleware.WithLocalFallback(4),
		middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe),
		middleware.WithCost(func(*http.Request) (int64, error) { return 5, nil }))(ok)
	rec := do(h, "GET", "/", nil)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("%d %v, want 429 with Retry-After: the local budget is 10/4 = 2", rec.Code, rec.Header())
	}
	if outcomes, all := evs.take(); len(outcomes) != 1 || outcomes[0] != middleware.Denied || !all[0].Fallback || all[0].Decision.Exceeded {
		t.Errorf("events %+v, want one fallback denial", all)
	}
}

// The 500s for a server-side mistake carry no problem type of their own (about:blank,
// RFC 9457 §4.2.1), never the type of the 400 that blames the request: a client that
// acts on the type must not look for a fault in what it sent.
func TestServerMistakeProblemType(t *testing.T) {
	t.Parallel()
	lim := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{}, &ratebudget.ConfigError{Field: "checks", Problem: "rejected"}
	})
	config := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global}})(ok)
	noRoute := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global, Scope: keyfuncs.RoutePattern()}})(ok)
	invalid := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: keyfuncs.Header("X-Account")}})(ok)
	json := map[string]string{"Accept": "application/json"}
	decode := func(name string, rec *httptest.ResponseRecorder, status int) problem.Problem {
		t.Helper()
		var p problem.Problem
		if rec.Code != status {
			t.Fatalf("%s: %d, want %d", name, rec.Code, status)
		}
		if err := stdjson.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v in %q", name, err, rec.Body)
		}
		return p
	}
	blamed := decode("400", do(invalid, "GET", "/", json), 400).Type
	for name, h := range map[string]http.Handler{"limiter configuration": config, "no route pattern": noRoute} {
		p := decode(name, do(h, "GET", "/", json), 500)
		if p.Type != "about:blank" || p.Type == blamed || p.Title != "Internal Server Error" || p.Status != 500 {
			t.Errorf("%s: %+v, want type about:blank (the 400's is %s)", name, p, blamed)
		}
	}
}

// isConfigError reports whether err is, or wraps, a *ratebudget.ConfigError.
func isConfigError(err error) bool {
	var ce *ratebudget.ConfigError
	return errors.As(err, &ce)
}
