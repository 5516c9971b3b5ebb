package middleware_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// The stacking suite runs on the in-process limiter and on a real Redis: every case
// checks each layer's budget afterwards, by spending what is left.

func TestStackedLayersMemory(t *testing.T) {
	t.Parallel()
	stackSuite(t, func(t *testing.T) ratebudget.Limiter { return newMemory(t, newClock()) })
}

func TestStackedLayersRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	n := 0
	stackSuite(t, func(t *testing.T) ratebudget.Limiter {
		n++
		lim, err := lua.New(client, lua.WithPrefix("stack"+strconv.Itoa(n)))
		if err != nil {
			t.Fatal(err)
		}
		return lim
	})
}

var (
	outerRule = ratebudget.Rule{Name: "outer", Limit: 5, Window: time.Minute}
	innerRule = ratebudget.Rule{Name: "inner", Limit: 1, Window: time.Minute}
	thirdRule = ratebudget.Rule{Name: "third", Limit: 3, Window: time.Minute}
)

// left spends what remains of rule's budget for identity (no scope), one unit at a time,
// and returns how much that was.
func left(t *testing.T, lim ratebudget.Limiter, rule ratebudget.Rule, identity string) int {
	t.Helper()
	for n := 0; n <= int(rule.Limit); n++ {
		d, err := lim.Allow(context.Background(), []ratebudget.Check{{Rule: rule, Identity: identity, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return n
		}
	}
	t.Fatalf("%s: more than its limit left", rule.Name)
	return 0
}

// layers builds the outer (per client, 5), inner (per client, 1; cost from ?cost=; its
// identity from X-Inner when innerID is set) and third (3) middlewares on lim, which
// write X-RateLimit-*.
func layers(t *testing.T, lim ratebudget.Limiter, innerID bool) (outer, inner, third func(http.Handler) http.Handler) {
	return styledLayers(t, lim, innerID, headers.XRateLimit)
}

// styledLayers is layers whose metadata has style.
func styledLayers(t *testing.T, lim ratebudget.Limiter, innerID bool, style headers.Style) (outer, inner, third func(http.Handler) http.Handler) {
	id := keyfuncs.Header("X-Client")
	innerIdentity := id
	if innerID {
		innerIdentity = keyfuncs.Header("X-Inner")
	}
	cost := middleware.WithCost(func(r *http.Request) (int64, error) {
		if v := r.URL.Query().Get("cost"); v != "" {
			return strconv.ParseInt(v, 10, 64)
		}
		return 1, nil
	})
	// A deadline far above any decision's time: on a loaded machine a real Redis may take
	// longer than the default 50ms, and these tests are about budgets, not deadlines.
	slow := middleware.WithTimeout(time.Minute)
	outer = mustNew(t, lim, []middleware.Rule{{Rule: outerRule, Identity: id}}, middleware.WithHeaders(style), slow)
	inner = mustNew(t, lim, []middleware.Rule{{Rule: innerRule, Identity: innerIdentity}}, cost, middleware.WithHeaders(style), slow)
	third = mustNew(t, lim, []middleware.Rule{{Rule: thirdRule, Identity: id}}, middleware.WithHeaders(style), slow)
	return outer, inner, third
}

// mountings are the ways to stack outer around inner on /x; /y has outer alone.
var mountings = map[string]func(outer, inner func(http.Handler) http.Handler) http.Handler{
	"chi group use + with": func(outer, inner func(http.Handler) http.Handler) http.Handler {
		r := chi.NewRouter()
		r.Group(func(r chi.Router) {
			r.Use(outer)
			r.With(inner).Get("/x", ok)
			r.Get("/y", ok)
		})
		return r
	},
	"chi top-level use + with": func(outer, inner func(http.Handler) http.Handler) http.Handler {
		r := chi.NewRouter()
		r.Use(outer)
		r.With(inner).Get("/x", ok)
		r.Get("/y", ok)
		return r
	},
	"chi top-level use + subrouter use": func(outer, inner func(http.Handler) http.Handler) http.Handler {
		r := chi.NewRouter()
		r.Use(outer)
		r.Route("/x", func(r chi.Router) {
			r.Use(inner)
			r.Get("/", ok)
		})
		r.Get("/y", ok)
		return r
	},
	"chi.Chain": func(outer, inner func(http.Handler) http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/x", chi.Chain(outer, inner).Handler(ok))
		mux.Handle("/y", outer(ok))
		return mux
	},
	"plain wrapping": func(outer, inner func(http.Handler) http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/x", outer(inner(ok)))
		mux.Handle("/y", outer(ok))
		return mux
	},
}

func stackSuite(t *testing.T, newLimiter func(*testing.T) ratebudget.Limiter) {
	alice := map[string]string{"X-Client": "alice", "X-Inner": "alice"}
	for name, mount := range mountings {
		t.Run(name+"/inner refusal", func(t *testing.T) {
			for _, style := range []headers.Style{headers.XRateLimit, headers.IETF} {
				x := style == headers.XRateLimit
				lim := newLimiter(t)
				outer, inner, _ := styledLayers(t, lim, false, style)
				h := mount(outer, inner)
				rec := do(h, "GET", "/x", alice)
				if rec.Code != 200 {
					t.Fatalf("%s: first: %d", style, rec.Code)
				}
				// The most restrictive rule of both layers: inner, 0 of 1 left.
				if x && (rec.Header().Get("X-RateLimit-Limit") != "1" || rec.Header().Get("X-RateLimit-Remaining") != "0") {
					t.Errorf("admitted: metadata %v, want inner's limit=1 remaining=0", rec.Header())
				}
				if got := rec.Header().Get("RateLimit-Policy"); !x && got != `"outer";q=5;w=60, "inner";q=1;w=60` {
					t.Errorf("RateLimit-Policy %s, want both rules", got)
				}
				if !x {
					if _, each := lim.(limitertest.Reporter); each {
						if got := rec.Header().Get("RateLimit"); got != `"outer";r=4;t=60, "inner";r=0;t=60` && got != `"outer";r=4;t=59, "inner";r=0;t=59` {
							t.Errorf("RateLimit %s, want both rules", got)
						}
					} else if got := rec.Header().Get("RateLimit"); !strings.HasPrefix(got, `"inner";r=0`) {
						t.Errorf("RateLimit %s, want the reported rule", got)
					}
				}
				for i := range 3 {
					rec := do(h, "GET", "/x", alice)
					if rec.Code != 429 || x && rec.Header().Get("X-RateLimit-Limit") != "1" || rec.Header().Get("Retry-After") == "" {
						t.Fatalf("%s: refusal %d: %d %v", style, i, rec.Code, rec.Header())
					}
					// The refusal spent nothing: outer still has 4 of 5, as the next
					// admission will show, not 3.
					if _, each := lim.(limitertest.Reporter); each && !x {
						if got := rec.Header().Get("RateLimit"); !strings.HasPrefix(got, `"outer";r=4;t=`) {
							t.Errorf("refusal %d: RateLimit %s, want outer's 4 left", i, got)
						}
					}
				}
				if n := left(t, lim, outerRule, "alice"); n != 4 {
					t.Errorf("%s: outer has %d left after 1 admitted and 3 refused, want 4", style, n)
				}
			}
		})
		t.Run(name+"/inner 400", func(t *testing.T) {
			lim := newLimiter(t)
			outer, inner, _ := layers(t, lim, true)
			h := mount(outer, inner)
			for range 3 {
				if rec := do(h, "GET", "/x", map[string]string{"X-Client": "alice"}); rec.Code != 400 ||
					!strings.Contains(rec.Body.String(), "rate-limit identity: header X-Inner is missing or empty") {
					t.Fatalf("no X-Inner: %d %q", rec.Code, rec.Body)
				}
			}
			if n := left(t, lim, outerRule, "alice"); n != 5 {
				t.Errorf("outer has %d left after three 400s, want 5", n)
			}
		})
		t.Run(name+"/inner 413", func(t *testing.T) {
			lim := newLimiter(t)
			outer, inner, _ := layers(t, lim, false)
			h := mount(outer, inner)
			for range 3 {
				if rec := do(h, "GET", "/x?cost=2", alice); rec.Code != 413 {
					t.Fatalf("cost 2 over inner's 1: %d", rec.Code)
				}
			}
			if n := left(t, lim, outerRule, "alice"); n != 5 {
				t.Errorf("outer has %d left after three 413s, want 5", n)
			}
		})
		t.Run(name+"/outer refusal", func(t *testing.T) {
			lim := newLimiter(t)
			outer, inner, _ := layers(t, lim, false)
			h := mount(outer, inner)
			for i := range 5 {
				if rec := do(h, "GET", "/y", alice); rec.Code != 200 {
					t.Fatalf("/y %d: %d", i, rec.Code)
				}
			}
			rec := do(h, "GET", "/x", alice)
			if rec.Code != 429 || rec.Header().Get("X-RateLimit-Limit") != "5" {
				t.Fatalf("outer exhausted: %d %v", rec.Code, rec.Header())
			}
			var p problem.Problem
			req := map[string]string{"X-Client": "alice", "Accept": "application/json"}
			if err := json.Unmarshal(do(h, "GET", "/x", req).Body.Bytes(), &p); err != nil || p.Policy != "outer" || strings.Join(p.ViolatedPolicies, ",") != "outer" {
				t.Errorf("problem %+v %v, want outer violated", p, err)
			}
			if n := left(t, lim, innerRule, "alice"); n != 1 {
				t.Errorf("inner has %d left after outer refusals, want 1", n)
			}
		})
	}
	t.Run("three layers, IETF fields", func(t *testing.T) {
		// RateLimit-Policy lists the rules of the three layers, outermost first.
		outer, inner, third := styledLayers(t, newLimiter(t), false, headers.IETF)
		r := chi.NewRouter()
		r.Use(outer)
		r.Group(func(r chi.Router) {
			r.Use(third)
			r.With(inner).Get("/x", ok)
		})
		if got := do(r, "GET", "/x", map[string]string{"X-Client": "alice"}).Header().Get("RateLimit-Policy"); got != `"outer";q=5;w=60, "third";q=3;w=60, "inner";q=1;w=60` {
			t.Errorf("RateLimit-Policy %s", got)
		}
	})
	t.Run("three layers", func(t *testing.T) {
		lim := newLimiter(t)
		outer, inner, third := layers(t, lim, false)
		r := chi.NewRouter()
		r.Use(outer) // top level: looks ahead through routing
		r.Group(func(r chi.Router) {
			r.Use(third)
			r.With(inner).Get("/x", ok)
			r.Get("/z", ok)
		})
		alice := map[string]string{"X-Client": "alice"}
		rec := do(r, "GET", "/x", alice)
		if rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "1" {
			t.Fatalf("first: %d %v", rec.Code, rec.Header())
		}
		for range 2 {
			if rec := do(r, "GET", "/x", alice); rec.Code != 429 {
				t.Fatalf("inner exhausted: %d", rec.Code)
			}
		}
		// third is now the most restrictive on /z: 2 of 3 left, outer 4 of 5.
		rec = do(r, "GET", "/z", alice)
		if rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "3" || rec.Header().Get("X-RateLimit-Remaining") != "1" {
			t.Fatalf("/z: %d %v, want third's limit=3 remaining=1", rec.Code, rec.Header())
		}
		do(r, "GET", "/z", alice) // third: 0 left
		rec = do(r, "GET", "/z", alice)
		if rec.Code != 429 || rec.Header().Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("third exhausted: %d %v", rec.Code, rec.Header())
		}
		if n := left(t, lim, outerRule, "alice"); n != 2 {
			t.Errorf("outer has %d left, want 2 (3 admitted, 3 refused)", n)
		}
		if n := left(t, lim, innerRule, "alice"); n != 0 {
			t.Errorf("inner has %d left, want 0", n)
		}
	})
}

// Layers on different limiters cannot decide in one call: they decide limiter by
// limiter, outermost first, and a later refusal gives back an earlier limiter's spend
// when that limiter can settle (Memory can).
func TestStackedLayersOnDifferentLimiters(t *testing.T) {
	t.Parallel()
	for _, style := range []headers.Style{headers.XRateLimit, headers.IETF} {
		a, b := newMemory(t, newClock()), newMemory(t, newClock())
		outer, _, _ := styledLayers(t, a, false, style)
		_, inner, _ := styledLayers(t, b, false, style)
		h := outer(inner(ok))
		alice := map[string]string{"X-Client": "alice"}
		x := style == headers.XRateLimit
		if rec := do(h, "GET", "/", alice); rec.Code != 200 || x && rec.Header().Get("X-RateLimit-Limit") != "1" {
			t.Fatalf("%s: first: %d %v", style, rec.Code, rec.Header())
		}
		if rec := do(h, "GET", "/", alice); rec.Code != 429 || x && rec.Header().Get("X-RateLimit-Limit") != "1" {
			t.Fatalf("%s: second: %d %v", style, rec.Code, rec.Header())
		} else if got := rec.Header().Get("RateLimit"); !x && !strings.HasPrefix(got, `"outer";r=4;t=`) {
			t.Errorf("second: RateLimit %s, want outer's 4 left (its spend was given back)", got)
		}
		if n := left(t, a, outerRule, "alice"); n != 4 {
			t.Errorf("%s: outer (first limiter) has %d left, want 4: the second limiter's refusal gives its spend back", style, n)
		}
	}
	// The other way round, a refusal by the outer limiter spends nothing in the inner.
	a, b := newMemory(t, newClock()), newMemory(t, newClock())
	outer, _, _ := layers(t, a, false)
	_, inner, _ := layers(t, b, false)
	h := outer(inner(ok))
	for range 5 {
		do(outer(ok), "GET", "/", map[string]string{"X-Client": "bob"})
	}
	if rec := do(h, "GET", "/", map[string]string{"X-Client": "bob"}); rec.Code != 429 || rec.Header().Get("X-RateLimit-Limit") != "5" {
		t.Fatalf("outer exhausted: %d %v", rec.Code, rec.Header())
	}
	if n := left(t, b, innerRule, "bob"); n != 1 {
		t.Errorf("inner (second limiter) has %d left, want 1", n)
	}
}

// A refusal by one rule describes the other rules of the request as they are, not as if
// the refused request had spent from them: a token bucket keeps its units and the time
// to its next unit.
func TestRefusalReportsOtherRulesUnspent(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock()) // the clock never moves: nothing refills
	bucket := ratebudget.Rule{Name: "bucket", Algorithm: ratebudget.TokenBucket, Limit: 60, Window: time.Minute, Burst: 10}
	outer := mustNew(t, lim, []middleware.Rule{{Rule: bucket, Identity: global}}, middleware.WithHeaders(headers.IETF))
	inner := mustNew(t, lim, []middleware.Rule{{Rule: innerRule, Identity: global}}, middleware.WithHeaders(headers.IETF))
	h := outer(inner(ok))
	if rec := do(h, "GET", "/", nil); rec.Code != 200 || rec.Header().Get("RateLimit") != `"bucket";r=9;t=1, "inner";r=0;t=60` {
		t.Fatalf("first: %d %q", rec.Code, rec.Header().Get("RateLimit"))
	}
	rec := do(h, "GET", "/", nil)
	if got := rec.Header().Get("RateLimit"); rec.Code != 429 || got != `"bucket";r=9;t=1, "inner";r=0;t=60` {
		t.Errorf("refused: %d RateLimit %s, want the bucket's 9 units with the next in 1s", rec.Code, got)
	}
	if n := left(t, lim, bucket, globalID); n != 9 {
		t.Errorf("bucket has %d left, want 9", n)
	}
}

// The same across two limiters: the bucket's limiter admitted and reserved, and the
// middleware gave its spend back when the other limiter refused.
func TestRefusalReportsGivenBackRulesUnspent(t *testing.T) {
	t.Parallel()
	a, b := newMemory(t, newClock()), newMemory(t, newClock()) // the clocks never move
	bucket := ratebudget.Rule{Name: "bucket", Algorithm: ratebudget.TokenBucket, Limit: 60, Window: time.Minute, Burst: 10}
	outer := mustNew(t, a, []middleware.Rule{{Rule: bucket, Identity: global}}, middleware.WithHeaders(headers.IETF))
	inner := mustNew(t, b, []middleware.Rule{{Rule: innerRule, Identity: global}}, middleware.WithHeaders(headers.IETF))
	h := outer(inner(ok))
	if rec := do(h, "GET", "/", nil); rec.Code != 200 || rec.Header().Get("RateLimit") != `"bucket";r=9;t=1, "inner";r=0;t=60` {
		t.Fatalf("first: %d %q", rec.Code, rec.Header().Get("RateLimit"))
	}
	rec := do(h, "GET", "/", nil)
	if got := rec.Header().Get("RateLimit"); rec.Code != 429 || got != `"bucket";r=9;t=1, "inner";r=0;t=60` {
		t.Errorf("refused: %d RateLimit %s, want the bucket's 9 units with the next in 1s", rec.Code, got)
	}
	if n := left(t, a, bucket, globalID); n != 9 {
		t.Errorf("bucket has %d left, want 9", n)
	}
}

// cmdCount is a go-redis hook counting the commands sent.
type cmdCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *cmdCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}
func (h *cmdCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.add(c)
		}
		return next(ctx, cmds)
	}
}
func (h *cmdCount) add(c redis.Cmder) {
	h.mu.Lock()
	h.n[strings.ToLower(c.Name())]++
	h.mu.Unlock()
}
func (h *cmdCount) take() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.n
	h.n = map[string]int{}
	return n
}

// Two stacked layers on Redis are one script call, admitted or refused.
func TestStackedLayersOneRedisCall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &cmdCount{n: map[string]int{}}
	client.AddHook(hook)
	lim, err := lua.New(client, lua.WithPrefix("onecall"), lua.WithRefusalCache(0))
	if err != nil {
		t.Fatal(err)
	}
	outer, inner, _ := layers(t, lim, false)
	h := mountings["chi top-level use + with"](outer, inner)
	alice := map[string]string{"X-Client": "alice"}
	do(h, "GET", "/x", alice) // loads the script
	hook.take()
	for i, want := range []int{429, 429} {
		if rec := do(h, "GET", "/x", alice); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
		}
		n := hook.take()
		if n["evalsha"] != 1 || len(n) != 1 {
			t.Fatalf("request %d: commands %v, want one EVALSHA for both layers", i, n)
		}
	}
}

// A middleware of another kind between two layers may answer on its own (an
// authentication middleware's 401), so the layer before it decides first: two decisions,
// as documented.
func TestLayersApartDecideApart(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	outer, inner, _ := layers(t, lim, false)
	r := chi.NewRouter()
	r.Use(outer)
	r.Use(func(next http.Handler) http.Handler { return next }) // not a layer: seen as opaque
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
	})
	r.With(inner).Get("/x", ok)
	alice := map[string]string{"X-Client": "alice"}
	for i, want := range []int{200, 429, 429, 429} {
		if rec := do(r, "GET", "/x", alice); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
		}
	}
	if n := left(t, lim, outerRule, "alice"); n != 1 {
		t.Errorf("outer has %d left, want 1: it decided each request before the opaque middleware", n)
	}
}

// Each rule's RateLimit-Policy names its own unit: a rule that counts bytes
// (CountRequestBytes) content-bytes, an InFlight rule concurrent-requests, and a rule
// charged the layer's cost (WithCost) none, the default (requests), whatever the cost
// counts.
func TestQuotaUnit(t *testing.T) {
	t.Parallel()
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{
		{Rule: rule("cost", 1000, 10*time.Second), Identity: global},
		{Rule: rule("bytes", 1000, 10*time.Second), Identity: global, Counts: middleware.CountRequestBytes()},
		{Rule: ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Minute}, Identity: global},
	}, middleware.WithHeaders(headers.IETF),
		middleware.WithCost(func(r *http.Request) (int64, error) { return 300, nil }))(ok)
	rec := do(h, "POST", "/", nil)
	if got, want := rec.Header().Get("RateLimit-Policy"), `"cost";q=1000;w=10, "bytes";q=1000;qu="content-bytes";w=10, "slots";q=2;qu="concurrent-requests"`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	if got := rec.Header().Get("RateLimit"); !strings.HasPrefix(got, `"cost";r=700;t=10, `) {
		t.Errorf("RateLimit %s, want the cost rule charged 300 of 1000", got)
	}
}

// In both drafts t is the time until more quota is made available, not until the
// budget is whole: for a token bucket, the next token.
func TestDraftMeaningsOfT(t *testing.T) {
	t.Parallel()
	bucket := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 10 * time.Second} // 1 token/s
	for _, tc := range []struct {
		style headers.Style
		want  string
	}{
		{headers.IETF, `"tb";r=7;t=1`},        // the next token in 1s
		{headers.IETFDraft10, `"tb";r=7;t=1`}, // the same (full again in 3s)
	} {
		h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: bucket, Identity: global}}, middleware.WithHeaders(tc.style),
			middleware.WithCost(func(*http.Request) (int64, error) { return 3, nil }))(ok)
		if got := do(h, "GET", "/", nil).Header().Get("RateLimit"); got != tc.want {
			t.Errorf("%v: RateLimit %s, want %s", tc.style, got, tc.want)
		}
	}
}

// A refusal by the first limiter leaves the later limiters unasked: their rules are
// listed but not reported, and never named as violated.
func TestUnaskedLimiterIsNotReportedViolated(t *testing.T) {
	t.Parallel()
	a, b := newMemory(t, newClock()), newMemory(t, newClock())
	outer, _, _ := styledLayers(t, a, false, headers.IETF)
	_, inner, _ := styledLayers(t, b, false, headers.IETF)
	h := outer(inner(ok))
	bob := map[string]string{"X-Client": "bob", "Accept": "application/json"}
	for range 5 {
		do(outer(ok), "GET", "/", bob)
	}
	rec := do(h, "GET", "/", bob)
	if rec.Code != 429 {
		t.Fatalf("outer exhausted: %d", rec.Code)
	}
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || strings.Join(p.ViolatedPolicies, ",") != "outer" {
		t.Errorf("problem %+v %v, want only outer violated: inner was never asked", p, err)
	}
	if got := rec.Header().Get("RateLimit"); got != `"outer";r=0;t=60` {
		t.Errorf("RateLimit %s, want the outer rule's state only", got)
	}
	if got := rec.Header().Get("RateLimit-Policy"); got != `"outer";q=5;w=60, "inner";q=1;w=60` {
		t.Errorf("RateLimit-Policy %s, want both rules", got)
	}
	if n := left(t, b, innerRule, "bob"); n != 1 {
		t.Errorf("inner has %d left, want 1", n)
	}
}

// A limiter whose store fails under FailOpen or LocalFallback does not switch off the
// layers of a limiter that can decide: their rules are still enforced.
func TestStoreFailureKeepsOtherLimitersEnforced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy middleware.Option
	}{
		{"open", middleware.WithFailOpen()},
		{"local", middleware.WithLocalFallback(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{next: newMemory(t, newClock())}
			f.down.Store(true)
			var evs events
			outer := mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: keyfuncs.Header("X-Client")}}, tc.policy,
				middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe))
			b := newMemory(t, newClock())
			_, inner, _ := layers(t, b, false)
			h := outer(inner(ok))
			bob := map[string]string{"X-Client": "bob"}
			for i, want := range []int{200, 429, 429} {
				if rec := do(h, "GET", "/", bob); rec.Code != want {
					t.Fatalf("request %d: %d, want %d: the inner limiter (limit 1) can decide", i, rec.Code, want)
				}
			}
			outcomes, all := evs.take()
			if len(outcomes) != 3 || outcomes[1] != middleware.Denied || all[1].Decision.Rule != "inner" || all[1].Err == nil {
				t.Errorf("events %v, want the inner rule's refusals with the outer store's error", all)
			}
			if tc.name == "local" {
				if outcomes[0] != middleware.Allowed || !all[0].Fallback {
					t.Errorf("first event %+v, want a fallback admission", all[0])
				}
			} else if outcomes[0] != middleware.Degraded {
				t.Errorf("first event %v, want degraded", outcomes[0])
			}
		})
	}
}

// A limiter that rejects its checks as invalid after an earlier limiter admitted gives
// the earlier limiter's reservation back, and every layer sees the event.
func TestConfigErrorOfALaterLimiterSpendsNothing(t *testing.T) {
	t.Parallel()
	a := newMemory(t, newClock())
	var outerEvs, innerEvs events
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	outer := mustNew(t, a, []middleware.Rule{{Rule: lease, Identity: global}}, middleware.WithObserver(outerEvs.observe))
	bad := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{}, &ratebudget.ConfigError{Field: "Identity", Problem: "too long"}
	})
	inner := mustNew(t, bad, []middleware.Rule{{Rule: innerRule, Identity: global}}, middleware.WithObserver(innerEvs.observe))
	h := outer(inner(ok))
	for i := range 2 {
		if rec := do(h, "GET", "/", nil); rec.Code != 500 {
			t.Fatalf("request %d: %d, want 500", i, rec.Code)
		}
	}
	d, err := a.Allow(context.Background(), []ratebudget.Check{{Rule: lease, Identity: globalID, Cost: 1}})
	if err != nil || !d.Allowed {
		t.Errorf("the outer lease is still held after a 500: %+v %v", d, err)
	}
	for name, e := range map[string]*events{"outer": &outerEvs, "inner": &innerEvs} {
		if outcomes, _ := e.take(); len(outcomes) != 2 || outcomes[0] != middleware.Invalid {
			t.Errorf("%s layer saw %v, want two invalid events", name, outcomes)
		}
	}
}

// A request whose context ends after the outer layer handed its checks on is answered by
// the inner layer without a decision; every layer's observers see that.
func TestCanceledAtAnInnerLayerIsObservedByEveryLayer(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	var outerEvs, innerEvs events
	var cancel context.CancelFunc
	outerID := func(*http.Request) (string, error) {
		cancel() // the client goes away while the outer layer computes its checks
		return "alice", nil
	}
	outer := mustNew(t, lim, []middleware.Rule{{Rule: outerRule, Identity: outerID}}, middleware.WithObserver(outerEvs.observe))
	inner := mustNew(t, lim, []middleware.Rule{{Rule: innerRule, Identity: global}}, middleware.WithObserver(innerEvs.observe))
	h := outer(inner(ok))
	ctx, c := context.WithCancel(context.Background())
	cancel = c
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if rec.Code != 200 || rec.Body.Len() != 0 {
		t.Fatalf("answered %d %q, want nothing written", rec.Code, rec.Body)
	}
	for name, e := range map[string]*events{"outer": &outerEvs, "inner": &innerEvs} {
		if outcomes, _ := e.take(); len(outcomes) != 1 || outcomes[0] != middleware.Canceled {
			t.Errorf("%s layer saw %v, want one canceled event", name, outcomes)
		}
	}
	if n := left(t, lim, outerRule, "alice"); n != 5 {
		t.Errorf("outer has %d left, want 5", n)
	}
}

// A layer whose rules are all in shadow mode, on another limiter than the layer around
// it, enforces nothing: the request is decided by the other layer alone.
func TestShadowOnlyLayerOnAnotherLimiter(t *testing.T) {
	t.Parallel()
	a, b := newMemory(t, newClock()), newMemory(t, newClock())
	var evs events
	outer := mustNew(t, a, []middleware.Rule{{Rule: innerRule, Identity: global}}, middleware.WithObserver(evs.observe))
	shadow := mustNew(t, b, []middleware.Rule{{Rule: outerRule, Identity: global, Shadow: true}}, middleware.WithObserver(evs.observe))
	h := outer(shadow(ok))
	for i, want := range []int{200, 429} {
		if rec := do(h, "GET", "/", nil); rec.Code != want {
			t.Fatalf("request %d: %d %s, want %d", i, rec.Code, rec.Body, want)
		}
	}
	if _, all := evs.take(); len(all) != 4 || all[0].Result != middleware.Allowed || all[0].Shadow.Rule != "outer" || !all[0].Shadow.Allowed {
		t.Errorf("events %+v, want the admission with the shadow rule's decision", all)
	}
	if n := left(t, b, outerRule, globalID); n != 4 {
		t.Errorf("shadow budget has %d left, want 4: spent by the admitted request only", n)
	}
}

// Layers on two limiters whose stores both fail under FailOpen admit, degraded.
func TestEveryLimiterFailingOpenAdmits(t *testing.T) {
	t.Parallel()
	var evs events
	var layers []func(http.Handler) http.Handler
	for _, r := range []ratebudget.Rule{outerRule, innerRule} {
		f := &flaky{next: newMemory(t, newClock())}
		f.down.Store(true)
		layers = append(layers, mustNew(t, f, []middleware.Rule{{Rule: r, Identity: global}}, middleware.WithFailOpen(),
			middleware.WithBreaker(middleware.Breaker{Disabled: true}), middleware.WithObserver(evs.observe)))
	}
	h := layers[0](layers[1](ok))
	for i := range 3 {
		if rec := do(h, "GET", "/", nil); rec.Code != 200 {
			t.Fatalf("request %d: %d, want 200", i, rec.Code)
		}
	}
	if outcomes, all := evs.take(); len(outcomes) != 6 || outcomes[0] != middleware.Degraded || all[0].Err == nil {
		t.Errorf("events %v, want degraded ones with the store error", outcomes)
	}
}

// A stack whose outer limiter failed under FailClosed answers 503 with Retry-After: 1,
// with a healthy inner layer.
func TestUnavailableRetryAfterOfTheFailedLimiter(t *testing.T) {
	t.Parallel()
	f := &flaky{next: newMemory(t, newClock())}
	f.down.Store(true)
	outer := mustNew(t, f, []middleware.Rule{{Rule: outerRule, Identity: keyfuncs.Header("X-Client")}},
		middleware.WithBreaker(middleware.Breaker{Disabled: true}))
	inner := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: innerRule, Identity: keyfuncs.Header("X-Client")}})
	rec := do(outer(inner(ok)), "GET", "/", map[string]string{"X-Client": "bob"})
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("%d, Retry-After %q; want 503 with Retry-After 1", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// A layer with headers.None discloses nothing of its rules, also when it is stacked with
// a layer whose style writes metadata and whose rule is reported: the IETF fields list
// the other layers' rules only, whichever order the layers are in, and a refusal's
// violated-policies names no hidden rule (it names policies of RateLimit-Policy); the
// X-RateLimit-* fields describe the other layer's rule.
func TestNoneLayerStaysHiddenWhenStacked(t *testing.T) {
	t.Parallel()
	login := rule("login", 10, 15*time.Minute) // less restrictive: never the reported one here
	api := rule("api", 2, time.Minute)
	for _, style := range []headers.Style{headers.XRateLimit, headers.IETF} {
		x := style == headers.XRateLimit
		for _, order := range []string{"none outer", "none inner"} {
			lim := newMemory(t, newClock())
			hidden := mustNew(t, lim, []middleware.Rule{{Rule: login, Identity: global}}, middleware.WithHeaders(headers.None))
			shown := mustNew(t, lim, []middleware.Rule{{Rule: api, Identity: global}}, middleware.WithHeaders(style))
			h := hidden(shown(ok))
			if order == "none inner" {
				h = shown(hidden(ok))
			}
			for i, want := range []struct {
				code              int
				policy, ratelimit string
			}{
				{200, `"api";q=2;w=60`, `"api";r=1;t=60`},
				{200, `"api";q=2;w=60`, `"api";r=0;t=60`},
				{429, `"api";q=2;w=60`, `"api";r=0;t=60`},
			} {
				rec := do(h, "GET", "/", map[string]string{"Accept": "application/json"})
				if !x && (rec.Code != want.code || rec.Header().Get("RateLimit-Policy") != want.policy || rec.Header().Get("RateLimit") != want.ratelimit) {
					t.Errorf("%s, request %d: %d RateLimit-Policy %q RateLimit %q, want %d %q %q", order, i+1, rec.Code,
						rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), want.code, want.policy, want.ratelimit)
				}
				if x && (rec.Code != want.code || rec.Header().Get("X-RateLimit-Limit") != "2") {
					t.Errorf("%s, request %d: %d X-RateLimit-Limit %q, want %d and the api rule's 2", order, i+1, rec.Code, rec.Header().Get("X-RateLimit-Limit"), want.code)
				}
				if strings.Contains(rec.Body.String(), "login") {
					t.Errorf("%s, request %d: the body names the hidden rule: %s", order, i+1, rec.Body)
				}
			}
		}
	}
}

// When the hidden rule refuses too, the 429 reports the other (its wait is longer) and
// names only it.
func TestNoneLayerRefusingTooStaysHidden(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	hidden := mustNew(t, lim, []middleware.Rule{{Rule: rule("login", 2, time.Minute), Identity: global}}, middleware.WithHeaders(headers.None))
	shown := mustNew(t, lim, []middleware.Rule{{Rule: rule("api", 2, time.Hour), Identity: global}}, middleware.WithHeaders(headers.IETF))
	h := hidden(shown(ok))
	for range 2 {
		do(h, "GET", "/", nil)
	}
	rec := do(h, "GET", "/", map[string]string{"Accept": "application/json"})
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "3600" || rec.Header().Get("RateLimit-Policy") != `"api";q=2;w=3600` {
		t.Errorf("%d Retry-After %q RateLimit-Policy %q, want 429 from api", rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit-Policy"))
	}
	var p struct {
		Policy   string   `json:"policy"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Policy != "api" || len(p.Violated) != 1 || p.Violated[0] != "api" {
		t.Errorf("body %s (%v), want policy api and violated-policies [api]", rec.Body, err)
	}
}
