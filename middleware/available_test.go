package middleware_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/middleware"
)

// A token bucket's t (the time until more quota is made available) is the time to its
// next unit, also when a unit takes less than a nanosecond to refill: a byte budget of
// 10 GB per second refills continuously, so the client can spend more at once, not
// after the bucket's whole deficit has refilled.
func TestAvailableFastTokenBucket(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := ratebudget.Rule{Name: "bytes", Algorithm: ratebudget.TokenBucket, Limit: 10_000_000_000, Window: time.Second, Burst: 100_000_000_000}
	h := mustNew(t, newMemory(t, clk), []middleware.Rule{{Rule: r, Identity: global}},
		middleware.WithHeaders(headers.IETF), middleware.WithCost(func(*http.Request) (int64, error) { return 20_000_000_000, nil }))(ok)
	rec := do(h, http.MethodGet, "/", nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	// 2 s to refill the whole deficit; the next byte is there within a millisecond.
	if got, want := rec.Header().Get("RateLimit"), `"bytes";r=80000000000;t=0`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
}
