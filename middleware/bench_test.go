package middleware_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/httprate"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/israce"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// BenchmarkMiddleware measures the per-request overhead of the middleware on an admitted
// request, on the in-process limiter, with the same key (the client address, 256
// distinct clients) and the same limit (high enough that every request is admitted) for
// ratebudget and httprate's in-memory LimitBy (keyfuncs.ClientIP, which has httprate's
// KeyFunc shape). Metadata headers are written by both.
func BenchmarkMiddleware(b *testing.B) {
	const clients = 256
	reqs := make([]*http.Request, clients)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/", nil)
		reqs[i].RemoteAddr = "192.0.2." + strconv.Itoa(i%250) + ":" + strconv.Itoa(1000+i)
	}
	byAddr, err := keyfuncs.ClientIP()
	if err != nil {
		b.Fatal(err)
	}
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	lim, _ := memory.New()
	rb, err := middleware.New(lim, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "bench", Limit: 1 << 40, Window: time.Hour},
		Identity: byAddr,
	}})
	if err != nil {
		b.Fatal(err)
	}
	// httprate's limit is an int: the largest of a 32-bit one, which no run reaches either.
	hr := httprate.LimitBy(math.MaxInt32, time.Hour, httprate.KeyFunc(byAddr))
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{
		{"ratebudget", rb(noop)},
		{"httprate", hr(noop)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clear(w.h)
				tc.h.ServeHTTP(w, reqs[i%clients])
				i++
			}
		})
	}
}

// discard is a ResponseWriter that keeps headers and drops the rest, so the benchmark
// measures the middleware, not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// ioLimiter hides *memory.Limiter behind another type, so the middleware treats it as
// a limiter that does I/O: decision deadline and breaker.
type ioLimiter struct{ m *memory.Limiter }

func (l ioLimiter) Allow(ctx context.Context, c []ratebudget.Check) (ratebudget.Decision, error) {
	return l.m.Allow(ctx, c)
}

// BenchmarkMiddlewareIOPath measures what the middleware adds around a limiter that does
// I/O (a deadline context and the circuit breaker), on an in-process limiter so that no
// network time hides it: "serial" from one goroutine, "parallel" from GOMAXPROCS
// goroutines sharing one breaker. Compare with BenchmarkMiddleware/ratebudget; a Redis
// round trip costs tens of microseconds.
func BenchmarkMiddlewareIOPath(b *testing.B) {
	mem, _ := memory.New()
	newReq := func() *http.Request {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		// The request's context is cancelable, as a server's is: a deadline context
		// registers with it.
		ctx, cancel := context.WithCancel(context.Background())
		b.Cleanup(cancel)
		return req.WithContext(ctx)
	}
	mw, err := middleware.New(ioLimiter{mem}, []middleware.Rule{{
		Rule:     ratebudget.Rule{Name: "bench", Limit: 1 << 40, Window: time.Hour},
		Identity: keyfuncs.Global(),
	}})
	if err != nil {
		b.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	b.Run("serial", func(b *testing.B) {
		req := newReq()
		w := &discard{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			clear(w.h)
			h.ServeHTTP(w, req)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req := newReq()
			w := &discard{h: http.Header{}}
			for pb.Next() {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	})
}

// TestAllocsPerRequest: an admitted request through the middleware on the in-process
// limiter allocates nothing, whatever the client and the header style. The metadata
// headers' values come from memory that the requests through a layer share, a chunk of
// which is allocated every few dozen requests: counted over many requests, at most one
// allocation per 16 of them. The count is part of the hot path's contract; this pins 0.
func TestAllocsPerRequest(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates; make test runs this without it")
	}
	byAddr, err := keyfuncs.ClientIP()
	if err != nil {
		t.Fatal(err)
	}
	// With plans: twelve of them (found through the map), the request's plan read from
	// a map by a header, and a per-IP rule beside it.
	var plans []middleware.Plan
	tenants := map[string]string{}
	for i := range 12 {
		plans = append(plans, middleware.Plan{Name: "plan-" + strconv.Itoa(i), Limit: 1<<40 - int64(i)})
		tenants["key-"+strconv.Itoa(i)] = "plan-" + strconv.Itoa(i)
	}
	planRules := []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "per-ip", Limit: 1 << 40, Window: time.Hour}, Identity: byAddr},
		{Rule: ratebudget.Rule{Name: "allocs", Limit: 1 << 40, Window: time.Hour}, Identity: byAddr, Plans: plans,
			Plan: func(r *http.Request) (string, error) { return tenants[r.Header.Get("X-Api-Key")], nil }},
	}
	for _, tc := range []struct {
		style  headers.Style
		header string // a field the style writes
		plans  bool
	}{
		{headers.XRateLimit, "X-RateLimit-Remaining", false},
		{headers.IETF, "RateLimit", false},
		{headers.IETFDraft10, "RateLimit", false},
		{headers.XRateLimit, "X-RateLimit-Remaining", true},
		{headers.IETF, "RateLimit-Policy", true},
	} {
		name := string(tc.style)
		rules := []middleware.Rule{{
			Rule:     ratebudget.Rule{Name: "allocs", Limit: 1 << 40, Window: time.Hour},
			Identity: byAddr,
		}}
		if tc.plans {
			name, rules = name+"-plans", planRules
		}
		t.Run(name, func(t *testing.T) {
			lim, _ := memory.New()
			mw, err := middleware.New(lim, rules, middleware.WithHeaders(tc.style))
			if err != nil {
				t.Fatal(err)
			}
			served := 0
			h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
			reqs := make([]*http.Request, 16)
			for i := range reqs {
				reqs[i] = httptest.NewRequest("GET", "/", nil)
				reqs[i].RemoteAddr = "192.0.2." + strconv.Itoa(i) + ":1000"
				reqs[i].Header.Set("X-Api-Key", "key-"+strconv.Itoa(i))
			}
			w := &discard{h: http.Header{}}
			for _, r := range reqs { // each client's budget exists before counting
				h.ServeHTTP(w, r)
			}
			i := 0
			serve := func() {
				clear(w.h)
				h.ServeHTTP(w, reqs[i%len(reqs)])
				i++
			}
			allocs := testing.AllocsPerRun(500, serve)
			// AllocsPerRun rounds down: count a run long enough to see the chunks.
			const n = 4000
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range n {
				serve()
			}
			runtime.ReadMemStats(&after)
			if want := len(reqs) + 501 + n; served != want { // AllocsPerRun makes one warm-up call
				t.Fatalf("served %d requests, want %d: not every request was admitted", served, want)
			}
			if w.h.Get(tc.header) == "" {
				t.Fatalf("no %s header: the count would not include the headers", tc.header)
			}
			if tc.plans && tc.style == headers.IETF && !strings.Contains(w.h.Get("RateLimit-Policy"), "ratebudget-plan=") {
				t.Fatalf("RateLimit-Policy %q names no plan: the count would not include it", w.h.Get("RateLimit-Policy"))
			}
			if allocs != 0 {
				t.Errorf("%v allocations per admitted request, want 0", allocs)
			}
			total := after.Mallocs - before.Mallocs
			t.Logf("%d allocations in %d admitted requests", total, n)
			if total > n/16 {
				t.Errorf("%d allocations in %d admitted requests, want at most %d", total, n, n/16)
			}
		})
	}
}

// BenchmarkStacked measures a request through one layer against the same request
// through two layers that decide together (a chi group's r.Use and a route's r.With),
// on the in-process limiter.
func BenchmarkStacked(b *testing.B) {
	const clients = 256
	reqs := make([]*http.Request, clients)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/x", nil)
		reqs[i].RemoteAddr = "192.0.2." + strconv.Itoa(i%250) + ":" + strconv.Itoa(1000+i)
	}
	byAddr, err := keyfuncs.ClientIP()
	if err != nil {
		b.Fatal(err)
	}
	lim, _ := memory.New()
	mk := func(name string) func(http.Handler) http.Handler {
		m, err := middleware.New(lim, []middleware.Rule{{Rule: ratebudget.Rule{Name: name, Limit: 1 << 40, Window: time.Hour}, Identity: byAddr}})
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	outer, inner := mk("outer"), mk("inner")
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	one := chi.NewRouter()
	one.Group(func(r chi.Router) { r.Use(outer); r.Get("/x", noop) })
	two := chi.NewRouter()
	two.Group(func(r chi.Router) { r.Use(outer); r.With(inner).Get("/x", noop) })
	top := chi.NewRouter()
	top.Use(outer)
	top.With(inner).Get("/x", noop)
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"one-layer", one}, {"two-layers-group", two}, {"two-layers-top-level", top}} {
		b.Run(tc.name, func(b *testing.B) {
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clear(w.h)
				tc.h.ServeHTTP(w, reqs[i%clients])
				i++
			}
		})
	}
}

// BenchmarkPlans measures what resolving a rule's plan per request costs: the same rule
// with a fixed limit ("fixed"), and with three plans that 10,000 tenants are spread
// over, the Plan function reading the tenant's plan from a map by its API key header
// ("plans"). "plans-one" has a Plan function that names one plan without a lookup: the
// middleware's own share of the cost, without the user's lookup. All run on the
// in-process limiter, every request admitted, 10,000 budgets.
func BenchmarkPlans(b *testing.B) {
	const tenants = 10_000
	reqs := make([]*http.Request, tenants)
	planOf := make(map[string]string, tenants)
	names := []string{"free", "pro", "enterprise"}
	for i := range reqs {
		key := "key-" + strconv.Itoa(i)
		reqs[i] = httptest.NewRequest("GET", "/", nil)
		reqs[i].Header.Set("X-Api-Key", key)
		planOf[key] = names[i%len(names)]
	}
	identity := keyfuncs.Header("X-Api-Key")
	fixed := middleware.Rule{Rule: ratebudget.Rule{Name: "api", Limit: 1 << 40, Window: time.Hour}, Identity: identity}
	planned := fixed
	planned.Plans = []middleware.Plan{{Name: "free", Limit: 1 << 39}, {Name: "pro", Limit: 1<<40 - 1}, {Name: "enterprise", Limit: 1 << 40, Window: 2 * time.Hour}}
	planned.Plan = func(r *http.Request) (string, error) { return planOf[r.Header.Get("X-Api-Key")], nil }
	one := planned
	one.Plan = func(*http.Request) (string, error) { return "pro", nil }
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, tc := range []struct {
		name string
		rule middleware.Rule
	}{{"fixed", fixed}, {"plans", planned}, {"plans-one", one}} {
		b.Run(tc.name, func(b *testing.B) {
			lim, _ := memory.New()
			mw, err := middleware.New(lim, []middleware.Rule{tc.rule})
			if err != nil {
				b.Fatal(err)
			}
			h := mw(noop)
			w := &discard{h: http.Header{}}
			for _, r := range reqs { // every tenant's budget exists before timing
				h.ServeHTTP(w, r)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, reqs[i%tenants])
				i++
			}
		})
	}
}
