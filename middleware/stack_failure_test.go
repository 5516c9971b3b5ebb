package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// flakySettler is flaky for a limiter that settles: Allow and Reserve fail with a store
// error while down is set; otherwise, and for Settle and Renew, it delegates to Memory.
type flakySettler struct {
	*memory.Limiter
	down  atomic.Bool
	calls atomic.Int64
}

var errStoreDown = &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("dial tcp 10.1.2.3:6379: connect: connection refused")}

func (f *flakySettler) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return ratebudget.Decision{}, errStoreDown
	}
	return f.Limiter.Allow(ctx, checks)
}

func (f *flakySettler) Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return ratebudget.Decision{}, errStoreDown
	}
	return f.Limiter.Reserve(ctx, checks, tickets, outcomes)
}

var (
	ruleA = ratebudget.Rule{Name: "a", Limit: 5, Window: time.Minute}
	ruleB = ratebudget.Rule{Name: "b", Limit: 3, Window: time.Minute}
	ruleC = ratebudget.Rule{Name: "c", Limit: 4, Window: time.Minute}
)

// policyOpt returns the option of a policy by its name.
func policyOpt(p string) middleware.Option {
	switch p {
	case "open":
		return middleware.WithFailOpen()
	case "local":
		return middleware.WithLocalFallback(1)
	}
	return failClosed
}

// Three layers on three limiters (a, b, c, outermost first), one of which fails under
// each policy while a healthy one refuses or none does. Every layer sees the same one
// event; healthy limiters keep exactly the spend of an admitted request (a refusal or a
// 503 gives their reservations back); a limiter after a refusal or a FailClosed failure
// is not asked; metadata is sent only for rules whose state is known.
func TestStackedStoreFailureMatrix(t *testing.T) {
	t.Parallel()
	rules := []ratebudget.Rule{ruleA, ruleB, ruleC}
	type want struct {
		code    int
		outcome middleware.Result
		rule    string // Decision.Rule
		err     bool   // Event.Err set
		fb      bool   // Event.Fallback
		rl      string // RateLimit
		asked   bool   // the failed limiter was asked
	}
	type tc struct {
		failed, refuser int // refuser -1: none refuses
		policy          string
	}
	expect := func(c tc) want {
		switch {
		case c.refuser >= 0 && c.refuser < c.failed:
			// The walk stops at the refusal: the failed limiter is never asked, and the
			// limiters after the refusing one are not reported. An earlier one was given
			// its reservation back, and reports its budget as it is: untouched (r=5 of
			// 5, no t), as a single limiter's refusal does.
			var rl []string
			for i := 0; i <= c.refuser; i++ {
				left := map[int]string{0: `"a";r=5`, 1: `"b";r=3`}[i]
				if i == c.refuser {
					left = `"` + rules[i].Name + `";r=0;t=60`
				}
				rl = append(rl, left)
			}
			return want{code: 429, outcome: middleware.Denied, rule: rules[c.refuser].Name, rl: strings.Join(rl, ", ")}
		case c.policy == "closed":
			return want{code: 503, outcome: middleware.Unavailable, err: true, asked: true}
		case c.refuser >= 0:
			// Only the refusing rule's state is known for certain.
			return want{code: 429, outcome: middleware.Denied, rule: rules[c.refuser].Name, err: true, fb: c.policy == "local",
				rl: `"` + rules[c.refuser].Name + `";r=0;t=60`, asked: true}
		case c.policy == "open":
			return want{code: 200, outcome: middleware.Degraded, err: true, asked: true}
		}
		// LocalFallback admits with replicas 1: b is the most restrictive (2 of 3 left).
		return want{code: 200, outcome: middleware.Allowed, rule: "b", err: true, fb: true, rl: `"b";r=2;t=60`, asked: true}
	}
	var cases []tc
	for _, policy := range []string{"closed", "open", "local"} {
		for failed := range 3 {
			for refuser := -1; refuser < 3; refuser++ {
				if refuser != failed {
					cases = append(cases, tc{failed, refuser, policy})
				}
			}
		}
	}
	for _, c := range cases {
		name := c.policy + "/failed=" + rules[c.failed].Name + "/refuser=none"
		if c.refuser >= 0 {
			name = c.policy + "/failed=" + rules[c.failed].Name + "/refuser=" + rules[c.refuser].Name
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := expect(c)
			lims := make([]*memory.Limiter, 3)
			evs := make([]events, 3)
			var mws []func(http.Handler) http.Handler
			f := &flaky{}
			for i, r := range rules {
				lims[i] = newMemory(t, newClock())
				opts := []middleware.Option{middleware.WithHeaders(headers.IETF), middleware.WithObserver(evs[i].observe)}
				var lim ratebudget.Limiter = lims[i]
				if i == c.failed {
					f.next = lims[i]
					f.down.Store(true)
					lim = f
					opts = append(opts, policyOpt(c.policy), middleware.WithBreaker(middleware.Breaker{Disabled: true}))
				}
				mws = append(mws, mustNew(t, lim, []middleware.Rule{{Rule: r, Identity: keyfuncs.Header("X-Client")}}, opts...))
			}
			if c.refuser >= 0 {
				for range rules[c.refuser].Limit {
					_, _ = lims[c.refuser].Allow(context.Background(), []ratebudget.Check{{Rule: rules[c.refuser], Identity: "alice", Cost: 1}})
				}
			}
			served := 0
			h := mws[0](mws[1](mws[2](http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))))
			rec := do(h, "GET", "/", map[string]string{"X-Client": "alice"})
			if rec.Code != w.code {
				t.Fatalf("status %d, want %d (%v)", rec.Code, w.code, rec.Header())
			}
			if (served == 1) != (w.code == 200) {
				t.Errorf("handler ran %d times for a %d", served, rec.Code)
			}
			if w.code == 503 && rec.Header().Get("Retry-After") != "1" {
				t.Errorf("503 Retry-After %q, want 1", rec.Header().Get("Retry-After"))
			}
			if got := rec.Header().Get("RateLimit"); got != w.rl {
				t.Errorf("RateLimit %q, want %q", got, w.rl)
			}
			policyHeader := `"a";q=5;w=60, "b";q=3;w=60, "c";q=4;w=60`
			if w.code == 503 || w.outcome == middleware.Degraded {
				policyHeader = "" // no decision: no metadata at all
			}
			if got := rec.Header().Get("RateLimit-Policy"); got != policyHeader {
				t.Errorf("RateLimit-Policy %q, want %q", got, policyHeader)
			}
			if (f.calls.Load() == 1) != w.asked || f.calls.Load() > 1 {
				t.Errorf("the failed limiter was asked %d times, want asked=%v", f.calls.Load(), w.asked)
			}
			var first middleware.Event
			for i := range evs {
				_, all := evs[i].take()
				if len(all) != 1 {
					t.Fatalf("layer %s saw %d events, want 1", rules[i].Name, len(all))
				}
				ev := all[0]
				if i == 0 {
					first = ev
				} else if ev.Result != first.Result || ev.Decision != first.Decision || ev.Fallback != first.Fallback || ev.Err != first.Err {
					t.Errorf("layer %s saw %+v, layer a %+v: every layer sees the same event", rules[i].Name, ev, first)
				}
			}
			if first.Result != w.outcome || first.Decision.Rule != w.rule || (first.Err != nil) != w.err || first.Fallback != w.fb {
				t.Errorf("event %v rule %q err %v fallback %v; want %v %q err=%v fallback=%v",
					first.Result, first.Decision.Rule, first.Err, first.Fallback, w.outcome, w.rule, w.err, w.fb)
			}
			if w.err && !errors.Is(first.Err, ratebudget.ErrStoreUnavailable) {
				t.Errorf("event error %v, want the failed store's", first.Err)
			}
			if first.Result == middleware.Degraded && first.Decision != (ratebudget.Decision{}) {
				t.Errorf("degraded event with a decision %+v", first.Decision)
			}
			for i, r := range rules {
				if i == c.failed {
					continue
				}
				want := int(r.Limit)
				switch {
				case i == c.refuser:
					want = 0
				case w.code == 200:
					want--
				}
				if n := left(t, lims[i], r, "alice"); n != want {
					t.Errorf("healthy limiter %s has %d left, want %d", r.Name, n, want)
				}
			}
		})
	}
}

// A refusal by a later limiter gives back the local fallback's spend of an earlier
// limiter whose store failed, as it gives back a healthy limiter's reservation: the
// client's local budget is spent only by requests that were admitted.
func TestLaterRefusalGivesTheLocalFallbackSpendBack(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.down.Store(true)
	var evs events
	outer := mustNew(t, f, []middleware.Rule{{Rule: ruleB, Identity: keyfuncs.Header("X-Client")}}, middleware.WithLocalFallback(1),
		middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe))
	b := newMemory(t, newClock())
	inner := mustNew(t, b, []middleware.Rule{{Rule: innerRule, Identity: keyfuncs.Header("X-Inner")}})
	h := outer(inner(ok))
	do(h, "GET", "/", map[string]string{"X-Client": "alice", "X-Inner": "spent"}) // inner's budget for "spent": 0 left
	evs.take()
	for i := range 5 {
		if rec := do(h, "GET", "/", map[string]string{"X-Client": "alice", "X-Inner": "spent"}); rec.Code != 429 {
			t.Fatalf("refused by inner %d: %d", i, rec.Code)
		}
	}
	if _, all := evs.take(); len(all) != 5 || all[0].Decision.Rule != "inner" {
		t.Fatalf("events %+v, want inner's refusals", all)
	}
	// alice's local budget of b (3) had one admitted request: 2 left, whatever inner
	// refused.
	for i, want := range []int{200, 200, 429} {
		rec := do(h, "GET", "/", map[string]string{"X-Client": "alice", "X-Inner": "fresh" + string(rune('0'+i))})
		if rec.Code != want {
			t.Fatalf("request %d with inner's budget whole: %d, want %d (the local budget spent by inner's refusals)", i, rec.Code, want)
		}
	}
}

// A layer whose rules are all in shadow mode never changes a response, also when it
// shares its limiter with an enforced layer and that limiter's store fails: its policy
// does not apply (the enforced layer's FailOpen admits, degraded) and, under
// LocalFallback, it has no local decision to refuse with.
func TestShadowOnlyLayerOnAFailedLimiter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		shadow, main middleware.Option
		outcome      middleware.Result
	}{
		{"closed shadow, open enforced", policyOpt("closed"), policyOpt("open"), middleware.Degraded},
		{"local shadow, open enforced", policyOpt("local"), policyOpt("open"), middleware.Degraded},
		{"local shadow, local enforced", policyOpt("local"), policyOpt("local"), middleware.Allowed},
		{"open shadow, local enforced", policyOpt("open"), policyOpt("local"), middleware.Allowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{next: newMemory(t, newClock())}
			f.down.Store(true)
			var evs events
			noBreaker := middleware.WithBreaker(middleware.Breaker{Disabled: true})
			shadow := mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: global, Shadow: true}}, tc.shadow, noBreaker, middleware.WithObserver(evs.observe))
			enforced := mustNew(t, f, []middleware.Rule{{Rule: ruleB, Identity: global}}, tc.main, noBreaker, middleware.WithObserver(evs.observe))
			for _, order := range []string{"shadow outer", "shadow inner"} {
				h := shadow(enforced(ok))
				if order == "shadow inner" {
					h = enforced(shadow(ok))
				}
				if rec := do(h, "GET", "/", nil); rec.Code != 200 {
					t.Fatalf("%s: %d %s, want 200: a shadow rule never changes a response", order, rec.Code, rec.Body)
				}
				if _, all := evs.take(); len(all) != 2 || all[0].Result != tc.outcome {
					t.Errorf("%s: events %+v, want %v", order, all, tc.outcome)
				}
			}
		})
	}
}

// Layers on one limiter under different policies: the strictest, FailClosed, of one
// layer answers, in any order: a 503 with Retry-After: 1.
func TestUnavailableRetryAfterOfTheFailClosedLayer(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.down.Store(true)
	noBreaker := middleware.WithBreaker(middleware.Breaker{Disabled: true})
	closed := mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: global}}, noBreaker)
	open := mustNew(t, f, []middleware.Rule{{Rule: innerRule, Identity: global}}, policyOpt("open"), noBreaker)
	local := mustNew(t, f, []middleware.Rule{{Rule: thirdRule, Identity: global}}, policyOpt("local"), noBreaker)
	for name, h := range map[string]http.Handler{
		"closed, open":        closed(open(ok)),
		"open, closed":        open(closed(ok)),
		"closed, local":       closed(local(ok)),
		"local, closed, open": local(closed(open(ok))),
	} {
		rec := do(h, "GET", "/", nil)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
			t.Errorf("%s: %d, Retry-After %q; want 503 with Retry-After 1 (the FailClosed layer's answer)", name, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
}

// A healthy limiter's lease and settled reservation, stacked with a limiter whose store
// fails, are settled exactly once whatever the answer: released after the handler of a
// degraded or fallback admission (which ran while the lease was held), given back at
// once by a 503 or a refusal. The healthy limiters come before, after and around the
// failed one.
func TestStoreFailureSettlesHealthyLimitersOnce(t *testing.T) {
	t.Parallel()
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	for _, order := range []string{"LFR", "FLR", "LRF", "RFL", "FRL"} {
		for _, policy := range []string{"closed", "open", "local"} {
			for _, refuses := range []bool{false, true} {
				name := order + "/" + policy
				if refuses {
					name += "/refused"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					leases, counted := newMemory(t, newClock()), newMemory(t, newClock())
					f := &flaky{next: newMemory(t, newClock())}
					f.down.Store(true)
					layer := map[byte]func(http.Handler) http.Handler{
						'L': mustNew(t, leases, []middleware.Rule{{Rule: lease, Identity: global}}),
						'F': mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: global}}, policyOpt(policy),
							middleware.WithBreaker(middleware.Breaker{Disabled: true})),
						// Charged only for responses below 500: the handler answers 500.
						'R': mustNew(t, counted, []middleware.Rule{{Rule: innerRule, Identity: global, Counts: middleware.CountSuccesses(nil)}}),
					}
					if refuses {
						_, _ = counted.Allow(context.Background(), []ratebudget.Check{{Rule: innerRule, Identity: globalID, Cost: 1}})
					}
					heldDuring := false
					var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						d, err := leases.Allow(r.Context(), []ratebudget.Check{{Rule: lease, Identity: globalID, Cost: 1}})
						heldDuring = err == nil && !d.Allowed
						w.WriteHeader(http.StatusInternalServerError)
					})
					for i := len(order) - 1; i >= 0; i-- {
						h = layer[order[i]](h)
					}
					want := 500
					switch {
					case refuses && strings.IndexByte(order, 'R') < strings.IndexByte(order, 'F'):
						want = 429 // refused before the failed limiter is asked
					case policy == "closed":
						want = 503
					case refuses:
						want = 429
					}
					rec := do(h, "GET", "/", nil)
					if rec.Code != want {
						t.Fatalf("%d, want %d", rec.Code, want)
					}
					if want == 500 && !heldDuring {
						t.Error("the lease was not held while the handler ran")
					}
					for i, admitted := range []bool{true, false} {
						d, err := leases.Allow(context.Background(), []ratebudget.Check{{Rule: lease, Identity: globalID, Cost: 1}})
						if err != nil || d.Allowed != admitted {
							t.Fatalf("lease %d afterwards: %+v %v, want admitted=%v: the request's lease released once", i, d, err, admitted)
						}
					}
					wantLeft := 1
					if refuses {
						wantLeft = 0
					}
					if n := left(t, counted, innerRule, globalID); n != wantLeft {
						t.Errorf("the settled rule has %d left, want %d (a 500 is not charged)", n, wantLeft)
					}
				})
			}
		}
	}
}

// A failed limiter whose layer settles (CountSuccesses and a lease) decides on its local
// budget under LocalFallback, and settles there: a 500 gives the local spend back, the
// lease is released when the handler returns, and a later limiter's refusal or
// configuration error gives both back.
func TestLocalFallbackSettlesLocally(t *testing.T) {
	t.Parallel()
	f := &flakySettler{Limiter: newMemory(t, newClock())}
	f.down.Store(true)
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	var evs events
	failed := mustNew(t, f, []middleware.Rule{
		{Rule: innerRule, Identity: global, Counts: middleware.CountSuccesses(nil)}, // locally 1
		{Rule: lease, Identity: global},
	}, middleware.WithLocalFallback(1), middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe))
	status := http.StatusInternalServerError
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) })
	for i := range 3 {
		if rec := do(failed(handler), "GET", "/", nil); rec.Code != 500 {
			t.Fatalf("request %d: %d, want the handler's 500: a 500 is not charged on the local budget either", i, rec.Code)
		}
	}
	exhausted := newMemory(t, newClock())
	_, _ = exhausted.Allow(context.Background(), []ratebudget.Check{{Rule: innerRule, Identity: globalID, Cost: 1}})
	refusing := mustNew(t, exhausted, []middleware.Rule{{Rule: innerRule, Identity: global}})
	bad := mustNew(t, limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{}, &ratebudget.ConfigError{Field: "Identity", Problem: "too long"}
	}), []middleware.Rule{{Rule: thirdRule, Identity: global}})
	for i := range 3 {
		if rec := do(failed(refusing(handler)), "GET", "/", nil); rec.Code != 429 {
			t.Fatalf("refused by the later limiter %d: %d", i, rec.Code)
		}
		if rec := do(failed(bad(handler)), "GET", "/", nil); rec.Code != 500 {
			t.Fatalf("a later limiter's configuration error %d: %d", i, rec.Code)
		}
	}
	evs.take()
	status = http.StatusOK
	for i, want := range []int{200, 429} {
		if rec := do(failed(handler), "GET", "/", nil); rec.Code != want {
			t.Fatalf("charged request %d: %d, want %d: the local budget (1) was whole", i, rec.Code, want)
		}
	}
	if _, all := evs.take(); len(all) != 2 || !all[0].Fallback || !all[1].Fallback || all[1].Decision.Rule != "inner" {
		t.Errorf("events %+v, want two fallback decisions, the second refused by inner", all)
	}
	if f.calls.Load() != 11 {
		t.Errorf("the failed store was asked %d times, want 11 (once per request)", f.calls.Load())
	}
}

// Each limiter of a stack has its own breaker: a failing limiter's opens, a healthy one's
// stays closed and is asked on every request; a limiter that a refusal leaves unasked
// counts nothing.
func TestStackedBreakersPerLimiter(t *testing.T) {
	t.Parallel()
	var opened [2]atomic.Int64
	brk := func(i int) []middleware.Option {
		return []middleware.Option{middleware.WithBreaker(middleware.Breaker{OnChange: func(open bool) {
			if open {
				opened[i].Add(1)
			}
		}}), middleware.WithBreakerTuning(time.Hour, 2, 0, time.Hour)}
	}
	down := &flaky{next: newMemory(t, newClock())}
	down.down.Store(true)
	healthy := &flaky{next: newMemory(t, newClock())}
	var evs events
	outer := mustNew(t, down, []middleware.Rule{{Rule: outerRule, Identity: global}},
		append(brk(0), policyOpt("open"), middleware.WithObserver(evs.observe))...)
	inner := mustNew(t, healthy, []middleware.Rule{{Rule: rule("big", 100, time.Minute), Identity: global}}, brk(1)...)
	h := outer(inner(ok))
	for i := range 6 {
		if rec := do(h, "GET", "/", nil); rec.Code != 200 {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}
	if down.calls.Load() != 2 || opened[0].Load() != 1 {
		t.Errorf("failing limiter asked %d times, its breaker opened %d times; want 2 and 1", down.calls.Load(), opened[0].Load())
	}
	if healthy.calls.Load() != 6 || opened[1].Load() != 0 {
		t.Errorf("healthy limiter asked %d times, its breaker opened %d times; want 6 and 0", healthy.calls.Load(), opened[1].Load())
	}
	_, all := evs.take()
	var se *ratebudget.StoreError
	if len(all) != 6 || all[5].Result != middleware.Degraded || !errors.As(all[5].Err, &se) || se.Class != ratebudget.ClassBreakerOpen {
		t.Errorf("last event %+v, want degraded with the open breaker's error", all[len(all)-1])
	}
	// A refusal by the first limiter leaves the second unasked: its breaker sees nothing.
	first := newMemory(t, newClock())
	_, _ = first.Allow(context.Background(), []ratebudget.Check{{Rule: innerRule, Identity: globalID, Cost: 1}})
	later := &flaky{next: newMemory(t, newClock())}
	later.down.Store(true)
	h = mustNew(t, first, []middleware.Rule{{Rule: innerRule, Identity: global}})(
		mustNew(t, later, []middleware.Rule{{Rule: outerRule, Identity: global}}, brk(1)...)(ok))
	for range 4 {
		if rec := do(h, "GET", "/", nil); rec.Code != 429 {
			t.Fatalf("%d, want 429 by the first limiter", rec.Code)
		}
	}
	if later.calls.Load() != 0 || opened[1].Load() != 0 {
		t.Errorf("the unasked limiter was called %d times, its breaker opened %d times", later.calls.Load(), opened[1].Load())
	}
}

// The event of a stack whose limiter timed out carries the timeout as an uncertain store
// error and the time the failed call took.
func TestStackedTimeoutLatency(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.hang.Store(true)
	var evs events
	const timeout = 20 * time.Millisecond
	outer := mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: global}}, policyOpt("local"), middleware.WithTimeout(timeout),
		middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe))
	inner := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: innerRule, Identity: global}}, middleware.WithObserver(evs.observe))
	if rec := do(outer(inner(ok)), "GET", "/", nil); rec.Code != 200 {
		t.Fatalf("%d", rec.Code)
	}
	_, all := evs.take()
	var se *ratebudget.StoreError
	if len(all) != 2 || !all[0].Fallback || !errors.As(all[0].Err, &se) || se.Class != ratebudget.ClassTimeout || !se.Uncertain || all[0].Latency < timeout {
		t.Fatalf("events %+v, want a fallback admission with an uncertain timeout and a latency of at least %v", all, timeout)
	}
}

// InProcess reports false: the limiter stands in for one with a store, which gets a
// deadline and a circuit breaker.
func (f *flakySettler) InProcess() bool { return false }
