package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// planOf returns a Plan function that reads the plan from tenants, keyed by the
// X-Api-Key header: "" for a key it does not know.
func planOf(tenants map[string]string) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		return tenants[r.Header.Get("X-Api-Key")], nil
	}
}

func keyed(method, path, key string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	r.Header.Set("X-Api-Key", key)
	r.RemoteAddr = "192.0.2.7:1000"
	return r
}

func TestPlansConfig(t *testing.T) {
	lim, _ := memory.New()
	pro := middleware.Plan{Name: "pro", Limit: 100}
	for _, tt := range []struct {
		name  string
		edit  func(*middleware.Rule)
		field string
	}{
		{"plans_without_plan_func", func(r *middleware.Rule) { r.Plan = nil }, "Plan"},
		{"plan_func_without_plans", func(r *middleware.Rule) { r.Plans = nil }, "Plan"},
		{"empty_name", func(r *middleware.Rule) { r.Plans = []middleware.Plan{pro, {Limit: 1}} }, "Plans[1].Name"},
		{"bad_name", func(r *middleware.Rule) { r.Plans = []middleware.Plan{{Name: "pro plan", Limit: 1}} }, "Plans[0].Name"},
		{"long_name", func(r *middleware.Rule) { r.Plans = []middleware.Plan{{Name: strings.Repeat("p", 65), Limit: 1}} }, "Plans[0].Name"},
		{"duplicate_name", func(r *middleware.Rule) { r.Plans = []middleware.Plan{pro, {Name: "free", Limit: 1}, pro} }, "Plans[2].Name"},
		{"zero_limit", func(r *middleware.Rule) { r.Plans = []middleware.Plan{pro, {Name: "free"}} }, "Plans[1].Limit"},
		{"negative_limit", func(r *middleware.Rule) { r.Plans = []middleware.Plan{{Name: "free", Limit: -1}} }, "Plans[0].Limit"},
		{"burst_on_fixed_window", func(r *middleware.Rule) { r.Plans = []middleware.Plan{{Name: "free", Limit: 1, Burst: 5}} }, "Plans[0].Burst"},
		{"bad_window", func(r *middleware.Rule) {
			r.Plans = []middleware.Plan{{Name: "free", Limit: 1, Window: time.Microsecond}}
		}, "Plans[0].Window"},
		{"unlimited_with_limit", func(r *middleware.Rule) { r.Plans = []middleware.Plan{{Name: "vip", Unlimited: true, Limit: 5}} }, "Plans[0].Unlimited"},
		{"below_counts_estimate", func(r *middleware.Rule) {
			r.Limit = 100
			r.Counts = middleware.CountActual(50, func(*http.Request, int, http.Header) int64 { return 1 })
			r.Plans = []middleware.Plan{pro, {Name: "free", Limit: 10}}
		}, "Plans[1].Limit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := middleware.Rule{Rule: rule("api", 10, time.Minute), Identity: byHeader("X-Api-Key"),
				Plans: []middleware.Plan{pro}, Plan: planOf(nil)}
			tt.edit(&r)
			_, err := middleware.New(lim, []middleware.Rule{r})
			var ce *ratebudget.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("New: %v, want a *ratebudget.ConfigError", err)
			}
			if ce.Field != tt.field || ce.Rule != "api" {
				t.Fatalf("ConfigError names rule %q field %q (%v), want rule \"api\" field %q", ce.Rule, ce.Field, err, tt.field)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		_, err := middleware.New(lim, []middleware.Rule{{Rule: ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Second},
			Identity: byHeader("X-Api-Key"), Plan: planOf(nil),
			Plans: []middleware.Plan{{Name: "pro", Limit: 100, Burst: 500, Window: time.Minute}, {Name: "vip", Unlimited: true}, {Name: "trial", Limit: 1, Shadow: true}}}})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// callCounter counts the decisions an in-process limiter is asked for.
type callCounter struct {
	inner *memory.Limiter
	calls atomic.Int64
}

func (c *callCounter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	c.calls.Add(1)
	return c.inner.Allow(ctx, checks)
}

func (c *callCounter) InProcess() bool { return true }

func TestPlansResolvePerRequest(t *testing.T) {
	clk := newClock()
	lim := &callCounter{inner: newMemory(t, clk)}
	tenants := map[string]string{"k-free": "free", "k-pro": "pro", "k-vip": "vip", "k-odd": "gold", "k-trial": "trial"}
	rules := []middleware.Rule{{
		Rule:     rule("api", 3, time.Minute),
		Identity: byHeader("X-Api-Key"),
		Plans: []middleware.Plan{
			{Name: "free", Limit: 2},
			{Name: "pro", Limit: 100, Window: time.Hour},
			{Name: "vip", Unlimited: true},
			{Name: "trial", Limit: 1, Shadow: true},
		},
		Plan: planOf(tenants),
	}}
	// Two layers of the same rules, each on its own limiter: one writes X-RateLimit-*,
	// the other the IETF fields.
	limI := &callCounter{inner: newMemory(t, clk)}
	mw, err := middleware.New(lim, rules, middleware.WithHeaders(headers.XRateLimit))
	if err != nil {
		t.Fatal(err)
	}
	mwI, err := middleware.New(limI, rules, middleware.WithHeaders(headers.IETF))
	if err != nil {
		t.Fatal(err)
	}
	h, hI := mw(ok), mwI(ok)
	// serve sends a request with key through both layers and answers the first one's
	// response with the second one's IETF fields; both must answer alike.
	serve := func(t *testing.T, key string) *httptest.ResponseRecorder {
		t.Helper()
		w, wi := httptest.NewRecorder(), httptest.NewRecorder()
		h.ServeHTTP(w, keyed("GET", "/", key))
		hI.ServeHTTP(wi, keyed("GET", "/", key))
		if w.Code != wi.Code {
			t.Fatalf("%s: %d with X-RateLimit-*, %d with the IETF fields", key, w.Code, wi.Code)
		}
		for _, k := range []string{"Ratelimit-Policy", "Ratelimit"} {
			if v, ok := wi.Header()[k]; ok {
				w.Header()[k] = v
			}
		}
		return w
	}
	t.Run("plan_values_and_name_in_metadata", func(t *testing.T) {
		w := serve(t, "k-pro")
		if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "100" || w.Header().Get("X-RateLimit-Remaining") != "99" {
			t.Fatalf("pro: %d limit %q remaining %q, want 200, 100, 99", w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
		}
		if got, want := w.Header().Get("RateLimit-Policy"), `"api";q=100;w=3600;ratebudget-plan="pro"`; got != want {
			t.Fatalf("RateLimit-Policy %q, want %q", got, want)
		}
	})
	t.Run("no_plan_and_unknown_plan_use_the_rule", func(t *testing.T) {
		for _, key := range []string{"k-none", "k-odd"} {
			w := serve(t, key)
			if w.Header().Get("X-RateLimit-Limit") != "3" || strings.Contains(w.Header().Get("RateLimit-Policy"), "plan") {
				t.Fatalf("%s: limit %q policy %q, want the rule's 3 and no plan", key, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("RateLimit-Policy"))
			}
		}
	})
	t.Run("refusal_names_the_plan", func(t *testing.T) {
		for i := range 2 {
			if w := serve(t, "k-free"); w.Code != 200 {
				t.Fatalf("free request %d: %d, want 200", i, w.Code)
			}
		}
		r := keyed("GET", "/", "k-free")
		r.Header.Set("Accept", "application/json")
		w := httptest.NewRecorder()
		hI.ServeHTTP(w, r)
		if w.Code != 429 {
			t.Fatalf("third free request: %d, want 429", w.Code)
		}
		var p problem.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if p.Plan != "free" || p.Policy != "api" {
			t.Fatalf("problem plan %q policy %q, want free, api", p.Plan, p.Policy)
		}
		if !strings.Contains(w.Header().Get("RateLimit-Policy"), `ratebudget-plan="free"`) {
			t.Fatalf("RateLimit-Policy %q does not name the plan", w.Header().Get("RateLimit-Policy"))
		}
	})
	t.Run("unlimited_plan_asks_no_store", func(t *testing.T) {
		before, beforeI := lim.calls.Load(), limI.calls.Load()
		for i := range 10 {
			w := serve(t, "k-vip")
			if w.Code != 200 {
				t.Fatalf("vip request %d: %d, want 200", i, w.Code)
			}
			if len(w.Header().Values("X-RateLimit-Limit"))+len(w.Header().Values("RateLimit-Policy"))+len(w.Header().Values("RateLimit")) != 0 {
				t.Fatalf("vip request %d has metadata %v, want none", i, w.Header())
			}
		}
		if n := lim.calls.Load() - before + limI.calls.Load() - beforeI; n != 0 {
			t.Fatalf("%d limiter calls for an unlimited plan, want 0", n)
		}
	})
	t.Run("shadow_plan_never_refuses", func(t *testing.T) {
		for i := range 4 {
			w := serve(t, "k-trial")
			if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" {
				t.Fatalf("trial request %d: %d with limit %q, want 200 without metadata", i, w.Code, w.Header().Get("X-RateLimit-Limit"))
			}
		}
	})
	t.Run("plan_error_is_400", func(t *testing.T) {
		mw, err := middleware.New(lim, []middleware.Rule{{Rule: rule("api2", 3, time.Minute), Identity: byHeader("X-Api-Key"),
			Plans: []middleware.Plan{{Name: "free", Limit: 1}},
			Plan:  func(*http.Request) (string, error) { return "", errors.New("tenant store down") },
		}})
		if err != nil {
			t.Fatal(err)
		}
		before := lim.calls.Load()
		r := keyed("GET", "/", "k-free")
		r.Header.Set("Accept", "application/json")
		w := httptest.NewRecorder()
		mw(ok).ServeHTTP(w, r)
		var p problem.Problem
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != 400 || p.Invalid != "plan" {
			t.Fatalf("%d invalid %q, want 400 naming plan", w.Code, p.Invalid)
		}
		if lim.calls.Load() != before {
			t.Fatal("the limiter was asked for a request whose plan is unknown")
		}
	})
}

// TestPlansManyUseTheMap resolves plans past the linear scan's reach.
func TestPlansManyUseTheMap(t *testing.T) {
	clk := newClock()
	var plans []middleware.Plan
	tenants := map[string]string{}
	for i := range 20 {
		name := "p" + strconv.Itoa(i)
		plans = append(plans, middleware.Plan{Name: name, Limit: int64(i + 1)})
		tenants["k"+strconv.Itoa(i)] = name
	}
	mw, err := middleware.New(newMemory(t, clk), []middleware.Rule{{Rule: rule("api", 1000, time.Minute),
		Identity: byHeader("X-Api-Key"), Plans: plans, Plan: planOf(tenants)}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		w := httptest.NewRecorder()
		mw(ok).ServeHTTP(w, keyed("GET", "/", "k"+strconv.Itoa(i)))
		if got, want := w.Header().Get("X-RateLimit-Limit"), strconv.Itoa(i+1); got != want {
			t.Fatalf("tenant %d: limit %q, want %q", i, got, want)
		}
	}
}

// TestPlansCostAbovePlanCapacity: a cost within the rule's capacity but above the
// plan's is a 413 naming the plan, decided before the limiter is asked.
func TestPlansCostAbovePlanCapacity(t *testing.T) {
	clk := newClock()
	lim := &callCounter{inner: newMemory(t, clk)}
	mw, err := middleware.New(lim, []middleware.Rule{
		{Rule: rule("per-ip", 100, time.Minute), Identity: global},
		{Rule: rule("api", 100, time.Minute), Identity: byHeader("X-Api-Key"),
			Plans: []middleware.Plan{{Name: "free", Limit: 3}}, Plan: planOf(map[string]string{"k": "free"})},
	}, middleware.WithCost(func(*http.Request) (int64, error) { return 5, nil }))
	if err != nil {
		t.Fatal(err)
	}
	r := keyed("GET", "/", "k")
	r.Header.Set("Accept", "application/json")
	w := httptest.NewRecorder()
	mw(ok).ServeHTTP(w, r)
	var p problem.Problem
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	if w.Code != 413 || p.Plan != "free" || p.Capacity != 3 || p.Policy != "api" {
		t.Fatalf("%d %+v, want 413 naming plan free, capacity 3, policy api", w.Code, p)
	}
	if lim.calls.Load() != 0 {
		t.Fatal("the limiter was asked")
	}
	// The pro tenant (no plan: the rule's 100) is admitted at that cost.
	w = httptest.NewRecorder()
	mw(ok).ServeHTTP(w, keyed("GET", "/", "other"))
	if w.Code != 200 {
		t.Fatalf("rule's own capacity: %d, want 200", w.Code)
	}
}

// TestPlansOneDecisionWithPerIP is issue 29's scenario: a per-IP rule for everyone (100
// a minute) and a plan per API key (free: 3 a minute). Six requests of a free key: three
// admitted, three refused by the plan. The refusals spend nothing of the per-IP budget
// (remaining 97, not 94), and every response carries the per-IP rule's metadata. The
// pro key from the same address goes on, its spend counted per IP.
func TestPlansOneDecisionWithPerIP(t *testing.T) {
	perIP := middleware.Rule{Rule: rule("per-ip", 100, time.Minute), Identity: func(r *http.Request) (string, error) { return r.RemoteAddr, nil }}
	planned := middleware.Rule{Rule: rule("api", 60, time.Minute), Identity: byHeader("X-Api-Key"),
		Plans: []middleware.Plan{{Name: "free", Limit: 3}, {Name: "pro", Limit: 100}},
		Plan:  planOf(map[string]string{"demo-free": "free", "demo-pro": "pro"})}
	build := map[string]func(lim ratebudget.Limiter) http.Handler{
		"one_layer": func(lim ratebudget.Limiter) http.Handler {
			mw, err := middleware.New(lim, []middleware.Rule{perIP, planned}, middleware.WithHeaders(headers.IETF), middleware.WithTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			return mw(ok)
		},
		"stacked_layers": func(lim ratebudget.Limiter) http.Handler {
			outer, err := middleware.New(lim, []middleware.Rule{perIP}, middleware.WithHeaders(headers.IETF), middleware.WithTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			inner, err := middleware.New(lim, []middleware.Rule{planned}, middleware.WithHeaders(headers.IETF), middleware.WithTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			r := chi.NewRouter()
			r.Use(outer)
			r.With(inner).Get("/api/hello", ok)
			return r
		},
		// The plan's rule on another limiter (in process) than the per-IP rule's: decided
		// limiter by limiter, the per-IP spend given back when the plan refuses.
		"two_limiters": func(lim ratebudget.Limiter) http.Handler {
			outer, err := middleware.New(lim, []middleware.Rule{perIP}, middleware.WithHeaders(headers.IETF), middleware.WithTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			inner, err := middleware.New(newMemory(t, newClock()), []middleware.Rule{planned}, middleware.WithHeaders(headers.IETF))
			if err != nil {
				t.Fatal(err)
			}
			r := chi.NewRouter()
			r.Use(outer)
			r.With(inner).Get("/api/hello", ok)
			return r
		},
	}
	srv := redistest.Start(t)
	client := srv.Client(t)
	limiters := map[string]func(t *testing.T, name string) ratebudget.Limiter{
		"memory": func(t *testing.T, _ string) ratebudget.Limiter { return newMemory(t, newClock()) },
		"redis": func(t *testing.T, name string) ratebudget.Limiter {
			lim, err := lua.New(client, lua.WithPrefix("plans-"+name))
			if err != nil {
				t.Fatal(err)
			}
			return lim
		},
	}
	for name, mk := range build {
		for store, newLim := range limiters {
			t.Run(store+"/"+name, func(t *testing.T) {
				h := mk(newLim(t, name))
				var last *httptest.ResponseRecorder
				for i := range 6 {
					last = httptest.NewRecorder()
					h.ServeHTTP(last, keyed("GET", "/api/hello", "demo-free"))
					if want := map[bool]int{true: 200, false: 429}[i < 3]; last.Code != want {
						t.Fatalf("request %d: %d, want %d", i, last.Code, want)
					}
					rl := last.Header().Get("RateLimit")
					if !strings.Contains(rl, `"per-ip";r=`) {
						t.Fatalf("request %d: RateLimit %q hides the per-IP rule", i, rl)
					}
				}
				if rl := last.Header().Get("RateLimit"); !strings.Contains(rl, `"per-ip";r=97`) || !strings.Contains(rl, `"api";r=0`) {
					t.Fatalf("after 3 admitted and 3 refused: RateLimit %q, want per-ip r=97 and api r=0", rl)
				}
				if pol := last.Header().Get("RateLimit-Policy"); !strings.Contains(pol, `"api";q=3;w=60;ratebudget-plan="free"`) {
					t.Fatalf("RateLimit-Policy %q does not name the free plan", pol)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, keyed("GET", "/api/hello", "demo-pro"))
				if rl := w.Header().Get("RateLimit"); w.Code != 200 || !strings.Contains(rl, `"per-ip";r=96`) || !strings.Contains(rl, `"api";r=99`) {
					t.Fatalf("pro: %d RateLimit %q, want 200 with per-ip r=96, api r=99", w.Code, rl)
				}
			})
		}
	}
}

// A plan the rule does not know is decided under the rule's own values, and logged
// once per rule. (Not parallel: it replaces the default logger.)
func TestPlansUnknownLoggedOnce(t *testing.T) {
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	mw := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("api", 3, time.Minute), Identity: byHeader("X-Api-Key"),
		Plans: []middleware.Plan{{Name: "free", Limit: 1}},
		Plan:  func(r *http.Request) (string, error) { return r.Header.Get("X-Plan"), nil }}})
	for _, plan := range []string{"gold", "silver", "gold"} {
		r := keyed("GET", "/", "k")
		r.Header.Set("X-Plan", plan)
		w := httptest.NewRecorder()
		mw(ok).ServeHTTP(w, r)
		if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("plan %s: %d limit %q, want 200 under the rule's 3", plan, w.Code, w.Header().Get("X-RateLimit-Limit"))
		}
	}
	if n := strings.Count(logged.String(), "a plan the rule does not know"); n != 1 || !strings.Contains(logged.String(), "plan=gold") {
		t.Fatalf("logged %d times, want once naming gold: %s", n, logged.String())
	}
}

// The local fallback decides a request on its plan's per-replica share, and a rule that
// settles settles under its plan's values.
func TestPlansFallbackAndSettle(t *testing.T) {
	t.Parallel()
	plans := []middleware.Plan{{Name: "free", Limit: 4}, {Name: "pro", Limit: 100}}
	tenants := planOf(map[string]string{"k-free": "free", "k-pro": "pro"})
	t.Run("local_fallback", func(t *testing.T) {
		f := &flaky{next: newMemory(t, newClock())}
		f.down.Store(true)
		h := mustNew(t, f, []middleware.Rule{{Rule: rule("api", 50, time.Minute), Identity: byHeader("X-Api-Key"), Plans: plans, Plan: tenants}},
			middleware.WithLocalFallback(2), middleware.WithBreaker(middleware.Breaker{Disabled: true}))(ok)
		for i, want := range []int{200, 200, 429} { // free's share: 4 / 2 replicas
			r := keyed("GET", "/", "k-free")
			r.Header.Set("Accept", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != want {
				t.Fatalf("free request %d on the fallback: %d, want %d", i, w.Code, want)
			}
			if want == 429 {
				var p problem.Problem
				if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Plan != "free" {
					t.Fatalf("fallback refusal %s does not name plan free (%v)", w.Body.String(), err)
				}
			}
		}
		for i := range 10 { // pro's share: 50
			w := httptest.NewRecorder()
			h.ServeHTTP(w, keyed("GET", "/", "k-pro"))
			if w.Code != 200 {
				t.Fatalf("pro request %d on the fallback: %d, want 200", i, w.Code)
			}
		}
	})
	t.Run("settled_under_the_plan", func(t *testing.T) {
		status := http.StatusInternalServerError
		h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("api", 50, time.Minute), Identity: byHeader("X-Api-Key"),
			Plans: plans, Plan: tenants, Counts: middleware.CountSuccesses(nil)}})(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
		}))
		for i := range 6 { // failures are given back: free's 4 is never spent
			w := httptest.NewRecorder()
			h.ServeHTTP(w, keyed("GET", "/", "k-free"))
			if w.Code != 500 || w.Header().Get("X-RateLimit-Limit") != "4" {
				t.Fatalf("failing request %d: %d limit %q, want the handler's 500 under free's 4", i, w.Code, w.Header().Get("X-RateLimit-Limit"))
			}
		}
		status = http.StatusOK
		for i := range 4 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, keyed("GET", "/", "k-free"))
			if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(3-i) {
				t.Fatalf("succeeding request %d: %d remaining %q, want 200 remaining %d", i, w.Code, w.Header().Get("X-RateLimit-Remaining"), 3-i)
			}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, keyed("GET", "/", "k-free"))
		if w.Code != 429 {
			t.Fatalf("after 4 successes on free: %d, want 429", w.Code)
		}
	})
}

// A plan in shadow mode spends and observes its budget without refusing: the event of
// the request beyond the plan's limit reports the refusal it would have made.
func TestPlansShadowObserved(t *testing.T) {
	t.Parallel()
	var shadow []bool // Event.Shadow.Allowed of each request on the shadow plan
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("api", 10, time.Minute), Identity: byHeader("X-Api-Key"),
		Plans: []middleware.Plan{{Name: "trial", Limit: 2, Shadow: true}}, Plan: planOf(map[string]string{"k": "trial"})}},
		middleware.WithObserver(func(ev middleware.Event) {
			if ev.Shadow.Rule != "" {
				shadow = append(shadow, ev.Shadow.Allowed)
			}
		}))(ok)
	for i := range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, keyed("GET", "/", "k"))
		if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("request %d: %d limit %q, want 200 without metadata", i, w.Code, w.Header().Get("X-RateLimit-Limit"))
		}
	}
	if want := []bool{true, true, false}; fmt.Sprint(shadow) != fmt.Sprint(want) {
		t.Fatalf("shadow decisions %v, want %v", shadow, want)
	}
}
