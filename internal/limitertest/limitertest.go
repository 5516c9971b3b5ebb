// Package limitertest is the conformance suite every [ratebudget.Limiter] of the project
// passes: the same checks, in the same order, against the in-process limiter with a fake
// clock (exact durations) and against Redis on real time (bounds that allow for the time
// the test itself takes).
//
// On real time no expectation assumes how fast the machine is. Tests that must not see a
// window move use windows of an hour, far beyond any run of a few calls. Tests that wait
// for a short window to pass measure the time around their calls and assert an outcome
// only when those bounds decide it; when the machine was too slow for that (the calls
// took longer than a token's refill, say), the run is repeated on a fresh budget with a
// window twice as long.
package limitertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
)

// Harness is one fresh limiter under test, with empty budgets.
type Harness struct {
	// Limiter is the limiter under test.
	Limiter ratebudget.Limiter
	// Advance moves the limiter's clock forward by d. Nil means the limiter runs on real
	// time: the suite then waits for time to pass and asserts bounds instead of exact
	// durations.
	Advance func(d time.Duration)
	// Now reads the limiter's clock, when it is not the wall clock (with Advance); nil
	// means time.Now. The cases of Calendar rules choose their zone from it.
	Now func() time.Time
	// Short is the first window of the tests that wait for a window to pass on real
	// time (default 150ms); a run too slow to decide its outcome is repeated with the
	// window doubled, up to [maxAttempts] runs. Ignored when Advance is set.
	Short time.Duration
}

// FakeClock is a manually advanced clock for limiters that accept one (see
// [github.com/ratebudget/ratebudget/memory.WithClock]). It is safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a clock that reads t until advanced.
func NewFakeClock(t time.Time) *FakeClock { return &FakeClock{now: t} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// long is the window of tests that must not see a window pass: the fastest refill of
// those tests is a token every long/10 (6 minutes), and [env.allow] fails a test that
// has run for half of that, naming the cause, rather than let an expectation go wrong.
const long = time.Hour

// maxAttempts bounds the runs of a short-window test on a machine too slow for it: the
// window doubles on each, so the last is 32 times the first (4.8s by default).
const maxAttempts = 6

// algorithms are the time rules of the cases that run for each. A Calendar rule there is
// a Day in a fixed zone where the test starts at noon (see env.rule): its period ends
// half a day after the start, further than [long] (a test on real time that ran for
// long/20 fails anyway), and its resets are the time to that midnight (env.full).
var algorithms = []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow, ratebudget.Calendar}

// Run runs the conformance suite. newHarness is called once per subtest and must return
// a limiter whose budgets are all empty (for a shared store: a fresh key prefix). The
// cases of settling and of in-flight limits skip for a limiter that does not implement
// [Settler], those of resets for one that does not implement [Resetter], those of every
// check's outcome for one that does not implement [Reporter].
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, alg := range algorithms {
		t.Run(algname.Of(alg), func(t *testing.T) {
			tests := []struct {
				name string
				fn   func(e *env, alg ratebudget.Algorithm)
			}{
				{"AdmitUpToLimitThenRefuse", testAdmitUpToLimit},
				{"RefusalSpendsNothing", testRefusalSpendsNothing},
				{"ExpiryRestarts", testExpiryRestarts},
				{"WeightedCost", testWeightedCost},
				{"CostAboveCapacity", testCostAboveCapacity},
				{"MultiRuleAllOrNothing", testMultiRule},
				{"Concurrency", testConcurrency},
				{"SeparateBudgets", testSeparateBudgets},
				{"InvalidChecks", testInvalidChecks},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					tt.fn(newEnv(t, newHarness(t)), alg)
				})
			}
		})
	}
	t.Run("token/Refill", func(t *testing.T) { t.Parallel(); testTokenRefill(newEnv(t, newHarness(t))) })
	t.Run("token/Burst", func(t *testing.T) { t.Parallel(); testTokenBurst(newEnv(t, newHarness(t))) })
	t.Run("rolling/RetryAfterOldest", func(t *testing.T) { t.Parallel(); testRollingRetry(newEnv(t, newHarness(t))) })
	t.Run("MixedRulesOneIdentity", func(t *testing.T) { t.Parallel(); testMixed(newEnv(t, newHarness(t)), false) })
	t.Run("MixedRulesSeveralIdentities", func(t *testing.T) { t.Parallel(); testMixed(newEnv(t, newHarness(t)), true) })
	runSettle(t, newHarness)
	runUnspent(t, newHarness)
	runReset(t, newHarness)
}

type env struct {
	t       *testing.T
	h       Harness
	fake    bool
	created time.Time // real time: when the test began
	since   time.Time // real time: start of the step whose durations are asserted
	// sinceAt is the limiter's clock at since; noon the zone of Calendar rules, in
	// which the test began at 12:00.
	sinceAt time.Time
	noon    *time.Location
}

func newEnv(t *testing.T, h Harness) *env {
	if h.Short <= 0 {
		h.Short = 150 * time.Millisecond
	}
	if h.Now == nil {
		h.Now = time.Now
	}
	start := h.Now()
	into := start.Sub(start.Truncate(24 * time.Hour)) // since UTC's midnight
	noon := time.FixedZone("noon", int((12*time.Hour-into)/time.Second))
	return &env{t: t, h: h, fake: h.Advance != nil, created: time.Now(), sinceAt: start, noon: noon}
}

// rule is the rule name of time rule alg with limit and window, or for a Calendar rule
// of limit per day in the env's zone, where the test began at noon.
func (e *env) rule(name string, alg ratebudget.Algorithm, limit int64, window time.Duration) ratebudget.Rule {
	if alg == ratebudget.Calendar {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: limit, Period: ratebudget.Day, Location: e.noon}
	}
	return rule(name, alg, limit, window)
}

// full is the wait, from the mark, until a budget of alg spent at the mark is whole
// again: w, or for a Calendar rule the time to its period's end (the next midnight of
// the env's zone), in whole ms as a limiter counts it (on real time, an upper bound).
func (e *env) full(alg ratebudget.Algorithm, w time.Duration) time.Duration {
	if alg != ratebudget.Calendar {
		return w
	}
	at := e.sinceAt.In(e.noon)
	y, m, d := at.Date()
	left := time.Date(y, m, d+1, 0, 0, 0, 0, e.noon).Sub(e.sinceAt.Truncate(time.Millisecond))
	if !e.fake {
		// The limiter's clock (the server's, or a monotonic one set from the wall clock
		// once) may read up to a millisecond behind this process's at the mark.
		left += time.Millisecond
	}
	return left
}

// timed runs body, a test that waits for a short window w to pass, with a fresh identity
// id on every run. On a fake clock it runs once with w = long. On real time body returns
// false when the bounds it measured around its calls do not decide the outcome it is
// about to assert (the machine was too slow); it is then run again with w doubled. body
// must decide this from elapsed time alone, never from a decision it received, so that a
// wrong limiter fails rather than retries.
func (e *env) timed(name string, body func(w time.Duration, id string) bool) {
	e.t.Helper()
	if e.fake {
		if !body(long, name) {
			e.t.Fatal("a fake clock cannot be too slow")
		}
		return
	}
	w := e.h.Short
	for attempt := 1; ; attempt++ {
		if body(w, fmt.Sprintf("%s-%d", name, attempt)) {
			return
		}
		if attempt == maxAttempts {
			e.t.Fatalf("%d runs, the last with a %v window: each was too slow to decide its outcome", attempt, w)
		}
		e.t.Logf("run %d with a %v window was too slow to decide its outcome; again with %v", attempt, w, 2*w)
		w *= 2
	}
}

// decides reports whether an interval that began at start and had to stay shorter than
// limit did so, allowing for the server counting whole milliseconds on each side.
func decides(start time.Time, limit time.Duration) bool {
	return time.Since(start)+2*time.Millisecond < limit
}

// mark starts the interval that bounds real-time durations.
func (e *env) mark() { e.since, e.sinceAt = time.Now(), e.h.Now() }

// slack is how much a duration reported now may be below the one expected at mark.
func (e *env) slack() time.Duration {
	if e.fake {
		return 0
	}
	return time.Since(e.since) + 2*time.Millisecond
}

// wait lets d pass: a fake clock is advanced; on real time the suite waits for the
// deadline with a polling loop.
func (e *env) wait(d time.Duration) {
	if e.fake {
		e.h.Advance(d)
		return
	}
	deadline := time.Now().Add(d + 2*time.Millisecond) // the server counts whole ms
	for time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

func (e *env) allow(checks ...ratebudget.Check) ratebudget.Decision {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := e.h.Limiter.Allow(ctx, checks)
	if err != nil {
		e.t.Fatalf("Allow(%v): %v", checks, err)
	}
	if ran := time.Since(e.created); !e.fake && ran > long/20 {
		e.t.Fatalf("the test has run for %v: too close to a refill of its %v windows for its expectations to hold", ran, long)
	}
	return d
}

// approx asserts got == want with a fake clock, want-slack <= got <= want on real time.
func (e *env) approx(what string, got, want time.Duration) {
	e.t.Helper()
	if got > want || got < want-e.slack() {
		if e.fake {
			e.t.Errorf("%s = %v, want %v", what, got, want)
		} else {
			e.t.Errorf("%s = %v, want %v minus at most %v", what, got, want, e.slack())
		}
	}
}

func (e *env) expect(d ratebudget.Decision, allowed bool, remaining int64) {
	e.t.Helper()
	if d.Allowed != allowed || d.Remaining != remaining || d.Exceeded {
		e.t.Fatalf("decision %+v: want Allowed=%v Remaining=%d Exceeded=false", d, allowed, remaining)
	}
}

func rule(name string, alg ratebudget.Algorithm, limit int64, window time.Duration) ratebudget.Rule {
	return ratebudget.Rule{Name: name, Algorithm: alg, Limit: limit, Window: window}
}

func check(r ratebudget.Rule, identity string, cost int64) ratebudget.Check {
	return ratebudget.Check{Rule: r, Identity: identity, Cost: cost}
}

func testAdmitUpToLimit(e *env, alg ratebudget.Algorithm) {
	r := e.rule("api", alg, 5, long)
	c := check(r, "alice", 1)
	e.mark()
	for i := int64(1); i <= 5; i++ {
		d := e.allow(c)
		e.expect(d, true, 5-i)
		if d.Rule != "api" || d.Index != 0 || d.Limit != 5 || d.RetryAfter != 0 {
			e.t.Fatalf("admission %d: %+v", i, d)
		}
		if alg == ratebudget.TokenBucket {
			e.approx("ResetAfter", d.ResetAfter, time.Duration(i)*long/5) // time to refill i tokens
		} else {
			e.approx("ResetAfter", d.ResetAfter, e.full(alg, long))
		}
	}
	d := e.allow(c)
	e.expect(d, false, 0)
	e.approx("ResetAfter", d.ResetAfter, e.full(alg, long))
	if alg == ratebudget.TokenBucket {
		e.approx("RetryAfter", d.RetryAfter, long/5) // one token refills in window/limit
	} else {
		e.approx("RetryAfter", d.RetryAfter, e.full(alg, long))
	}
}

func testRefusalSpendsNothing(e *env, alg ratebudget.Algorithm) {
	r := e.rule("api", alg, 3, long)
	c := check(r, "bob", 1)
	for range 3 {
		e.allow(c)
	}
	e.mark()
	d1 := e.allow(c)
	e.expect(d1, false, 0)
	step := time.Duration(0)
	if e.fake {
		step = time.Second
		e.wait(step)
	}
	for range 5 {
		e.allow(c)
	}
	d2 := e.allow(c)
	e.expect(d2, false, 0)
	e.approx("ResetAfter after refusals", d2.ResetAfter, d1.ResetAfter-step)
	e.approx("RetryAfter after refusals", d2.RetryAfter, d1.RetryAfter-step)
}

func testExpiryRestarts(e *env, alg ratebudget.Algorithm) {
	if alg == ratebudget.Calendar {
		testCalendarRestarts(e)
		return
	}
	e.timed("carol", func(w time.Duration, id string) bool {
		r := e.rule("api", alg, 5, w)
		c := check(r, id, 1)
		// The sixth call is refused only if no budget came back since the first: the
		// window has not ended, or (token bucket) no token has refilled.
		back := w
		if alg == ratebudget.TokenBucket {
			back = w / 5
		}
		start := time.Now()
		for i := range 5 {
			if d := e.allow(c); !d.Allowed {
				e.t.Fatalf("admission %d of 5: %+v", i+1, d)
			}
		}
		d := e.allow(c)
		if !e.fake && !decides(start, back) {
			return false
		}
		e.expect(d, false, 0)
		if d.ResetAfter <= 0 || d.ResetAfter > w {
			e.t.Fatalf("ResetAfter = %v, want in (0, %v]", d.ResetAfter, w)
		}
		if e.fake && alg != ratebudget.TokenBucket {
			e.wait(d.ResetAfter - time.Millisecond)
			e.expect(e.allow(c), false, 0)
			e.wait(time.Millisecond)
		} else {
			e.wait(d.ResetAfter) // waiting longer changes nothing: the budget is whole
		}
		// The budget is whole again: the next admission is the first of a new window.
		e.expect(e.allow(c), true, 4)
		return true
	})
}

// testCalendarRestarts: a Calendar budget refuses until the last millisecond of its
// period and starts the next at 0, with the next period's length to its reset. Only on a
// driven clock: on real time a period lasts an hour at least (package lua's own tests
// cross one with the server's clock).
func testCalendarRestarts(e *env) {
	if !e.fake {
		e.t.Skip("a calendar period lasts an hour at least; crossed on a driven clock only")
	}
	r := e.rule("api", ratebudget.Calendar, 5, 0)
	c := check(r, "carol", 1)
	e.mark()
	for range 5 {
		e.allow(c)
	}
	d := e.allow(c)
	e.expect(d, false, 0)
	e.approx("RetryAfter", d.RetryAfter, e.full(ratebudget.Calendar, 0))
	e.wait(d.RetryAfter - time.Millisecond)
	e.expect(e.allow(c), false, 0)
	e.wait(time.Millisecond)
	d = e.allow(c)
	e.expect(d, true, 4)
	if d.ResetAfter != 24*time.Hour {
		e.t.Fatalf("the next day's first admission: ResetAfter %v, want 24h", d.ResetAfter)
	}
}

func testWeightedCost(e *env, alg ratebudget.Algorithm) {
	r := e.rule("work", alg, 10, long)
	steps := []struct {
		cost      int64
		allowed   bool
		remaining int64
	}{{4, true, 6}, {4, true, 2}, {3, false, 2}, {2, true, 0}, {1, false, 0}}
	for i, s := range steps {
		d := e.allow(check(r, "dave", s.cost))
		if d.Allowed != s.allowed || d.Remaining != s.remaining || d.Exceeded {
			e.t.Fatalf("step %d (cost %d): %+v, want Allowed=%v Remaining=%d", i, s.cost, d, s.allowed, s.remaining)
		}
	}
}

func testCostAboveCapacity(e *env, alg ratebudget.Algorithm) {
	r := e.rule("work", alg, 5, long)
	d := e.allow(check(r, "erin", 6))
	if d.Allowed || !d.Exceeded || d.RetryAfter != 0 || d.Remaining != 5 || d.ResetAfter != 0 {
		e.t.Fatalf("cost 6 of 5 on a fresh budget: %+v, want Exceeded, Remaining 5, no reset or retry", d)
	}
	e.mark()
	e.expect(e.allow(check(r, "erin", 1)), true, 4)
	d = e.allow(check(r, "erin", 100))
	if d.Allowed || !d.Exceeded || d.RetryAfter != 0 || d.Remaining != 4 {
		e.t.Fatalf("cost 100 of 5: %+v, want Exceeded and Remaining 4", d)
	}
	if alg == ratebudget.TokenBucket {
		e.approx("ResetAfter", d.ResetAfter, long/5)
	} else {
		e.approx("ResetAfter", d.ResetAfter, e.full(alg, long))
	}
	e.expect(e.allow(check(r, "erin", 4)), true, 0)
}

// testMultiRule: a refusal by any rule leaves every other rule's budget untouched, for
// checks of one identity (one step in Redis) and of several identities (refunds).
func testMultiRule(e *env, alg ratebudget.Algorithm) {
	for _, several := range []bool{false, true} {
		idB := "frank"
		if several {
			idB = "" // a service-wide rule next to per-identity ones
		}
		wide := e.rule(fmt.Sprintf("wide-%v", several), alg, 10, long)
		narrow := e.rule(fmt.Sprintf("narrow-%v", several), alg, 2, long)
		other := e.rule(fmt.Sprintf("other-%v", several), ratebudget.FixedWindow, 10, long)
		checks := []ratebudget.Check{check(wide, "frank", 1), check(narrow, idB, 1), check(other, "frank", 1)}
		for i := int64(1); i <= 2; i++ {
			d := e.allow(checks...)
			if !d.Allowed || d.Rule != narrow.Name || d.Index != 1 || d.Remaining != 2-i {
				e.t.Fatalf("admission %d: %+v, want the narrow rule reported with %d left", i, d, 2-i)
			}
		}
		for range 3 {
			d := e.allow(checks...)
			if d.Allowed || d.Rule != narrow.Name || d.Index != 1 || d.Remaining != 0 {
				e.t.Fatalf("refusal: %+v, want refused by the narrow rule", d)
			}
		}
		// The other rules spent exactly twice.
		e.expect(e.allow(checks[0]), true, 7)
		e.expect(e.allow(checks[2]), true, 7)
		// A refusal by the first rule leaves the later ones untouched too.
		first := []ratebudget.Check{check(narrow, idB, 1), check(wide, "frank", 1)}
		if d := e.allow(first...); d.Allowed || d.Index != 0 {
			e.t.Fatalf("refusal by the first check: %+v", d)
		}
		e.expect(e.allow(checks[0]), true, 6)
	}
}

func testConcurrency(e *env, alg ratebudget.Algorithm) {
	const workers, limit = 32, 5
	r := e.rule("api", alg, limit, long)
	start := make(chan struct{})
	results := make(chan ratebudget.Decision, workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := e.h.Limiter.Allow(context.Background(), []ratebudget.Check{check(r, "grace", 1)})
			if err != nil {
				errs <- err
				return
			}
			results <- d
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		e.t.Fatal(err)
	}
	admitted := 0
	seen := make(map[int64]bool)
	for d := range results {
		if d.Allowed {
			admitted++
			if seen[d.Remaining] {
				e.t.Errorf("Remaining %d reported twice", d.Remaining)
			}
			seen[d.Remaining] = true
		} else if d.Remaining != 0 {
			e.t.Errorf("refusal reports Remaining %d, want 0", d.Remaining)
		}
	}
	if admitted != limit {
		e.t.Fatalf("%d goroutines admitted %d, want exactly %d", workers, admitted, limit)
	}
}

func testSeparateBudgets(e *env, alg ratebudget.Algorithm) {
	r := e.rule("api", alg, 1, long)
	a := ratebudget.Check{Rule: r, Identity: "a:b", Scope: "c", Cost: 1}
	b := ratebudget.Check{Rule: r, Identity: "a", Scope: "b:c", Cost: 1}
	c := ratebudget.Check{Rule: r, Identity: "a:b", Scope: "", Cost: 1}
	d := ratebudget.Check{Rule: r, Identity: "a:b:c", Scope: "", Cost: 1}
	for _, ch := range []ratebudget.Check{a, b, c, d} {
		e.expect(e.allow(ch), true, 0)
	}
	e.expect(e.allow(a), false, 0)
	other := e.rule("api2", alg, 1, long) // another rule name is another budget
	e.expect(e.allow(check(other, "a:b", 1)), true, 0)
}

func testInvalidChecks(e *env, alg ratebudget.Algorithm) {
	r := e.rule("api", alg, 2, long)
	bad := [][]ratebudget.Check{
		nil,
		{check(r, "h", 0)},
		{check(r, "h", 1), check(r, "h", 1)},
		{check(e.rule("bad name", alg, 2, long), "h", 1)},
		{check(r, "h", 1), check(e.rule("x", alg, 0, long), "h", 1)},
	}
	for _, checks := range bad {
		_, err := e.h.Limiter.Allow(context.Background(), checks)
		if !IsConfigError(err) {
			e.t.Fatalf("Allow(%v) = %v, want a configuration error", checks, err)
		}
	}
	// Nothing was spent by the invalid calls.
	e.expect(e.allow(check(r, "h", 1)), true, 1)
}

func testTokenRefill(e *env) {
	e.timed("henry", func(short time.Duration, id string) bool {
		w := 5 * short
		q := w / 5 // one token per q
		r := e.rule("bucket", ratebudget.TokenBucket, 5, w)
		c := check(r, id, 1)
		e.mark()
		for i := range 5 {
			if d := e.allow(c); !d.Allowed {
				e.t.Fatalf("admission %d of 5: %+v", i+1, d)
			}
		}
		before := time.Now()
		d := e.allow(c)
		if !e.fake && !decides(e.since, q) {
			return false // a token may have refilled already
		}
		e.expect(d, false, 0)
		e.approx("RetryAfter", d.RetryAfter, q)
		e.approx("ResetAfter", d.ResetAfter, w)
		if e.fake {
			e.wait(q - time.Millisecond)
			d = e.allow(c)
			e.expect(d, false, 0)
			e.approx("RetryAfter", d.RetryAfter, time.Millisecond)
			e.wait(time.Millisecond)
			e.expect(e.allow(c), true, 0)
			e.wait(2 * q)
			e.expect(e.allow(c), true, 1)
			return true
		}
		// After RetryAfter one token is back, and a second one only q later: the call
		// spends the one token if it reached the server before then.
		e.wait(d.RetryAfter)
		next := e.allow(c)
		if !next.Allowed {
			e.t.Fatalf("after RetryAfter %v: %+v, want admitted", d.RetryAfter, next)
		}
		if !decides(before, d.RetryAfter+q) {
			return false
		}
		e.expect(next, true, 0)
		return true
	})
}

func testTokenBurst(e *env) {
	r := ratebudget.Rule{Name: "burst", Algorithm: ratebudget.TokenBucket, Limit: 2, Burst: 6, Window: long}
	c := check(r, "ivy", 6)
	d := e.allow(c)
	if !d.Allowed || d.Remaining != 0 || d.Limit != 6 {
		e.t.Fatalf("burst of 6: %+v", d)
	}
	d = e.allow(check(r, "ivy", 7))
	if !d.Exceeded || d.Allowed {
		e.t.Fatalf("cost 7 over burst 6: %+v, want Exceeded", d)
	}
}

func testRollingRetry(e *env) {
	if !e.fake {
		// Real time: one event, a refusal waits for it to leave.
		e.timed("jack", func(w time.Duration, id string) bool {
			c := func(cost int64) ratebudget.Check {
				return check(e.rule("log", ratebudget.RollingWindow, 3, w), id, cost)
			}
			e.mark()
			e.expect(e.allow(c(3)), true, 0)
			d := e.allow(c(1))
			if !decides(e.since, w) {
				return false // the event may have left already
			}
			e.expect(d, false, 0)
			e.approx("RetryAfter", d.RetryAfter, w)
			e.wait(d.RetryAfter) // waiting longer changes nothing: the log is empty
			e.expect(e.allow(c(1)), true, 2)
			return true
		})
		return
	}
	step := long / 5
	r := e.rule("log", ratebudget.RollingWindow, 3, 5*step)
	c := func(cost int64) ratebudget.Check { return check(r, "jack", cost) }
	e.expect(e.allow(c(1)), true, 2) // t=0
	e.wait(step)
	e.expect(e.allow(c(1)), true, 1) // t=1
	e.wait(step)
	e.expect(e.allow(c(1)), true, 0) // t=2
	e.wait(step)
	d := e.allow(c(2)) // t=3: needs the events of t=0 and t=1 to leave
	e.expect(d, false, 0)
	e.approx("RetryAfter", d.RetryAfter, 3*step)
	e.approx("ResetAfter", d.ResetAfter, 4*step)
	e.wait(2 * step) // t=5: the event of t=0 left
	d = e.allow(c(2))
	e.expect(d, false, 1)
	e.approx("RetryAfter", d.RetryAfter, step)
	e.wait(step) // t=6
	e.expect(e.allow(c(2)), true, 0)
}

// testMixed: three time rules in one decision, all-or-nothing.
func testMixed(e *env, several bool) {
	ids := [3]string{"kate", "kate", "kate"}
	if several {
		ids = [3]string{"kate", "", "leo"}
	}
	checks := []ratebudget.Check{
		check(e.rule("f", ratebudget.FixedWindow, 4, long), ids[0], 1),
		check(e.rule("t", ratebudget.TokenBucket, 3, long), ids[1], 1),
		check(e.rule("r", ratebudget.RollingWindow, 5, long), ids[2], 1),
	}
	for i := int64(1); i <= 3; i++ {
		d := e.allow(checks...)
		if !d.Allowed || d.Rule != "t" || d.Remaining != 3-i {
			e.t.Fatalf("admission %d: %+v, want the token rule reported with %d left", i, d, 3-i)
		}
	}
	d := e.allow(checks...)
	if d.Allowed || d.Rule != "t" {
		e.t.Fatalf("refusal: %+v, want refused by the token rule", d)
	}
	e.expect(e.allow(checks[0]), true, 0)
	e.expect(e.allow(checks[2]), true, 1)
	// Now the fixed window refuses first; the others stay as they were.
	d = e.allow(checks[0], checks[2])
	if d.Allowed || d.Rule != "f" {
		e.t.Fatalf("refusal: %+v, want refused by the fixed rule", d)
	}
	e.expect(e.allow(checks[2]), true, 0)
}
