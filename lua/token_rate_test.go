package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
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

// TestTokenBucketCapacityChange: a token bucket whose Burst is changed under the same
// name keeps its deficit, on Redis as in the in-process engine: steps alternate between
// two capacities, with spends, settles above and below their reservations (debt) and
// refills between them, and every outcome, as Memory reports it, is Redis's. The debt
// of a lowered capacity is cut at one of its capacities, also when it is given back.
func TestTokenBucketCapacityChange(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := ratebudget.NewMemory(ratebudget.WithClock(clock.Now), ratebudget.WithSweepInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(burst int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Burst: burst, Window: time.Hour}
	}
	small, big := rule(10), rule(100)
	type reservation struct {
		check    ratebudget.Check
		mem, lua [1]ratebudget.Ticket
	}
	// Each step is one call on both limiters: a decision (cost c under rule r), a
	// reservation kept under a name, or the settle of a reservation at a cost.
	type step struct {
		r      ratebudget.Rule
		cost   int64
		hold   string // reserve, and keep the tickets under this name
		settle string // settle the reservation of this name at cost
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"raised", []step{{r: small, cost: 1}, {r: big, cost: 1}, {r: big, cost: 1}, {r: small, cost: 1}}},
		{"lowered", []step{{r: big, cost: 1}, {r: small, cost: 1}, {r: big, cost: 95}, {r: small, cost: 1}, {r: big, cost: 1}}},
		{"debt-under-the-larger", []step{{r: big, cost: 1, hold: "a"}, {settle: "a", cost: 300}, {r: small, cost: 1}, {r: big, cost: 1}}},
		{"debt-given-back-under-the-smaller", []step{
			{r: small, cost: 5, hold: "b"}, {r: big, cost: 1, hold: "a"}, {settle: "a", cost: 300},
			{settle: "b", cost: 0}, {r: small, cost: 1}, {r: big, cost: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "client-" + tc.name
			held := map[string]*reservation{}
			for i, s := range tc.steps {
				if s.settle != "" {
					h := held[s.settle]
					if err := mem.Settle(ctx, []ratebudget.Check{h.check}, h.mem[:], []int64{s.cost}); err != nil {
						t.Fatal(err)
					}
					if err := l.Settle(ctx, []ratebudget.Check{h.check}, h.lua[:], []int64{s.cost}); err != nil {
						t.Fatal(err)
					}
					continue
				}
				ch := []ratebudget.Check{{Rule: s.r, Identity: id, Cost: s.cost}}
				var om, ol [1]ratebudget.Outcome
				if s.hold != "" {
					h := &reservation{check: ch[0]}
					held[s.hold] = h
					if _, err := mem.Reserve(ctx, ch, h.mem[:], om[:]); err != nil {
						t.Fatal(err)
					}
					if _, err := l.Reserve(ctx, ch, h.lua[:], ol[:]); err != nil {
						t.Fatal(err)
					}
				} else {
					if _, err := mem.AllowEach(ctx, ch, om[:]); err != nil {
						t.Fatal(err)
					}
					if _, err := l.AllowEach(ctx, ch, ol[:]); err != nil {
						t.Fatal(err)
					}
				}
				// Redis's clock moves a few ms while the test runs, a token takes 6
				// minutes: waits may differ by those ms, and a level below zero, whose
				// whole tokens are rounded toward zero, may read one token higher.
				got, want := ol[0], om[0]
				top := want.Remaining // Redis's Remaining may be want's to top
				if want.Remaining < 0 {
					top = min(want.Remaining+1, 0)
				}
				if got.Allowed != want.Allowed || got.Remaining < want.Remaining || got.Remaining > top ||
					(got.RetryAfter-want.RetryAfter).Abs() > time.Second || (got.ResetAfter-want.ResetAfter).Abs() > time.Second {
					t.Fatalf("step %d (cost %d, Burst %d): Redis %+v, Memory %+v", i, s.cost, s.r.Burst, got, want)
				}
				if want.Remaining < -s.r.Capacity() {
					t.Fatalf("step %d: Memory's debt %d beyond one capacity (%d)", i, -want.Remaining, s.r.Capacity())
				}
			}
		})
	}
}

// TestTokenBucketRateLoweredFullAtOldRefill: a token bucket whose Limit is lowered under
// the same name is full again once the rule that last spent from it would have refilled
// it (its key expires then), also when it was refused since; Memory reports the same.
func TestTokenBucketRateLoweredFullAtOldRefill(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := ratebudget.NewMemory(ratebudget.WithClock(clock.Now), ratebudget.WithSweepInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// 100 tokens refill in 200ms under Limit 100, in 2s under Limit 10.
	rule := func(limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: limit, Burst: 100, Window: 200 * time.Millisecond}
	}
	for _, lim := range []ratebudget.Limiter{l, mem} {
		if d, err := lim.Allow(ctx, []ratebudget.Check{{Rule: rule(100), Identity: "id", Cost: 100}}); err != nil || !d.Allowed {
			t.Fatalf("emptying the bucket: %+v, %v", d, err)
		}
		if d, err := lim.Allow(ctx, []ratebudget.Check{{Rule: rule(10), Identity: "id", Cost: 50}}); err != nil || d.Allowed {
			t.Fatalf("50 tokens of an empty bucket: %+v, %v", d, err)
		}
	}
	key := l.Key(ratebudget.Check{Rule: rule(10), Identity: "id"})
	for deadline := time.Now().Add(10 * time.Second); c.Exists(ctx, key).Val() == 1; {
		if time.Now().After(deadline) {
			t.Fatalf("key %s still there, PTTL %v", key, c.PTTL(ctx, key).Val())
		}
		time.Sleep(5 * time.Millisecond)
	}
	clock.Advance(200 * time.Millisecond)
	for _, lim := range []ratebudget.Limiter{l, mem} {
		d, err := lim.Allow(ctx, []ratebudget.Check{{Rule: rule(10), Identity: "id", Cost: 1}})
		if err != nil || !d.Allowed || d.Remaining != 99 {
			t.Errorf("%T: %+v, %v; want admitted from a full bucket, 99 remaining", lim, d, err)
		}
	}
}
