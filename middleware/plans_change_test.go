package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// planSwitch serves one tenant's requests through a rule with plans free (Limit 5) and
// pro (Limit 100), moving the tenant between them: docs/RULE-CHANGES.md, "Plans".
type planSwitch struct {
	t    *testing.T
	h    http.Handler
	plan atomic.Pointer[string]
	clk  *fakeClock // the in-process limiter's clock; nil on Redis (the server's clock)
	step int
}

func newPlanSwitch(t *testing.T, lim ratebudget.Limiter, clk *fakeClock, base ratebudget.Rule, block func()) *planSwitch {
	ps := &planSwitch{t: t, clk: clk}
	ps.on("free")
	mw := mustNew(t, lim, []middleware.Rule{{
		Rule:     base,
		Identity: byHeader("X-Api-Key"),
		Plans:    []middleware.Plan{{Name: "free", Limit: 5}, {Name: "pro", Limit: 100}},
		Plan:     func(*http.Request) (string, error) { return *ps.plan.Load(), nil },
	}}, middleware.WithTimeout(time.Minute))
	ps.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if block != nil {
			block()
		}
		w.WriteHeader(http.StatusOK)
	}))
	return ps
}

func (ps *planSwitch) on(plan string) { ps.plan.Store(&plan) }

// expect serves a request and checks its status and, unless remaining is negative, the
// X-RateLimit-Remaining it reports.
func (ps *planSwitch) expect(code int, remaining int64) *httptest.ResponseRecorder {
	ps.t.Helper()
	ps.step++
	w := httptest.NewRecorder()
	ps.h.ServeHTTP(w, keyed("GET", "/", "tenant"))
	got := w.Header().Get("X-RateLimit-Remaining")
	if w.Code != code || remaining >= 0 && got != strconv.FormatInt(remaining, 10) {
		ps.t.Fatalf("request %d on plan %s: %d remaining %q, want %d remaining %d", ps.step, *ps.plan.Load(), w.Code, got, code, remaining)
	}
	return w
}

// retryAfter checks that w's Retry-After is in 1..most seconds, and returns it.
func (ps *planSwitch) retryAfter(w *httptest.ResponseRecorder, most int64) int64 {
	ps.t.Helper()
	s, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	if err != nil || s < 1 || s > most {
		ps.t.Fatalf("request %d: Retry-After %q, want 1..%d", ps.step, w.Header().Get("Retry-After"), most)
	}
	return s
}

// spendFreeThenPro spends a tenant's free plan (5), is refused, moves to pro (100) and
// spends 3 more there: the 6 refused-or-spent carry over (an attempt refused spends
// nothing), so pro reports 100-5-1 = 94, then 93 and 92; 8 spent in all.
func (ps *planSwitch) spendFreeThenPro() {
	ps.t.Helper()
	ps.on("free")
	for i := range 5 {
		ps.expect(200, int64(4-i))
	}
	ps.expect(429, 0)
	ps.on("pro")
	for _, rem := range []int64{94, 93, 92} {
		ps.expect(200, rem)
	}
	ps.on("free")
}

// TestPlanChangeCarriesOver moves a tenant from free to pro and back, on each time rule,
// on the in-process limiter (a driven clock) and on a real Redis (the server's clock):
// what was spent carries over both ways, and after the shrink the tenant is refused
// until its window ends (fixed) or its day ends (calendar), its events leave the window (rolling), tokens refill
// at the free rate (token) or enough leases end (in flight).
func TestPlanChangeCarriesOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	limiters := map[string]func(t *testing.T, prefix string) (ratebudget.Limiter, *fakeClock){
		"memory": func(t *testing.T, _ string) (ratebudget.Limiter, *fakeClock) {
			clk := newClock()
			return newMemory(t, clk), clk
		},
		"redis": func(t *testing.T, prefix string) (ratebudget.Limiter, *fakeClock) {
			lim, err := lua.New(client, lua.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			return lim, nil
		},
	}
	for store, newLim := range limiters {
		t.Run(store+"/fixed", func(t *testing.T) {
			lim, clk := newLim(t, "plans-fixed")
			ps := newPlanSwitch(t, lim, clk, rule("api", 10, time.Hour), nil)
			ps.spendFreeThenPro()
			w := ps.expect(429, 0) // 8 spent in a window of 5: refused until it ends
			ps.retryAfter(w, 3600)
			if clk != nil {
				clk.Advance(time.Hour - time.Second)
				if s := ps.retryAfter(ps.expect(429, 0), 3600); s != 1 {
					t.Fatalf("a second before the window's end: Retry-After %d, want 1", s)
				}
				clk.Advance(time.Second)
				ps.expect(200, 4) // a new window, under free
			}
		})
		t.Run(store+"/token", func(t *testing.T) {
			lim, clk := newLim(t, "plans-token")
			// Refilled per hour: on Redis the server's clock runs, and pro refills one
			// token in 36s, longer than the test takes.
			ps := newPlanSwitch(t, lim, clk, ratebudget.Rule{Name: "api", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Hour}, nil)
			ps.spendFreeThenPro()
			// The deficit, 8 tokens, carries over: in a bucket of 5 a request of 1 waits
			// until it is down to 4, at free's rate a token in 12 minutes (2880s), or
			// until the bucket is full under the plan that last spent from it (pro: 8
			// tokens in 288s; on Redis its key expires then), whichever comes first.
			w := ps.expect(429, 0)
			if s := ps.retryAfter(w, 288); clk != nil && s != 288 {
				t.Fatalf("Retry-After %d, want 288 (full under pro)", s)
			}
			if clk != nil {
				clk.Advance(288*time.Second - time.Millisecond)
				ps.expect(429, 0)
				clk.Advance(time.Millisecond)
				ps.expect(200, 4)
			}
		})
		t.Run(store+"/rolling", func(t *testing.T) {
			lim, clk := newLim(t, "plans-rolling")
			ps := newPlanSwitch(t, lim, clk, ratebudget.Rule{Name: "api", Algorithm: ratebudget.RollingWindow, Limit: 10, Window: time.Hour}, nil)
			ps.spendFreeThenPro()
			w := ps.expect(429, 0) // 8 events in the last hour, 5 allowed
			ps.retryAfter(w, 3600)
			if clk != nil {
				clk.Advance(time.Hour - time.Millisecond)
				ps.expect(429, 0)
				clk.Advance(time.Millisecond)
				ps.expect(200, 4) // every event left the window
			}
		})
		t.Run(store+"/calendar", func(t *testing.T) {
			lim, clk := newLim(t, "plans-calendar")
			ps := newPlanSwitch(t, lim, clk, ratebudget.Rule{Name: "api", Algorithm: ratebudget.Calendar, Limit: 10, Period: ratebudget.Day}, nil)
			ps.spendFreeThenPro()
			w := ps.expect(429, 0) // 8 spent in a day of 5: refused until midnight (UTC)
			s := ps.retryAfter(w, 86400)
			if clk != nil {
				now := clk.Now().UTC()
				left := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now)
				if s != int64(left/time.Second) {
					t.Fatalf("Retry-After %d, want %d (the day's end)", s, int64(left/time.Second))
				}
				clk.Advance(left - time.Millisecond)
				ps.expect(429, 0)
				clk.Advance(time.Millisecond)
				ps.expect(200, 4) // a new day, under free
			}
		})
		t.Run(store+"/inflight", func(t *testing.T) {
			lim, clk := newLim(t, "plans-inflight")
			inflightCarriesOver(t, lim, clk)
		})
	}
}

// inflightCarriesOver holds leases under free (5), moves to pro (100) and takes 2 more
// (7 held), moves back to free: refused until enough leases end, i.e. until 4 are held.
func inflightCarriesOver(t *testing.T, lim ratebudget.Limiter, clk *fakeClock) {
	entered := make(chan struct{})
	release := make(chan struct{})
	ps := newPlanSwitch(t, lim, clk, ratebudget.Rule{Name: "api", Algorithm: ratebudget.InFlight, Limit: 10, Window: time.Minute}, func() {
		entered <- struct{}{}
		<-release
	})
	var wg sync.WaitGroup
	defer func() { close(release); wg.Wait() }()
	codes := make(chan int, 16)
	hold := func() { // a request that is admitted and holds its lease until released
		t.Helper()
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := httptest.NewRecorder()
			ps.h.ServeHTTP(w, keyed("GET", "/", "tenant"))
			codes <- w.Code
		}()
		select {
		case <-entered:
		case c := <-codes:
			t.Fatalf("a request that should hold a lease was answered %d", c)
		}
	}
	end := func() { // one held request returns, its lease released
		t.Helper()
		release <- struct{}{}
		if c := <-codes; c != 200 {
			t.Fatalf("a held request was answered %d", c)
		}
	}
	for range 5 {
		hold()
	}
	ps.expect(429, 0)
	ps.on("pro")
	hold()
	hold() // 7 held
	ps.on("free")
	ps.expect(429, 0)
	end()
	end()
	ps.expect(429, 0) // 5 held, 5 allowed
	end()             // 4 held
	hold()
	ps.expect(429, 0)
}

// TestPlanChangeThroughWarmRefusalCaches: two replicas (two Redis limiters, their
// refusal caches on, as by default) refuse a tenant on plan free, twice each, so that
// both caches hold the refusal; the tenant moves to pro, and its next request on each
// replica is admitted, decided by Redis: a cached refusal names the rule's limit, so it
// never answers for another plan.
func TestPlanChangeThroughWarmRefusalCaches(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	replica := func() *planSwitch {
		lim, err := lua.New(client, lua.WithPrefix("plans-warm"))
		if err != nil {
			t.Fatal(err)
		}
		return newPlanSwitch(t, lim, nil, rule("api", 10, time.Hour), nil)
	}
	a, b := replica(), replica()
	for i := int64(4); i >= 2; i-- {
		a.expect(200, i)
	}
	b.expect(200, 1)
	b.expect(200, 0)
	for range 2 {
		b.expect(429, 0)
		a.expect(429, 0)
	}
	refused := time.Now()
	before := srv.ScriptCalls(t)
	a.expect(429, 0) // the cache answers: Redis is not asked
	// (a cached refusal repeats for at most 1 s: on a runner stalled that long, Redis
	// is asked again, and the count says nothing)
	if n := srv.ScriptCalls(t) - before; n != 0 && time.Since(refused) < 500*time.Millisecond {
		t.Fatalf("a refusal repeated by a warm cache ran %d scripts, want 0", n)
	}
	a.on("pro")
	b.on("pro")
	a.expect(200, 94) // 5 spent of 100, and this one
	b.expect(200, 93)
	a.on("free")
	a.expect(429, 0) // 7 spent: over free's 5 again
}
