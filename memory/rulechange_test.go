package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/memory"
)

// TestTokenBucketCapacityChange: a token bucket whose Burst is changed under the same
// name keeps what was spent from it (its deficit), as the Redis limiter does: a raised
// capacity is there at once but for the tokens spent, a lowered one holds at most its
// new capacity, and debt stays within one capacity of the rule deciding. Whether the
// sweep has dropped a bucket that refilled makes no difference: a full bucket is no
// state at all.
func TestTokenBucketCapacityChange(t *testing.T) {
	rule := func(burst int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Burst: burst, Window: time.Hour}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		from, to  int64
		spent     int64         // under the old capacity
		settle    int64         // the spend's actual cost (Reserve, then Settle)
		refill    time.Duration // before the decision under the new capacity
		remaining int64         // after a spend of 1 under the new capacity; -1: refused
		retry     time.Duration
	}{
		{name: "raised", from: 10, to: 100, spent: 1, settle: 1, remaining: 98},
		{name: "raised-after-refill", from: 10, to: 100, spent: 1, settle: 1, refill: 6 * time.Minute, remaining: 99},
		{name: "lowered", from: 100, to: 10, spent: 1, settle: 1, remaining: 8},
		// 100 tokens of debt under Burst 100 are cut to 10 under Burst 10: 11 tokens to
		// refill at 10 per hour before one more.
		{name: "lowered-in-debt", from: 100, to: 10, spent: 1, settle: 200, remaining: -1, retry: 66 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, sweep := range []time.Duration{time.Millisecond, time.Hour} {
				m, clk := newMemory(t, memory.WithSweepInterval(sweep))
				c := ratebudget.Check{Rule: rule(tc.from), Identity: "id", Cost: tc.spent}
				var tk [1]ratebudget.Ticket
				if d, err := m.Reserve(ctx, []ratebudget.Check{c}, tk[:], nil); err != nil || !d.Allowed {
					t.Fatalf("spending %d: %+v, %v", tc.spent, d, err)
				}
				if err := m.Settle(ctx, []ratebudget.Check{c}, tk[:], []int64{tc.settle}); err != nil {
					t.Fatal(err)
				}
				clk.Advance(tc.refill)
				c = ratebudget.Check{Rule: rule(tc.to), Identity: "id", Cost: 1}
				var o [1]ratebudget.Outcome
				d, err := m.AllowEach(ctx, []ratebudget.Check{c}, o[:])
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case tc.remaining < 0 && (d.Allowed || d.RetryAfter != tc.retry || o[0].Remaining < -tc.to):
					t.Errorf("sweep %v: %+v, outcome %+v; want refused with RetryAfter %v and at most %d tokens of debt",
						sweep, d, o[0], tc.retry, tc.to)
				case tc.remaining >= 0 && (!d.Allowed || d.Remaining != tc.remaining):
					t.Errorf("sweep %v: %+v; want admitted with %d remaining", sweep, d, tc.remaining)
				}
			}
		})
	}
}

// TestTokenBucketRateLowered: a token bucket whose Limit is lowered under the same name
// refills at the new rate from the level it had, and is full at the latest when it
// would have been under the rule that last spent from it, as on Redis, where that
// spend's key expires then. Whether the sweep has dropped the bucket by that time makes
// no difference.
func TestTokenBucketRateLowered(t *testing.T) {
	rule := func(limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: limit, Burst: 100, Window: time.Hour}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		after     time.Duration // from the spend of the whole bucket under Limit 100
		remaining int64         // after a spend of 1 under Limit 10
	}{
		{name: "before-the-old-refill", after: 30 * time.Minute, remaining: 4},
		{name: "at-the-old-refill", after: time.Hour, remaining: 99},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, sweep := range []time.Duration{time.Millisecond, 24 * time.Hour} {
				m, clk := newMemory(t, memory.WithSweepInterval(sweep))
				if d, err := m.Allow(ctx, []ratebudget.Check{{Rule: rule(100), Identity: "id", Cost: 100}}); err != nil || !d.Allowed {
					t.Fatalf("emptying the bucket: %+v, %v", d, err)
				}
				clk.Advance(tc.after)
				d, err := m.Allow(ctx, []ratebudget.Check{{Rule: rule(10), Identity: "id", Cost: 1}})
				if err != nil || !d.Allowed || d.Remaining != tc.remaining {
					t.Errorf("sweep %v: %+v, %v; want admitted with %d remaining", sweep, d, err, tc.remaining)
				}
			}
		})
	}
}
