package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// TestPoliciesOnAReplica: a limiter pointed at a Redis that answers READONLY (a demoted
// primary) gets a certain server error for every admission, and each policy answers
// as it does for any store error: 503 with Retry-After and no-store, the handler's
// 200 marked degraded, or the local budget. A request for a budget already spent is
// still refused with 429 by Redis: a refusal writes nothing, so a replica can decide it.
func TestPoliciesOnAReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	control := srv.Client(t)
	lim, err := lua.New(srv.Client(t), lua.WithPrefix("replica"), lua.WithRefusalCache(0))
	if err != nil {
		t.Fatal(err)
	}
	spentRule := middleware.Rule{Rule: rule("spent", 1, time.Hour), Identity: global}
	spent := mustNew(t, lim, []middleware.Rule{spentRule}, middleware.WithTimeout(time.Minute))(ok)
	if c := do(spent, "GET", "/", nil).Code; c != 200 {
		t.Fatalf("first request: %d", c)
	}
	if err := control.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		opt     middleware.Option
		codes   []int
		outcome middleware.Result
	}{
		{"closed", failClosed, []int{503, 503}, middleware.Unavailable},
		{"open", middleware.WithFailOpen(), []int{200, 200}, middleware.Degraded},
		// 4 / 2 replicas = 2 per process.
		{"local", middleware.WithLocalFallback(2), []int{200, 200, 429}, ""}, // outcome not checked: a fallback decision
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen events
			h := mustNew(t, lim, []middleware.Rule{{Rule: rule("r-"+tc.name, 4, time.Minute), Identity: global}}, tc.opt,
				middleware.WithTimeout(time.Minute), middleware.WithObserver(seen.observe),
				middleware.WithBreaker(middleware.Breaker{Disabled: true}))(ok)
			for i, want := range tc.codes {
				rec := do(h, "GET", "/", nil)
				if rec.Code != want {
					t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
				}
				if rec.Code >= 400 && (rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("Retry-After") == "") {
					t.Errorf("request %d: %d without no-store or Retry-After: %v", i, rec.Code, rec.Header())
				}
				if strings.Contains(rec.Body.String(), "READONLY") {
					t.Errorf("request %d: the body leaks the store error: %q", i, rec.Body.String())
				}
			}
			_, evs := seen.take()
			for i, e := range evs {
				var se *ratebudget.StoreError
				if !errors.As(e.Err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain || !strings.HasPrefix(se.Err.Error(), "READONLY") {
					t.Errorf("event %d: %v, want a certain READONLY server error", i, e.Err)
				}
				if tc.name != "local" && e.Result != tc.outcome {
					t.Errorf("event %d: outcome %v, want %v", i, e.Result, tc.outcome)
				}
				if tc.name == "local" && !e.Fallback {
					t.Errorf("event %d: not a fallback decision", i)
				}
			}
		})
	}
	rec := do(spent, "GET", "/", nil)
	if rec.Code != 429 || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a spent budget on the replica: %d %v, want 429 with Retry-After", rec.Code, rec.Header())
	}
}
