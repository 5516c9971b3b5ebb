package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// Plans per tenant: one rule whose limit comes from the tenant's plan, looked up by its
// API key, beside a per-IP rule for everyone. A tenant on no plan (or an unknown key)
// gets the rule's own limit. A refusal by the plan spends nothing of the per-IP budget,
// and the plan's name is sent in RateLimit-Policy.
func ExamplePlan() {
	planOf := map[string]string{"demo-free": "free", "demo-pro": "pro", "ops": "internal"} // e.g. loaded from a database
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim, _ := memory.New(memory.WithClock(func() time.Time { return now })) // a clock that stands still, for the output
	byIP, err := keyfuncs.ClientIP()
	if err != nil {
		panic(err)
	}
	limit, err := middleware.New(lim, []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "per-ip", Limit: 100, Window: time.Minute}, Identity: byIP},
		{
			Rule:     ratebudget.Rule{Name: "api", Limit: 2, Window: time.Minute}, // a key on no plan
			Identity: keyfuncs.Header("X-Api-Key"),
			Plans: []middleware.Plan{
				{Name: "free", Limit: 3},
				{Name: "pro", Limit: 100},
				{Name: "internal", Unlimited: true},
			},
			Plan: func(r *http.Request) (string, error) { return planOf[r.Header.Get("X-Api-Key")], nil },
		},
	}, middleware.WithHeaders(headers.IETF))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func(key string) {
		req := httptest.NewRequest("GET", "/api/hello", nil)
		req.Header.Set("X-Api-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%-9s %d %s\n", key, rec.Code, rec.Header().Get("RateLimit"))
	}
	for range 4 {
		get("demo-free")
	}
	get("demo-pro")
	get("ops")
	fmt.Println(func() string {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Api-Key", "demo-pro")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Header().Get("RateLimit-Policy")
	}())
	// Output:
	// demo-free 200 "per-ip";r=99;t=60, "api";r=2;t=60
	// demo-free 200 "per-ip";r=98;t=60, "api";r=1;t=60
	// demo-free 200 "per-ip";r=97;t=60, "api";r=0;t=60
	// demo-free 429 "per-ip";r=97;t=60, "api";r=0;t=60
	// demo-pro  200 "per-ip";r=96;t=60, "api";r=99;t=60
	// ops       200 "per-ip";r=95;t=60
	// "per-ip";q=100;w=60, "api";q=100;w=60;ratebudget-plan="pro"
}
