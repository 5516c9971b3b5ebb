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
	"github.com/ratebudget/ratebudget/middleware"
)

// flakySettler is flaky for a limiter that settles: Allow and Reserve fail with a store
// error while down is set; otherwise, and for Settle and Renew, it delegates to Memory.
type flakySettler struct {
	*ratebudget.Memory
	down  atomic.Bool
	calls atomic.Int64
}

var errStoreDown = &ratebudget.StoreError{Class: "connection", Err: errors.New("dial tcp 10.1.2.3:6379: connect: connection refused")}

func (f *flakySettler) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return ratebudget.Decision{}, errStoreDown
	}
	return f.Memory.Allow(ctx, checks)
}

func (f *flakySettler) Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return ratebudget.Decision{}, errStoreDown
	}
	return f.Memory.Reserve(ctx, checks, tickets, outcomes)
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
		return middleware.WithStoreErrorPolicy(middleware.FailOpen)
	case "local":
		return middleware.WithLocalFallback(1)
	}
	return middleware.WithStoreErrorPolicy(middleware.FailClosed)
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
		outcome middleware.Outcome
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
			// limiters after the refusing one are not reported. An earlier one reports
			// what its outcome was, as a single limiter's refusal does (r=4 of 5).
			var rl []string
			for i := 0; i <= c.refuser; i++ {
				left := map[int]string{0: `"a";r=4;t=60`, 1: `"b";r=2;t=60`}[i]
				if i == c.refuser {
					left = `"` + rules[i].Name + `";r=0;t=60`
				}
				rl = append(rl, left)
			}
			return want{code: 429, outcome: middleware.OutcomeDenied, rule: rules[c.refuser].Name, rl: strings.Join(rl, ", ")}
		case c.policy == "closed":
			return want{code: 503, outcome: middleware.OutcomeUnavailable, err: true, asked: true}
		case c.refuser >= 0:
			// Only the refusing rule's state is known for certain.
			return want{code: 429, outcome: middleware.OutcomeDenied, rule: rules[c.refuser].Name, err: true, fb: c.policy == "local",
				rl: `"` + rules[c.refuser].Name + `";r=0;t=60`, asked: true}
		case c.policy == "open":
			return want{code: 200, outcome: middleware.OutcomeDegraded, err: true, asked: true}
		}
		// LocalFallback admits with replicas 1: b is the most restrictive (2 of 3 left).
		return want{code: 200, outcome: middleware.OutcomeAllowed, rule: "b", err: true, fb: true, rl: `"b";r=2;t=60`, asked: true}
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
			lims := make([]*ratebudget.Memory, 3)
			evs := make([]events, 3)
			var mws []func(http.Handler) http.Handler
			f := &flaky{}
			for i, r := range rules {
				lims[i] = memory(t, newClock())
				opts := []middleware.Option{middleware.WithHeaders(headers.IETF), middleware.WithObserver(evs[i].observe),
					middleware.WithUnavailableRetryAfter(2 * time.Second)}
				var lim ratebudget.Limiter = lims[i]
				if i == c.failed {
					f.next = lims[i]
					f.down.Store(true)
					lim = f
					opts = append(opts, policyOpt(c.policy), middleware.WithUnavailableRetryAfter(7*time.Second),
						middleware.WithBreaker(middleware.Breaker{Disabled: true}))
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
			if w.code == 503 && rec.Header().Get("Retry-After") != "7" {
				t.Errorf("503 Retry-After %q, want the failed layer's 7", rec.Header().Get("Retry-After"))
			}
			if got := rec.Header().Get("RateLimit"); got != w.rl {
				t.Errorf("RateLimit %q, want %q", got, w.rl)
			}
			policyHeader := `"a";q=5;w=60, "b";q=3;w=60, "c";q=4;w=60`
			if w.code == 503 || w.outcome == middleware.OutcomeDegraded {
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
				} else if ev.Outcome != first.Outcome || ev.Decision != first.Decision || ev.Fallback != first.Fallback || ev.Err != first.Err {
					t.Errorf("layer %s saw %+v, layer a %+v: every layer sees the same event", rules[i].Name, ev, first)
				}
			}
			if first.Outcome != w.outcome || first.Decision.Rule != w.rule || (first.Err != nil) != w.err || first.Fallback != w.fb {
				t.Errorf("event %v rule %q err %v fallback %v; want %v %q err=%v fallback=%v",
					first.Outcome, first.Decision.Rule, first.Err, first.Fallback, w.outcome, w.rule, w.err, w.fb)
			}
			if w.err && !errors.Is(first.Err, ratebudget.ErrStoreUnavailable) {
				t.Errorf("event error %v, want the failed store's", first.Err)
			}
			if first.Outcome == middleware.OutcomeDegraded && first.Decision != (ratebudget.Decision{}) {
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
	f := &flaky{next: memory(t, newClock())}
	f.down.Store(true)
	var evs events
	outer := mustNew(t, f, []middleware.Rule{{Rule: ruleB, Identity: keyfuncs.Header("X-Client")}}, middleware.WithLocalFallback(1),
		middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe))
	b := memory(t, newClock())
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
		outcome      middleware.Outcome
	}{
		{"closed shadow, open enforced", policyOpt("closed"), policyOpt("open"), middleware.OutcomeDegraded},
		{"local shadow, open enforced", policyOpt("local"), policyOpt("open"), middleware.OutcomeDegraded},
		{"local shadow, local enforced", policyOpt("local"), policyOpt("local"), middleware.OutcomeAllowed},
		{"open shadow, local enforced", policyOpt("open"), policyOpt("local"), middleware.OutcomeAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{next: memory(t, newClock())}
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
				if _, all := evs.take(); len(all) != 2 || all[0].Outcome != tc.outcome {
					t.Errorf("%s: events %+v, want %v", order, all, tc.outcome)
				}
			}
		})
	}
}

// Layers on one limiter under different policies: a 503 (the strictest, FailClosed, of
// one layer) carries the Retry-After of that FailClosed layer, not the innermost layer's.
func TestUnavailableRetryAfterOfTheFailClosedLayer(t *testing.T) {
	t.Parallel()
	f := &flaky{next: memory(t, newClock())}
	f.down.Store(true)
	noBreaker := middleware.WithBreaker(middleware.Breaker{Disabled: true})
	closed := mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: global}}, middleware.WithUnavailableRetryAfter(7*time.Second), noBreaker)
	open := mustNew(t, f, []middleware.Rule{{Rule: innerRule, Identity: global}}, policyOpt("open"), noBreaker)
	local := mustNew(t, f, []middleware.Rule{{Rule: thirdRule, Identity: global}}, policyOpt("local"), middleware.WithUnavailableRetryAfter(3*time.Second), noBreaker)
	for name, h := range map[string]http.Handler{
		"closed, open":        closed(open(ok)),
		"open, closed":        open(closed(ok)),
		"closed, local":       closed(local(ok)),
		"local, closed, open": local(closed(open(ok))),
	} {
		rec := do(h, "GET", "/", nil)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "7" {
			t.Errorf("%s: %d, Retry-After %q; want 503 with the FailClosed layer's 7", name, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
}
