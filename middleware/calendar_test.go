package middleware_test

import (
	"testing"
	"time"

	_ "time/tzdata" // America/New_York, whatever the machine has installed

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/middleware"
)

// TestCalendarAcrossMidnight: a daily quota in America/New_York on the in-process
// limiter, across the midnight that starts the 25-hour day of 1 November 2026: the
// metadata has no window (RateLimit-Policy without w), Reset and Retry-After count to the
// zone's midnight, and the new day starts whole, its reset 25 hours away. One layer
// writes X-RateLimit-*, another on its own limiter (the same clock, the same requests)
// the IETF fields.
func TestCalendarAcrossMidnight(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	clk := limitertest.NewFakeClock(time.Date(2026, 10, 31, 23, 59, 0, 0, ny))
	daily := ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: 2, Period: ratebudget.Day, Location: ny}
	rules := []middleware.Rule{{Rule: daily, Identity: byHeader("X-Client")}}
	hx := mustNew(t, newMemory(t, clk), rules, middleware.WithHeaders(headers.XRateLimit))(ok)
	hi := mustNew(t, newMemory(t, clk), rules, middleware.WithHeaders(headers.IETF))(ok)
	me := map[string]string{"X-Client": "a"}
	steps := []struct {
		advance                   time.Duration
		code                      int
		rl, reset, retry, remains string
	}{
		{0, 200, `"daily";r=1;t=60`, "60", "", "1"},
		{30 * time.Second, 200, `"daily";r=0;t=30`, "30", "", "0"},
		{0, 429, `"daily";r=0;t=30`, "30", "30", "0"},
		{29500 * time.Millisecond, 429, `"daily";r=0;t=0`, "1", "1", "0"},      // 0.5 s: t rounded down, the others up
		{500 * time.Millisecond, 200, `"daily";r=1;t=90000`, "90000", "", "1"}, // midnight: a day of 25 h
		{0, 200, `"daily";r=0;t=90000`, "90000", "", "0"},
		{time.Hour, 429, `"daily";r=0;t=86400`, "86400", "86400", "0"},
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		recX, recI := do(hx, "GET", "/", me), do(hi, "GET", "/", me)
		x, hd := recX.Header(), recI.Header()
		if recX.Code != s.code || recI.Code != s.code || hd.Get("RateLimit") != s.rl || x.Get("X-RateLimit-Reset") != s.reset ||
			x.Get("Retry-After") != s.retry || hd.Get("Retry-After") != s.retry || x.Get("X-RateLimit-Remaining") != s.remains {
			t.Fatalf("step %d at %v: %d and %d RateLimit %q X-RateLimit-Reset %q Retry-After %q and %q Remaining %q; want %d %q %q %q %q",
				i, clk.Now().In(ny), recX.Code, recI.Code, hd.Get("RateLimit"), x.Get("X-RateLimit-Reset"), x.Get("Retry-After"), hd.Get("Retry-After"),
				x.Get("X-RateLimit-Remaining"), s.code, s.rl, s.reset, s.retry, s.remains)
		}
		if got := hd.Get("RateLimit-Policy"); got != `"daily";q=2` {
			t.Fatalf("step %d: RateLimit-Policy %q, want %q: a period has no fixed window", i, got, `"daily";q=2`)
		}
	}
}
