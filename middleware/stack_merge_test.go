package middleware_test

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// countDown sends n+1 requests to path through h and checks that the first n are
// admitted with X-RateLimit-Remaining counting down by one from n-1, in one header
// value each (one budget, one set of metadata), and that the last is refused.
func countDown(t *testing.T, h http.Handler, path string, n int) {
	t.Helper()
	for i := range n + 1 {
		rec := do(h, "GET", path, nil)
		if i == n {
			if rec.Code != http.StatusTooManyRequests {
				t.Fatalf("%s request %d: %d, want 429 once the %d units are spent", path, i+1, rec.Code, n)
			}
			return
		}
		rem := rec.Header().Values("X-RateLimit-Remaining")
		if want := strconv.Itoa(n - 1 - i); rec.Code != http.StatusOK || len(rem) != 1 || rem[0] != want {
			t.Fatalf("%s request %d: %d, X-RateLimit-Remaining %q; want 200 and [%s]", path, i+1, rec.Code, rem, want)
		}
	}
}

// The same LimitByIP in a router's r.Use and a route's r.With is one budget, decided
// once: 5 requests at a limit of 5 are admitted, each spending one unit, and the 6th is
// refused. So is one middleware value mounted twice, and two built alike.
func TestStackedIdenticalRulesAreOneBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		same bool // one middleware value in both layers
	}{{"built_alike", false}, {"one_value", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := newMemory(t, newClock())
			outer, err := middleware.LimitByIP(lim, 5, time.Minute, middleware.WithHeaders(headers.XRateLimit))
			if err != nil {
				t.Fatal(err)
			}
			inner := outer
			if !tc.same {
				if inner, err = middleware.LimitByIP(lim, 5, time.Minute, middleware.WithHeaders(headers.XRateLimit)); err != nil {
					t.Fatal(err)
				}
			}
			r := chi.NewRouter()
			r.Use(outer)
			r.With(inner).Get("/both", ok)
			r.Get("/outer", ok)
			countDown(t, r, "/both", 5)
			// The route with the outer layer only spends from the same budget: none left.
			if rec := do(r, "GET", "/outer", nil); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("/outer after 5 on /both: %d, want 429 (one budget)", rec.Code)
			}
		})
	}
}

// Merged checks spend the larger of the layers' costs, and a rule enforced in one layer
// and in shadow mode in the other is enforced, in either order.
func TestStackedIdenticalRulesMerge(t *testing.T) {
	t.Parallel()
	api := ratebudget.Rule{Name: "api", Limit: 10, Window: time.Minute}
	costOf := func(n int64) middleware.Option {
		return middleware.WithCost(func(*http.Request) (int64, error) { return n, nil })
	}
	for _, tc := range []struct {
		name                     string
		outerCost, innerCost     int64
		outerShadow, innerShadow bool
		wantRemaining            []string // of each admission; then a refusal
	}{
		{name: "larger_inner_cost", outerCost: 1, innerCost: 3, wantRemaining: []string{"7", "4", "1"}},
		{name: "larger_outer_cost", outerCost: 4, innerCost: 2, wantRemaining: []string{"6", "2"}},
		{name: "outer_shadow", outerCost: 5, innerCost: 5, outerShadow: true, wantRemaining: []string{"5", "0"}},
		{name: "inner_shadow", outerCost: 5, innerCost: 5, innerShadow: true, wantRemaining: []string{"5", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := newMemory(t, newClock())
			var mu sync.Mutex
			var shadowed []string
			observe := middleware.WithObserver(func(ev middleware.Event) {
				mu.Lock()
				defer mu.Unlock()
				if ev.Shadow.Rule != "" {
					shadowed = append(shadowed, ev.Shadow.Rule)
				}
			})
			layer := func(cost int64, shadow bool) func(http.Handler) http.Handler {
				return mustNew(t, lim, []middleware.Rule{{Rule: api, Identity: keyfuncs.Global(), Shadow: shadow}},
					costOf(cost), observe, middleware.WithHeaders(headers.XRateLimit))
			}
			h := layer(tc.outerCost, tc.outerShadow)(layer(tc.innerCost, tc.innerShadow)(ok))
			for i, want := range tc.wantRemaining {
				rec := do(h, "GET", "/", nil)
				if rem := rec.Header().Values("X-RateLimit-Remaining"); rec.Code != http.StatusOK || len(rem) != 1 || rem[0] != want {
					t.Fatalf("request %d: %d, X-RateLimit-Remaining %q; want 200 and [%s]", i+1, rec.Code, rem, want)
				}
			}
			if rec := do(h, "GET", "/", nil); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("request %d: %d, want 429 (the rule is enforced)", len(tc.wantRemaining)+1, rec.Code)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(shadowed) != 0 {
				t.Fatalf("shadow decisions %v, want none: the shadow rule is the enforced one's budget, decided once", shadowed)
			}
		})
	}
}

// captureLog replaces slog's default logger for the test (which must not be parallel)
// and returns what it logs.
func captureLog(t *testing.T) *strings.Builder {
	t.Helper()
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	return &logged
}

// conflicting checks that stacked layers defining the rule "api" differently (limit 5
// outside, 3 inside) answer 500 on /both without the configuration's details and spend
// nothing: /outer, through the outer layer alone, then sees all 5 units.
func conflicting(t *testing.T, lim ratebudget.Limiter, logged *strings.Builder, opts ...middleware.Option) {
	t.Helper()
	opts = append(opts, middleware.WithHeaders(headers.XRateLimit))
	outer := mustNew(t, lim, []middleware.Rule{{Rule: rule("api", 5, time.Minute), Identity: keyfuncs.Global()}}, opts...)
	inner := mustNew(t, lim, []middleware.Rule{{Rule: rule("api", 3, time.Minute), Identity: keyfuncs.Global()}}, opts...)
	r := chi.NewRouter()
	r.Use(outer)
	r.With(inner).Get("/both", ok)
	r.Get("/outer", ok)
	for range 3 {
		if rec := do(r, "GET", "/both", nil); rec.Code != http.StatusInternalServerError || strings.Contains(rec.Body.String(), "api") {
			t.Fatalf("/both: %d %q, want 500 without the configuration's details", rec.Code, rec.Body.String())
		}
	}
	countDown(t, r, "/outer", 5)
	out := logged.String()
	if n := strings.Count(out, "level=ERROR"); n != 1 || !strings.Contains(out, "rule=api") ||
		!strings.Contains(out, `outer="Algorithm fixed, Limit 5, Window 1m0s`) || !strings.Contains(out, `inner="Algorithm fixed, Limit 3, Window 1m0s`) {
		t.Errorf("logged %d lines, want one naming rule api and both definitions: %q", n, out)
	}
}

// Stacked layers that define one rule name differently on one limiter are a
// configuration mistake known when a request first stacks them: it is answered 500
// before anything is spent, and logged once with both definitions.
func TestStackedConflictingRulesAre500(t *testing.T) { // not parallel: it replaces slog's default logger
	conflicting(t, newMemory(t, newClock()), captureLog(t))
}

// A rule name is one definition on a limiter whatever the keys: stacked layers defining
// "api" differently are a 500 also when their identities differ, while layers defining
// it alike with other identities keep a budget each.
func TestStackedRuleNameKeysDiffer(t *testing.T) { // not parallel: it replaces slog's default logger
	logged := captureLog(t)
	lim := newMemory(t, newClock())
	byUser, byTeam := keyfuncs.Header("X-User"), keyfuncs.Header("X-Team")
	hdr := map[string]string{"X-User": "u1", "X-Team": "t1"}
	layer := func(limit int64, id func(*http.Request) (string, error)) func(http.Handler) http.Handler {
		return mustNew(t, lim, []middleware.Rule{{Rule: rule("api", limit, time.Minute), Identity: id}}, middleware.WithHeaders(headers.XRateLimit))
	}
	if rec := do(layer(5, byUser)(layer(3, byTeam)(ok)), "GET", "/", hdr); rec.Code != http.StatusInternalServerError {
		t.Fatalf("one name, two definitions, other keys: %d, want 500", rec.Code)
	}
	if n := strings.Count(logged.String(), "level=ERROR"); n != 1 {
		t.Fatalf("logged %d lines, want 1: %q", n, logged.String())
	}
	// Alike, with other keys: two budgets (u1's and t1's), each spent by each request.
	h := layer(5, byUser)(layer(5, byTeam)(ok))
	for i := range 2 {
		if rec := do(h, "GET", "/", hdr); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d, want 200", i+1, rec.Code)
		}
	}
	for _, id := range []string{"u1", "t1"} {
		if n := left(t, lim, rule("api", 5, time.Minute), id); n != 3 {
			t.Errorf("budget of %s: %d left, want 3", id, n)
		}
	}
}

// On Redis, as in process: identical stacked rules are one budget (one spend per
// request), conflicting ones a 500 that spends nothing.
func TestStackedRulesOnRedis(t *testing.T) { // not parallel: it replaces slog's default logger
	logged := captureLog(t)
	srv := redistest.Start(t)
	client := srv.Client(t)
	for _, prefix := range []string{"merge", "conflict"} {
		lim, err := lua.New(client, lua.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		timeout := middleware.WithTimeout(time.Minute) // never a 503 on a loaded machine
		if prefix == "conflict" {
			conflicting(t, lim, logged, timeout)
			continue
		}
		byIP, err := middleware.LimitByIP(lim, 5, time.Minute, middleware.WithHeaders(headers.XRateLimit), timeout)
		if err != nil {
			t.Fatal(err)
		}
		r := chi.NewRouter()
		r.Use(byIP)
		r.With(byIP).Get("/both", ok)
		countDown(t, r, "/both", 5)
	}
}
