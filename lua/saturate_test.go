package lua_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// TestLongWaitsSaturate: a token bucket may take up to 2^53 ms to fill, longer than a
// time.Duration holds; such a wait is reported as the longest Duration, never wrapped
// around to a negative or wrong one. Shorter waits stay exact.
func TestLongWaitsSaturate(t *testing.T) {
	l := newLimiter(t, redistest.Start(t).Client(t))
	ctx := context.Background()
	const longest = time.Duration(math.MaxInt64)
	r := ratebudget.Rule{Name: "huge", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: bound.MaxLimit, Window: 8 * time.Second}
	c := ratebudget.Check{Rule: r, Identity: "id", Cost: timerule.Capacity(&r)}
	d, err := l.Allow(ctx, []ratebudget.Check{c})
	if err != nil || !d.Allowed || d.ResetAfter != longest {
		t.Fatalf("the whole capacity: %+v, %v; want admitted with ResetAfter %v", d, err, longest)
	}
	c.Cost = 1
	d, err = l.Allow(ctx, []ratebudget.Check{c})
	if err != nil || d.Allowed || d.ResetAfter != longest || d.RetryAfter <= 0 || d.RetryAfter > r.Window {
		t.Fatalf("one more unit: %+v, %v; want refused, ResetAfter %v, RetryAfter within the window", d, err, longest)
	}
}
