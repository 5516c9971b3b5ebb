package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
)

// TestTokenBucketRateChange: a token bucket whose rule's Limit (its refill rate) is
// changed under the same name, with the same Burst, goes on from the level it had, as
// in the in-process engine: lowering the rate gives no tokens back, raising it refills
// at the new rate from now. The bucket is emptied under one rule and decided at once
// under the other; within the test's few milliseconds neither refills a token.
func TestTokenBucketRateChange(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c)
	rule := func(limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: limit, Burst: 100, Window: time.Hour}
	}
	for _, tc := range []struct {
		name       string
		from, to   int64         // refill per hour before and after the change
		retryAfter time.Duration // for one token after the change: one token at the new rate
	}{
		{"lowered", 100, 10, 6 * time.Minute},
		{"raised", 10, 100, 36 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "client-" + tc.name
			if d, err := l.Allow(ctx, []ratebudget.Check{{Rule: rule(tc.from), Identity: id, Cost: 100}}); err != nil || !d.Allowed {
				t.Fatalf("emptying the bucket: %+v, %v", d, err)
			}
			d, err := l.Allow(ctx, []ratebudget.Check{{Rule: rule(tc.to), Identity: id, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || d.Remaining != 0 {
				t.Fatalf("empty bucket under the new rate: %+v, want refused with nothing remaining", d)
			}
			if d.RetryAfter > tc.retryAfter || d.RetryAfter < tc.retryAfter-time.Second {
				t.Fatalf("RetryAfter %v, want about %v (one token at the new rate)", d.RetryAfter, tc.retryAfter)
			}
			if p := c.PTTL(ctx, l.Key(ratebudget.Check{Rule: rule(tc.to), Identity: id})).Val(); p > time.Hour*100/time.Duration(tc.from) {
				t.Fatalf("PTTL %v, longer than the old rule's time to refill", p)
			}
		})
	}
}
