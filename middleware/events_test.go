package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// TestEventsPerRequestKind sends one request of each kind through one layer, two stacked
// layers (one decision) and two layers with another handler between them (two
// decisions), and checks the events every layer's observers see: one per decision, with
// the outcome of the answer, then one per failed settle.
func TestEventsPerRequestKind(t *testing.T) {
	t.Parallel()
	const (
		allowed     = middleware.Allowed
		denied      = middleware.Denied
		exceeded    = middleware.Exceeded
		degraded    = middleware.Degraded
		unavailable = middleware.Unavailable
		invalid     = middleware.Invalid
		canceled    = middleware.Canceled
		settle      = middleware.SettleFailed
	)
	type want struct {
		code         int
		outer, inner []middleware.Result
		// rule is the rule the outer layer's decision event reports ("" for none).
		rule string
	}
	type kind struct {
		name string
		// store: "ok", "down" (fails), "settle" (settles fail).
		store  string
		policy string // "closed" (the default), "open" or "local"
		// outerRule and innerRule are the layers' rules; a zero innerRule means one layer.
		outerRule, innerRule    middleware.Rule
		innerCost               int64 // the inner layer's cost (WithCost), 0 for the default
		path                    string
		hdr                     map[string]string
		before                  int  // requests sent first, whose events are not checked
		cancel                  bool // the request's context has ended
		alone, stacked, between want
	}
	client := byHeader("X-Client")
	alice := map[string]string{"X-Client": "alice"}
	r5 := middleware.Rule{Rule: rule("outer", 5, time.Minute), Identity: client}
	r1 := middleware.Rule{Rule: rule("inner", 1, time.Minute), Identity: client}
	same := middleware.Rule{Rule: rule("outer", 5, time.Minute), Identity: client}  // a second rule "outer"
	other := middleware.Rule{Rule: rule("outer", 3, time.Minute), Identity: client} // "outer" of another limit
	shadow := r1
	shadow.Shadow = true
	settling := r1
	settling.Counts = middleware.CountSuccesses(nil)
	all := func(o ...middleware.Result) []middleware.Result { return o }
	for _, k := range []kind{
		{name: "allowed", store: "ok", outerRule: r5, innerRule: r1, path: "/", hdr: alice,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{200, all(allowed), all(allowed), "inner"},
			between: want{200, all(allowed), all(allowed), "outer"}},
		{name: "denied", store: "ok", outerRule: r5, innerRule: r1, path: "/", hdr: alice, before: 1,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{429, all(denied), all(denied), "inner"},
			between: want{429, all(allowed), all(denied), "outer"}},
		{name: "handler 500", store: "ok", outerRule: r5, innerRule: r1, path: "/fail", hdr: alice,
			alone:   want{500, all(allowed), nil, "outer"},
			stacked: want{500, all(allowed), all(allowed), "inner"},
			between: want{500, all(allowed), all(allowed), "outer"}},
		{name: "invalid at the outer layer", store: "ok", outerRule: r5, innerRule: r1, path: "/",
			alone:   want{400, all(invalid), nil, ""},
			stacked: want{400, all(invalid), nil, ""},
			between: want{400, all(invalid), nil, ""}},
		{name: "invalid at the inner layer", store: "ok", outerRule: r5,
			innerRule: middleware.Rule{Rule: rule("inner", 1, time.Minute), Identity: byHeader("X-Account")}, path: "/", hdr: alice,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{400, all(invalid), all(invalid), ""},
			between: want{400, all(allowed), all(invalid), "outer"}},
		{name: "exceeded", store: "ok", outerRule: r5, innerRule: r1, innerCost: 2, path: "/", hdr: alice,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{413, all(exceeded), all(exceeded), "inner"},
			between: want{413, all(allowed), all(exceeded), "outer"}},
		{name: "unavailable", store: "down", policy: "closed", outerRule: r5, innerRule: r1, path: "/", hdr: alice,
			alone:   want{503, all(unavailable), nil, ""},
			stacked: want{503, all(unavailable), all(unavailable), ""},
			between: want{503, all(unavailable), nil, ""}},
		{name: "degraded", store: "down", policy: "open", outerRule: r5, innerRule: r1, path: "/", hdr: alice,
			alone:   want{200, all(degraded), nil, ""},
			stacked: want{200, all(degraded), all(degraded), ""},
			between: want{200, all(degraded), all(degraded), ""}},
		{name: "local fallback refuses", store: "down", policy: "local", outerRule: r5, innerRule: r1, path: "/", hdr: alice, before: 1,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{429, all(denied), all(denied), "inner"},
			between: want{429, all(allowed), all(denied), "outer"}},
		{name: "canceled", store: "ok", outerRule: r5, innerRule: r1, path: "/", hdr: alice, cancel: true,
			alone:   want{200, all(canceled), nil, ""},
			stacked: want{200, all(canceled), nil, ""}, // the inner layer never runs
			between: want{200, all(canceled), nil, ""}},
		{name: "shadow refusal", store: "ok", outerRule: r5, innerRule: shadow, path: "/", hdr: alice, before: 1,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{200, all(allowed), all(allowed), "outer"},
			between: want{200, all(allowed), all(allowed), "outer"}},
		{name: "rules of one name", store: "ok", outerRule: r5, innerRule: same, path: "/", hdr: alice,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{200, all(allowed), all(allowed), "outer"}, // one budget, decided once
			between: want{200, all(allowed), all(allowed), "outer"}},
		{name: "rules of one name defined differently", store: "ok", outerRule: r5, innerRule: other, path: "/", hdr: alice,
			alone:   want{200, all(allowed), nil, "outer"},
			stacked: want{500, all(invalid), all(invalid), ""},
			between: want{200, all(allowed), all(allowed), "outer"}},
		{name: "settle failed", store: "settle", outerRule: r5, innerRule: settling, path: "/fail", hdr: alice,
			alone:   want{500, all(allowed), nil, "outer"},
			stacked: want{500, all(allowed, settle), all(allowed, settle), "inner"},
			between: want{500, all(allowed), all(allowed, settle), "outer"}},
	} {
		for _, shape := range []string{"alone", "stacked", "between"} {
			t.Run(k.name+"/"+shape, func(t *testing.T) {
				t.Parallel()
				w := map[string]want{"alone": k.alone, "stacked": k.stacked, "between": k.between}[shape]
				mem := newMemory(t, newClock())
				var lim ratebudget.Limiter = mem
				switch k.store {
				case "down":
					f := &flaky{next: mem}
					f.down.Store(true)
					lim = f
				case "settle":
					f := &failingSettler{Limiter: mem}
					f.failSettle.Store(true)
					lim = f
				}
				opts := []middleware.Option{middleware.WithBreaker(middleware.Breaker{Disabled: true})}
				switch k.policy {
				case "open":
					opts = append(opts, middleware.WithFailOpen())
				case "local":
					opts = append(opts, middleware.WithLocalFallback(1))
				}
				var outerEvs, innerEvs events
				handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/fail" {
						w.WriteHeader(http.StatusInternalServerError)
					}
				})
				outer := mustNew(t, lim, []middleware.Rule{k.outerRule}, append(opts, middleware.WithObserver(outerEvs.observe))...)
				var h http.Handler
				switch shape {
				case "alone":
					h = outer(handler)
				default:
					innerOpts := append(opts, middleware.WithObserver(innerEvs.observe))
					if k.innerCost > 0 {
						innerOpts = append(innerOpts, middleware.WithCost(func(*http.Request) (int64, error) { return k.innerCost, nil }))
					}
					inner := mustNew(t, lim, []middleware.Rule{k.innerRule}, innerOpts...)(handler)
					if shape == "between" {
						h = outer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { inner.ServeHTTP(w, r) }))
					} else {
						h = outer(inner)
					}
				}
				for i := range k.before {
					if rec := do(h, "GET", "/", k.hdr); rec.Code >= 500 {
						t.Fatalf("request %d before: %d", i, rec.Code)
					}
				}
				outerEvs.take()
				innerEvs.take()
				req := httptest.NewRequest("GET", k.path, nil)
				for name, v := range k.hdr {
					req.Header.Set(name, v)
				}
				if k.cancel {
					ctx, cancel := context.WithCancel(req.Context())
					cancel()
					req = req.WithContext(ctx)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != w.code {
					t.Fatalf("status %d %s, want %d", rec.Code, rec.Body, w.code)
				}
				outs, evs := outerEvs.take()
				if !slices.Equal(outs, w.outer) {
					t.Errorf("outer layer saw %v, want %v", outs, w.outer)
				}
				if len(evs) > 0 && evs[0].Decision.Rule != w.rule {
					t.Errorf("outer layer's event reports rule %q, want %q", evs[0].Decision.Rule, w.rule)
				}
				if outs, _ := innerEvs.take(); !slices.Equal(outs, w.inner) {
					t.Errorf("inner layer saw %v, want %v", outs, w.inner)
				}
				for i, ev := range evs {
					if ev.Request == nil || ev.Request.URL.Path != k.path {
						t.Errorf("event %d (%v) without the request", i, ev.Result)
					}
				}
				if shape == "stacked" && k.name == "shadow refusal" {
					if !(evs[0].Shadow.Rule != "" && !evs[0].Shadow.Allowed) || evs[0].Shadow.Rule != "inner" {
						t.Errorf("shadow decision %+v, want the inner shadow rule's refusal", evs[0].Shadow)
					}
				}
			})
		}
	}
}

// A failed settle is an event for the observers of every layer of the request, as its
// decision is: also when the layer whose reservation failed to settle is on another
// limiter than the outer layer, or holds the request's shadow rules. An observer given
// to the outermost layer alone sees every failure.
func TestSettleFailureSeenByEveryLayer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		sameLimiter  bool
		innerShadows bool
	}{
		{"inner layer on another limiter", false, false},
		{"inner layer's shadow rule", true, true},
		{"inner layer's shadow rule on another limiter", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			settler := &failingSettler{Limiter: newMemory(t, newClock())}
			settler.failSettle.Store(true)
			var outerLim ratebudget.Limiter = settler
			if !tc.sameLimiter {
				outerLim = newMemory(t, newClock())
			}
			inner := middleware.Rule{Rule: rule("inner", 5, time.Minute), Identity: global, Counts: middleware.CountSuccesses(nil), Shadow: tc.innerShadows}
			var outerEvs, innerEvs events
			outer := mustNew(t, outerLim, []middleware.Rule{{Rule: rule("outer", 5, time.Minute), Identity: global}}, middleware.WithObserver(outerEvs.observe))
			in := mustNew(t, settler, []middleware.Rule{inner}, middleware.WithObserver(innerEvs.observe))
			h := outer(in(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })))
			if rec := do(h, "GET", "/", nil); rec.Code != 500 {
				t.Fatalf("%d, want the handler's 500", rec.Code)
			}
			want := []middleware.Result{middleware.Allowed, middleware.SettleFailed}
			for name, e := range map[string]*events{"outer": &outerEvs, "inner": &innerEvs} {
				if outs, _ := e.take(); !slices.Equal(outs, want) {
					t.Errorf("%s layer saw %v, want %v", name, outs, want)
				}
			}
		})
	}
}
