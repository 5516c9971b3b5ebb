package middleware_test

import (
	"net/http"
	"testing"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/middleware"
)

// Two failed limiters, one under FailOpen and one under LocalFallback, and a healthy
// one: an admission lets the FailOpen layer's rules go unenforced, so the event is
// Degraded (FailOpen: "events report Degraded so the lost protection is
// visible"), without metadata, with Fallback set for the local decision; as it is with
// the FailOpen failure alone. Either order of the failed layers.
func TestStackedFailOpenAndLocalFallbackIsDegraded(t *testing.T) {
	t.Parallel()
	rules := []ratebudget.Rule{ruleA, ruleB, ruleC}
	for _, policies := range [][]string{{"open", "local", ""}, {"local", "open", ""}, {"", "open", "local"}} {
		t.Run(policies[0]+"-"+policies[1]+"-"+policies[2], func(t *testing.T) {
			t.Parallel()
			evs := make([]events, 3)
			var mws []func(http.Handler) http.Handler
			for i, r := range rules {
				var lim ratebudget.Limiter = newMemory(t, newClock())
				opts := []middleware.Option{middleware.WithHeaders(headers.IETF), middleware.WithObserver(evs[i].observe)}
				if policies[i] != "" {
					f := &flaky{next: lim}
					f.down.Store(true)
					lim = f
					opts = append(opts, policyOpt(policies[i]), middleware.WithBreaker(middleware.Breaker{Disabled: true}))
				}
				mws = append(mws, mustNew(t, lim, []middleware.Rule{{Rule: r, Identity: keyfuncs.Header("X-Client")}}, opts...))
			}
			served := 0
			h := mws[0](mws[1](mws[2](http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))))
			rec := do(h, "GET", "/", map[string]string{"X-Client": "alice"})
			if rec.Code != 200 || served != 1 {
				t.Fatalf("status %d, handler ran %d times; want 200 and once", rec.Code, served)
			}
			for i := range evs {
				_, all := evs[i].take()
				if len(all) != 1 {
					t.Fatalf("layer %s saw %d events, want 1", rules[i].Name, len(all))
				}
				ev := all[0]
				if ev.Result != middleware.Degraded || !ev.Fallback || ev.Err == nil || ev.Decision != (ratebudget.Decision{}) {
					t.Errorf("layer %s saw outcome %v fallback %v err %v decision %+v; want degraded, fallback, the store error, no decision",
						rules[i].Name, ev.Result, ev.Fallback, ev.Err, ev.Decision)
				}
			}
			if got := rec.Header().Get("RateLimit") + rec.Header().Get("RateLimit-Policy"); got != "" {
				t.Errorf("metadata %q on a degraded admission, want none", got)
			}
		})
	}
}
