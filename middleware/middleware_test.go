package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

type fakeClock = limitertest.FakeClock

func newClock() *fakeClock { return limitertest.NewFakeClock(time.Unix(1_700_000_000, 0)) }

func byHeader(name string) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", errors.New("missing " + name)
		}
		return v, nil
	}
}

// globalID is the identity keyfuncs.Global gives every request, as its documentation
// states.
const globalID = "~global"

func global(*http.Request) (string, error) { return globalID, nil }

func newMemory(t testing.TB, clk *fakeClock) *memory.Limiter {
	t.Helper()
	m, err := memory.New(memory.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("ok\n"))
})

func rule(name string, limit int64, window time.Duration) ratebudget.Rule {
	return ratebudget.Rule{Name: name, Limit: limit, Window: window}
}

func mustNew(t testing.TB, lim ratebudget.Limiter, rules []middleware.Rule, opts ...middleware.Option) func(http.Handler) http.Handler {
	t.Helper()
	m, err := middleware.New(lim, rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func do(h http.Handler, method, target string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestFixedWindowEndToEnd(t *testing.T) {
	t.Parallel()
	clk := newClock()
	h := mustNew(t, newMemory(t, clk), []middleware.Rule{{Rule: rule("per-client", 3, 10*time.Second), Identity: byHeader("X-Client")}})(ok)
	me := map[string]string{"X-Client": "a"}
	resets := []string{"10", "9", "7"} // 10s, 8.5s and 7s left, rounded up
	for i, want := range []string{"2", "1", "0"} {
		rec := do(h, "GET", "/", me)
		if rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != want || rec.Header().Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d: %d remaining %q limit %q, want 200 %s 3", i, rec.Code, rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("X-RateLimit-Limit"), want)
		}
		if got := rec.Header().Get("X-RateLimit-Reset"); got != resets[i] {
			t.Fatalf("request %d: reset %q, want %s", i, got, resets[i])
		}
		clk.Advance(1500 * time.Millisecond)
	}
	rec := do(h, "GET", "/", me)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d, want 429", rec.Code)
	}
	// 4.5s elapsed of 10s: 5.5s left, rounded up.
	if got := rec.Header().Get("Retry-After"); got != "6" {
		t.Errorf("Retry-After %q, want 6", got)
	}
	if got := rec.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", got)
	}
	if got := rec.Header().Get("Content-Type"); got != "text/plain; charset=utf-8" {
		t.Errorf("Content-Type %q", got)
	}
	// Another client is unaffected.
	if rec := do(h, "GET", "/", map[string]string{"X-Client": "b"}); rec.Code != 200 {
		t.Errorf("other client: %d", rec.Code)
	}
	// After the window, a new one opens at the first admission.
	clk.Advance(6 * time.Second)
	if rec := do(h, "GET", "/", me); rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "2" {
		t.Errorf("after expiry: %d remaining %q, want 200 2", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
}

func TestRefusalProblemJSON(t *testing.T) {
	t.Parallel()
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("hello", 1, time.Minute), Identity: global}})(ok)
	do(h, "GET", "/", nil)
	rec := do(h, "GET", "/", map[string]string{"Accept": "application/json"})
	if rec.Code != 429 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != 429 || p.Policy != "hello" || p.RetryAfter != 60 || p.Type != problem.QuotaExceeded {
		t.Errorf("problem %+v", p)
	}
}

func TestHeadLikeGet(t *testing.T) {
	t.Parallel()
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global}})(ok)
	get := do(h, "GET", "/", nil)
	head := do(h, "HEAD", "/", nil) // refused
	get2 := do(h, "GET", "/", nil)  // refused
	if get.Code != 200 || head.Code != 429 || get2.Code != 429 {
		t.Fatalf("codes %d %d %d", get.Code, head.Code, get2.Code)
	}
	if head.Body.Len() != 0 {
		t.Errorf("HEAD body %q", head.Body.String())
	}
	for _, k := range []string{"Retry-After", "Cache-Control", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Content-Type", "Content-Length"} {
		if head.Header().Get(k) != get2.Header().Get(k) {
			t.Errorf("%s: HEAD %q, GET %q", k, head.Header().Get(k), get2.Header().Get(k))
		}
	}
}

func TestHeaderStyles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		style      headers.Style
		x, ietf    bool
		policy, rl string
	}{
		{headers.XRateLimit, true, false, "", ""},
		{headers.IETF, false, true, `"r";q=5;w=60`, `"r";r=4;t=60`},
		{headers.IETFDraft10, false, true, `"r";q=5;w=60`, `"r";r=4;t=60`},
		{headers.None, false, false, "", ""},
		{"", true, false, "", ""}, // the zero Style is the default, XRateLimit
	} {
		t.Run(string(tc.style), func(t *testing.T) {
			h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 5, time.Minute), Identity: global}}, middleware.WithHeaders(tc.style))(ok)
			rec := do(h, "GET", "/", nil)
			if got := rec.Header().Get("X-RateLimit-Remaining") != ""; got != tc.x {
				t.Errorf("X-RateLimit present %v, want %v", got, tc.x)
			}
			if got := rec.Header().Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tc.policy)
			}
			if got := rec.Header().Get("RateLimit"); got != tc.rl {
				t.Errorf("RateLimit %q, want %q", got, tc.rl)
			}
		})
	}
}

func TestMostRestrictiveAndAllOrNothing(t *testing.T) {
	t.Parallel()
	clk := newClock()
	lim := newMemory(t, clk)
	h := mustNew(t, lim, []middleware.Rule{
		{Rule: rule("account", 10, time.Minute), Identity: byHeader("X-Client")},
		{Rule: rule("service", 3, time.Minute), Identity: global},
	})(ok)
	rec := do(h, "GET", "/", map[string]string{"X-Client": "a"})
	if rec.Header().Get("X-RateLimit-Limit") != "3" || rec.Header().Get("X-RateLimit-Remaining") != "2" {
		t.Fatalf("reported limit %q remaining %q, want the service rule 3/2", rec.Header().Get("X-RateLimit-Limit"), rec.Header().Get("X-RateLimit-Remaining"))
	}
	do(h, "GET", "/", map[string]string{"X-Client": "b"})
	do(h, "GET", "/", map[string]string{"X-Client": "c"})
	// The service budget is spent: client a is refused, and its account budget untouched.
	if rec := do(h, "GET", "/", map[string]string{"X-Client": "a"}); rec.Code != 429 {
		t.Fatalf("want 429, got %d", rec.Code)
	}
	d, err := lim.Allow(context.Background(), []ratebudget.Check{{Rule: rule("account", 10, time.Minute), Identity: "a", Cost: 1}})
	if err != nil || d.Remaining != 8 {
		t.Fatalf("account budget after refusal: remaining %d (%v), want 8 (one spent, refusal spent nothing)", d.Remaining, err)
	}
}

func TestCostAndExceeded(t *testing.T) {
	t.Parallel()
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("jobs", 10, time.Minute), Identity: global}},
		middleware.WithCost(func(r *http.Request) (int64, error) {
			return strconv.ParseInt(r.URL.Query().Get("cost"), 10, 64)
		}))(ok)
	if rec := do(h, "POST", "/?cost=4", nil); rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "6" {
		t.Fatalf("cost 4: %d %q", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	rec := do(h, "POST", "/?cost=11", nil)
	if rec.Code != http.StatusRequestEntityTooLarge || rec.Header().Get("Retry-After") != "" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("cost 11: %d Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	if rec := do(h, "POST", "/?cost=7", nil); rec.Code != 429 {
		t.Fatalf("cost 7 over 6 remaining: %d", rec.Code)
	}
	for _, bad := range []string{"0", "-3", "x"} {
		if rec := do(h, "POST", "/?cost="+bad, nil); rec.Code != 400 {
			t.Errorf("cost %q: %d, want 400", bad, rec.Code)
		}
	}
	if rec := do(h, "POST", "/?cost=6", nil); rec.Code != 200 {
		t.Fatalf("cost 6: %d (refused and invalid requests must spend nothing)", rec.Code)
	}
}

func TestKeyErrorIsNotASharedBucket(t *testing.T) {
	t.Parallel()
	var events []middleware.Event
	var called atomic.Int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called.Add(1) })
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: byHeader("X-Client")}},
		middleware.WithObserver(func(e middleware.Event) { events = append(events, e) }))(next)
	for range 3 {
		if rec := do(h, "GET", "/", nil); rec.Code != 400 || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("no identity: %d", rec.Code)
		}
	}
	if called.Load() != 0 {
		t.Fatal("handler called without an identity")
	}
	if rec := do(h, "GET", "/", map[string]string{"X-Client": "a"}); rec.Code != 200 {
		t.Fatalf("identified: %d", rec.Code)
	}
	if len(events) != 4 || events[0].Result != middleware.Invalid || events[3].Result != middleware.Allowed {
		t.Fatalf("events %+v", events)
	}
}

func TestChiMounting(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	perRoute := mustNew(t, lim, []middleware.Rule{{Rule: rule("route", 1, time.Minute), Identity: global,
		Scope: func(r *http.Request) (string, error) { return chi.RouteContext(r.Context()).RoutePattern(), nil }}})
	everywhere := mustNew(t, lim, []middleware.Rule{{Rule: rule("all", 5, time.Minute), Identity: global}})

	r := chi.NewRouter()
	r.Get("/healthz", ok)
	r.Group(func(r chi.Router) {
		r.Use(everywhere)
		r.With(perRoute).Get("/a/{id}", ok)
		r.With(perRoute).Get("/b", ok)
		r.Get("/c", ok)
	})
	for _, tc := range []struct {
		path string
		code int
	}{
		{"/a/1", 200}, {"/a/2", 429}, // one budget per route pattern, not per path
		{"/b", 200}, {"/b", 429},
		{"/c", 200},
		{"/healthz", 200}, {"/healthz", 200},
	} {
		if rec := do(r, "GET", tc.path, nil); rec.Code != tc.code {
			t.Errorf("GET %s: %d, want %d", tc.path, rec.Code, tc.code)
		}
	}
	// The layers decide together: the outer budget paid for the admitted a/1, b and c
	// only, not for the two requests the inner layer refused. Two units are left.
	for i, want := range []int{200, 200, 429} {
		if rec := do(r, "GET", "/c", nil); rec.Code != want {
			t.Errorf("request %d to /c: %d, want %d", i, rec.Code, want)
		}
	}
}

func TestPlainHandler(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle("GET /x", mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("x", 1, time.Minute), Identity: global}})(ok))
	if rec := do(mux, "GET", "/x", nil); rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	if rec := do(mux, "GET", "/x", nil); rec.Code != 429 {
		t.Fatal(rec.Code)
	}
}

func TestCanceledRequestIsNotServed(t *testing.T) {
	t.Parallel()
	var called atomic.Bool
	lim := newMemory(t, newClock())
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global}})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	h.ServeHTTP(httptest.NewRecorder(), req)
	if called.Load() {
		t.Fatal("handler invoked for a canceled request")
	}
	if rec := do(h, "GET", "/", nil); rec.Code != 200 {
		t.Fatalf("budget spent by a canceled request: %d", rec.Code)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	good := middleware.Rule{Rule: rule("r", 1, time.Minute), Identity: global}
	for _, tc := range []struct {
		name  string
		lim   ratebudget.Limiter
		rules []middleware.Rule
		opts  []middleware.Option
		field string
	}{
		{"nil limiter", nil, []middleware.Rule{good}, nil, "limiter"},
		{"no rules", lim, nil, nil, "rules"},
		{"nil identity", lim, []middleware.Rule{{Rule: rule("r", 1, time.Minute)}}, nil, "Identity"},
		{"zero limit", lim, []middleware.Rule{{Rule: rule("r", 0, time.Minute), Identity: global}}, nil, "Limit"},
		{"duplicate", lim, []middleware.Rule{good, good}, nil, "Name"},
		{"timeout", lim, []middleware.Rule{good}, []middleware.Option{middleware.WithTimeout(0)}, "WithTimeout"},
		{"replicas", lim, []middleware.Rule{good}, []middleware.Option{middleware.WithLocalFallback(0)}, "WithLocalFallback"},
		{"breaker", lim, []middleware.Rule{good}, []middleware.Option{middleware.WithBreaker(middleware.Breaker{Stall: time.Microsecond})}, "WithBreaker"},
		{"nil cost", lim, []middleware.Rule{good}, []middleware.Option{middleware.WithCost(nil)}, "WithCost"},
		{"undefined style", lim, []middleware.Rule{good}, []middleware.Option{middleware.WithHeaders(headers.Style("both"))}, "WithHeaders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := middleware.New(tc.lim, tc.rules, tc.opts...)
			var ce *ratebudget.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("err %v, want a ConfigError naming %s", err, tc.field)
			}
		})
	}
}

// A route scope in a top-level chi r.Use works: the route is looked up ahead of routing,
// so each route has its own budget. Outside any router it fails loudly: 500 and one log
// line saying how to mount it.
func TestRouteScopeAtTopLevel(t *testing.T) { // not parallel: it replaces slog's default logger
	lim := newMemory(t, newClock())
	mw := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global, Scope: keyfuncs.RoutePattern()}})
	r := chi.NewRouter()
	r.Use(mw) // top level: chi has not matched a route yet
	r.Get("/x/{id}", ok)
	r.Get("/y", ok)
	for _, tc := range []struct {
		path string
		code int
	}{{"/x/1", 200}, {"/x/2", 429}, {"/y", 200}, {"/y", 429}, {"/nowhere", 404}, {"/elsewhere", 429}} {
		if rec := do(r, "GET", tc.path, nil); rec.Code != tc.code {
			t.Errorf("GET %s: %d, want %d", tc.path, rec.Code, tc.code)
		}
	}
	// Around the router, no route is known.
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	r2 := chi.NewRouter()
	r2.Get("/x", ok)
	outside := mustNew(t, lim, []middleware.Rule{{Rule: rule("r2", 5, time.Minute), Identity: global, Scope: keyfuncs.RoutePattern()}})(r2)
	for range 2 {
		if rec := do(outside, "GET", "/x", nil); rec.Code != 500 {
			t.Fatalf("around the router: %d, want 500", rec.Code)
		}
	}
	if n := strings.Count(logged.String(), "mount the middleware where the route is known"); n != 1 {
		t.Errorf("logged %d times, want once: %s", n, logged.String())
	}
}

// The common setup of a global per-client limit and a stricter one on a route, both
// built with LimitByIP, enforces both: each limit and window is a budget of its own, and
// a refusal by one spends nothing from the other.
func TestStackedLimitByIP(t *testing.T) {
	t.Parallel()
	lim, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	all, err := middleware.LimitByIP(lim, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	strict, err := middleware.LimitByIP(lim, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(all)
	r.With(strict).Get("/strict", ok)
	r.Get("/", ok)
	var codes []int
	for _, path := range []string{"/strict", "/strict", "/strict", "/", "/", "/", "/"} {
		codes = append(codes, do(r, "GET", path, nil).Code)
	}
	if want := []int{200, 200, 429, 200, 200, 200, 429}; !slices.Equal(codes, want) {
		t.Errorf("codes %v, want %v (2 on /strict, 5 in all)", codes, want)
	}
}

// A key function built wrong (keyfuncs.Header with no name, Join of nothing, a nil
// function) is the server's mistake, not the client's: every request is answered 500,
// not 400, and the mistake is logged once, naming the key function.
func TestMisbuiltKeyFuncIs500AndLogged(t *testing.T) { // not parallel: it replaces slog's default logger
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	for _, tc := range []struct {
		name string
		fn   func(*http.Request) (string, error)
		want string
	}{
		{"Header", keyfuncs.Header(" "), "keyfuncs.Header"},
		{"HashedHeader", keyfuncs.HashedHeader("", nil), "keyfuncs.HashedHeader"},
		{"Join", keyfuncs.Join(), "keyfuncs.Join"},
		{"Join nil", keyfuncs.Join(keyfuncs.Global(), nil), "keyfuncs.Join"},
		{"Func", keyfuncs.Func(nil), "keyfuncs.Func"},
		{"Hash", keyfuncs.Hash(nil, nil), "keyfuncs.Hash"},
	} {
		logged.Reset()
		lim, err := memory.New()
		if err != nil {
			t.Fatal(err)
		}
		h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: tc.fn}})(ok)
		for range 2 {
			if rec := do(h, "GET", "/", nil); rec.Code != 500 {
				t.Errorf("%s: %d %q, want 500", tc.name, rec.Code, rec.Body.String())
			}
		}
		if out := logged.String(); strings.Count(out, "level=ERROR") != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: logged %q, want one error naming %s", tc.name, out, tc.want)
		}
	}
}

// A layer around a ServeMux does not know the route the mux will run. Inside another
// ServeMux, r.Pattern is the enclosing mux's pattern ("/api/"): a route scope must not
// take it for the route's, which would give every route of the inner mux, and every
// path it answers 404, one budget. It is the mounting mistake of a layer around a
// ServeMux: 500, nothing spent.
func TestRoutePatternAroundNestedServeMux(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	mw := mustNew(t, lim, []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global, Scope: keyfuncs.RoutePattern()}})
	inner := http.NewServeMux()
	inner.Handle("GET /api/a", ok)
	inner.Handle("GET /api/b", ok)
	outer := http.NewServeMux()
	outer.Handle("/api/", mw(inner))
	for _, path := range []string{"/api/a", "/api/b"} {
		if rec := do(outer, "GET", path, nil); rec.Code != http.StatusInternalServerError {
			t.Errorf("GET %s: %d, want 500 (no route pattern known around a ServeMux)", path, rec.Code)
		}
	}
	// Per handler, the inner mux's pattern is the scope.
	inner2 := http.NewServeMux()
	inner2.Handle("GET /v2/a", mw(ok))
	inner2.Handle("GET /v2/b", mw(ok))
	outer.Handle("/v2/", inner2)
	for _, path := range []string{"/v2/a", "/v2/b"} {
		if rec := do(outer, "GET", path, nil); rec.Code != 200 {
			t.Errorf("GET %s: %d, want 200 (a scope per route)", path, rec.Code)
		}
	}
}

// A custom error handler answers a route scope mounted where no route is known, as it
// answers every InputError, and the mounting mistake is still logged once: the handler
// ported from httprate's WithErrorHandler answers the client, not the operator. Not
// parallel: it replaces the default logger.
func TestMountingMistakeLoggedWithErrorHandler(t *testing.T) {
	var logged strings.Builder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	var answered int
	mw := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 5, time.Minute), Identity: global, Scope: keyfuncs.RoutePattern()}},
		middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			answered++
			http.Error(w, "no", http.StatusPreconditionRequired)
		}))
	mux := http.NewServeMux()
	mux.Handle("GET /x", ok)
	h := mw(mux)
	for range 2 {
		if rec := do(h, "GET", "/x", nil); rec.Code != http.StatusPreconditionRequired {
			t.Fatalf("around the mux: %d, want the error handler's 428", rec.Code)
		}
	}
	if answered != 2 {
		t.Errorf("error handler called %d times, want 2", answered)
	}
	if n := strings.Count(logged.String(), "mount the middleware where the route is known"); n != 1 {
		t.Errorf("logged %d times, want once: %q", n, logged.String())
	}
}

// A rule without a name among several is pointed at by its index in New's rules.
func TestNewUnnamedRuleSaysWhich(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	rules := []middleware.Rule{
		{Rule: rule("a", 1, time.Minute), Identity: global},
		{Rule: rule("", 1, time.Minute), Identity: global},
	}
	_, err := middleware.New(lim, rules)
	var ce *ratebudget.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Name" || ce.Rule != "" || err.Error() != "ratebudget: rules[1]: Name must not be empty" {
		t.Fatalf("err %v, want rules[1]'s Name named", err)
	}
}
