package lua_test

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
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
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(burst int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Burst: burst, Window: time.Hour}
	}
	small, big := rule(10), rule(100)
	for _, tc := range []struct {
		name  string
		steps []tokenStep
	}{
		{"raised", []tokenStep{{r: small, cost: 1}, {r: big, cost: 1}, {r: big, cost: 1}, {r: small, cost: 1}}},
		{"lowered", []tokenStep{{r: big, cost: 1}, {r: small, cost: 1}, {r: big, cost: 95}, {r: small, cost: 1}, {r: big, cost: 1}}},
		{"debt-under-the-larger", []tokenStep{{r: big, cost: 1, hold: "a"}, {settle: "a", cost: 300}, {r: small, cost: 1}, {r: big, cost: 1}}},
		{"debt-given-back-under-the-smaller", []tokenStep{
			{r: small, cost: 5, hold: "b"}, {r: big, cost: 1, hold: "a"}, {settle: "a", cost: 300},
			{settle: "b", cost: 0}, {r: small, cost: 1}, {r: big, cost: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) { runTokenSteps(t, mem, l, "client-"+tc.name, tc.steps) })
	}
}

// tokenStep is one call on both limiters: a decision (cost under r), a reservation kept
// under a name, or the settle of a reservation at a cost.
type tokenStep struct {
	r      ratebudget.Rule
	cost   int64
	hold   string // reserve, and keep the tickets under this name
	settle string // settle the reservation of this name at cost
	want   *int64 // the Remaining both limiters must report (nil: any, as long as they agree)
}

// runTokenSteps runs steps on mem (whose clock is stopped) and on l for identity id, and
// fails at the first step whose outcome on Redis is not Memory's.
func runTokenSteps(t *testing.T, mem *memory.Limiter, l *lua.Limiter, id string, steps []tokenStep) {
	t.Helper()
	ctx := context.Background()
	type reservation struct {
		check    ratebudget.Check
		mem, lua [1]ratebudget.Ticket
	}
	held := map[string]*reservation{}
	for i, s := range steps {
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
		// Redis's clock moves a few ms while the test runs, a token takes at least 36
		// seconds: waits may differ by those ms, and a level below zero, whose whole
		// tokens are rounded toward zero, may read one token higher.
		got, want := ol[0], om[0]
		top := want.Remaining // Redis's Remaining may be want's to top
		if want.Remaining < 0 {
			top = min(want.Remaining+1, 0)
		}
		if got.Allowed != want.Allowed || got.Remaining < want.Remaining || got.Remaining > top ||
			(got.RetryAfter-want.RetryAfter).Abs() > time.Second || (got.ResetAfter-want.ResetAfter).Abs() > time.Second {
			t.Fatalf("step %d (cost %d, Limit %d, Burst %d, Window %v): Redis %+v, Memory %+v", i, s.cost, s.r.Limit, s.r.Burst, s.r.Window, got, want)
		}
		if s.want != nil && want.Remaining != *s.want {
			t.Fatalf("step %d (cost %d, Limit %d, Burst %d, Window %v): Remaining %d on both, want %d", i, s.cost, s.r.Limit, s.r.Burst, s.r.Window, want.Remaining, *s.want)
		}
		if want.Remaining < -timerule.Capacity(&s.r) {
			t.Fatalf("step %d: Memory's debt %d beyond one capacity (%d)", i, -want.Remaining, timerule.Capacity(&s.r))
		}
	}
}

func left(n int64) *int64 { return &n }

// TestTokenBucketWindowChange: a token bucket whose rule's Window is changed under the
// same name keeps its deficit in tokens, on Redis as in the in-process engine, and
// refills at the new rate from the level it had: 2 tokens spent under 100 a day are 2
// tokens spent under 100 an hour, 50 spent under 100 an hour are 50 under 100 a day.
// Steps alternate between the windows, with settles above (debt) and below their
// reservations; every outcome, as Memory reports it, is Redis's, and where a step names
// its Remaining both report it.
func TestTokenBucketWindowChange(t *testing.T) {
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(limit, burst int64, w time.Duration) ratebudget.Rule {
		return ratebudget.Rule{Name: "tbw", Algorithm: ratebudget.TokenBucket, Limit: limit, Burst: burst, Window: w}
	}
	hour, day := rule(100, 0, time.Hour), rule(100, 0, 24*time.Hour)
	// Odd windows, whose units convert with a remainder: 7 tokens refill in 61 minutes
	// and in 59 minutes and 59.999 seconds, a token every 8m43s or so.
	odd1, odd2 := rule(7, 50, 61*time.Minute), rule(7, 50, time.Hour-time.Millisecond)
	bigDay := rule(100, 1000, 24*time.Hour)
	for _, tc := range []struct {
		name  string
		steps []tokenStep
	}{
		{"shortened", []tokenStep{{r: day, cost: 2, want: left(98)}, {r: hour, cost: 1, want: left(97)}, {r: day, cost: 1, want: left(96)}}},
		{"lengthened", []tokenStep{{r: hour, cost: 50, want: left(50)}, {r: day, cost: 1, want: left(49)}, {r: hour, cost: 1, want: left(48)}}},
		{"emptied", []tokenStep{{r: hour, cost: 100, want: left(0)}, {r: day, cost: 1, want: left(0)}, {r: hour, cost: 1, want: left(0)}}},
		{"debt", []tokenStep{
			{r: hour, cost: 1, hold: "a"}, {settle: "a", cost: 300},
			{r: day, cost: 1, want: left(-100)}, {r: hour, cost: 1, want: left(-100)}}},
		{"given-back-under-the-other", []tokenStep{
			{r: day, cost: 5, hold: "b", want: left(95)}, {r: hour, cost: 1, want: left(94)},
			{settle: "b", cost: 0}, {r: hour, cost: 1, want: left(98)}, {r: day, cost: 1, want: left(97)}}},
		{"odd-windows", []tokenStep{
			{r: odd1, cost: 3, want: left(47)}, {r: odd2, cost: 3, want: left(44)}, {r: odd1, cost: 40, want: left(4)},
			{r: odd2, cost: 4, want: left(0)}, {r: odd1, cost: 1}, {r: odd2, cost: 1}}},
		// settle.lua's copy of the conversion: given back under the other odd window.
		{"odd-windows-given-back", []tokenStep{
			{r: odd1, cost: 10, hold: "a", want: left(40)}, {r: odd2, cost: 3, want: left(37)},
			{settle: "a", cost: 2}, {r: odd2, cost: 1, want: left(44)}, {r: odd2, cost: 4, hold: "b", want: left(40)},
			{r: odd1, cost: 1, want: left(39)}, {settle: "b", cost: 0}, {r: odd1, cost: 1, want: left(42)},
			{r: odd2, cost: 1, hold: "c"}, {settle: "c", cost: 120}, {r: odd1, cost: 1}, {r: odd2, cost: 1}}},
		{"capacity-and-window", []tokenStep{{r: bigDay, cost: 900, want: left(100)}, {r: hour, cost: 1, want: left(-100)}, {r: bigDay, cost: 1, want: left(99)}}},
	} {
		t.Run(tc.name, func(t *testing.T) { runTokenSteps(t, mem, l, "client-"+tc.name, tc.steps) })
	}
}

// TestTokenBucketWindowConversion: allow.lua converts a deficit written under another
// window exactly as engine.go does (TestConvertDeficit checks it against math/big):
// d x window / written window, rounded up, at most 2^53, including remainders whose
// product with the window is far beyond 2^53. A bucket without a TTL counts as written
// now, so nothing refills; at a rate of 1 unit per ms its reset is its deficit in ms.
func TestTokenBucketWindowConversion(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	const maxW, maxScaled = int64(366 * 24 * 3600 * 1000), int64(1) << 53
	rng := rand.New(rand.NewPCG(3, 4))
	type conv struct{ d, from, to int64 }
	cases := []conv{{1, maxW, maxW - 1}, {maxW - 1, maxW, maxW - 1}, {1 << 43, maxW - 1, maxW}, {maxScaled, maxW, 1}, {7, 3, 2}}
	for range 2000 {
		from, to := 1+rng.Int64N(maxW), 1+rng.Int64N(maxW)
		if rng.IntN(2) == 0 {
			to = 1 + rng.Int64N(min(1<<rng.IntN(36), maxW))
		}
		// A converted deficit below 2^43 ms, so that the reset is no saturated Duration.
		top := new(big.Int).Div(new(big.Int).Mul(big.NewInt(1<<43), big.NewInt(from)), big.NewInt(to))
		if top.Cmp(big.NewInt(maxScaled)) > 0 {
			top = big.NewInt(maxScaled)
		}
		cases = append(cases, conv{1 + rng.Int64N(top.Int64()), from, to})
	}
	for _, cv := range cases {
		capacity := min(bound.MaxLimit-1, maxScaled/cv.to) // a cost of capacity + 1 is exceeded
		r := ratebudget.Rule{Name: "tbc", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: capacity, Window: time.Duration(cv.to) * time.Millisecond}
		ch := []ratebudget.Check{{Rule: r, Identity: "x", Cost: capacity + 1}}
		key := l.Key(ch[0])
		if err := c.Set(ctx, key, fmt.Sprintf("%d:1:%d", cv.d, cv.from), 0).Err(); err != nil {
			t.Fatal(err)
		}
		var o [1]ratebudget.Outcome
		if _, err := l.AllowEach(ctx, ch, o[:]); err != nil {
			t.Fatal(err)
		}
		n := new(big.Int).Mul(big.NewInt(cv.d), big.NewInt(cv.to))
		q, rem := new(big.Int).QuoRem(n, big.NewInt(cv.from), new(big.Int))
		if rem.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		want := min(maxScaled, 2*capacity*cv.to)
		if q.Cmp(big.NewInt(want)) < 0 {
			want = q.Int64()
		}
		if o[0].ResetAfter != time.Duration(want)*time.Millisecond {
			t.Fatalf("deficit %d written under %dms, read under %dms: reset %v, want %dms", cv.d, cv.from, cv.to, o[0].ResetAfter, want)
		}
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
	mem, err := memory.New(memory.WithClock(clock.Now))
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

// After a lowered rate, a refusal's RetryAfter and ResetAfter end at the latest when the
// bucket is full under the rule that last spent from it (its key expires then): the
// same on Redis and in process. Emptied under 100 an hour (full again in 1h), 50 tokens
// under 10 an hour would take 5h: the wait is the hour.
func TestTokenBucketRateLoweredRetryAtOldRefill(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "tb-retry", Algorithm: ratebudget.TokenBucket, Limit: limit, Burst: 100, Window: time.Hour}
	}
	for _, lim := range []ratebudget.Limiter{l, mem} {
		if d, err := lim.Allow(ctx, []ratebudget.Check{{Rule: rule(100), Identity: "id", Cost: 100}}); err != nil || !d.Allowed {
			t.Fatalf("%T emptying the bucket: %+v, %v", lim, d, err)
		}
		d, err := lim.Allow(ctx, []ratebudget.Check{{Rule: rule(10), Identity: "id", Cost: 50}})
		if err != nil || d.Allowed {
			t.Fatalf("%T: 50 tokens of an empty bucket: %+v, %v", lim, d, err)
		}
		// The server's clock runs on: within a minute of the hour.
		if d.RetryAfter > time.Hour || d.RetryAfter < 59*time.Minute || d.ResetAfter != d.RetryAfter {
			t.Errorf("%T: RetryAfter %v ResetAfter %v, want both the hour until the bucket is full under the old rate (not 5h)", lim, d.RetryAfter, d.ResetAfter)
		}
		// A wait shorter than that is unchanged: 1 token at 10 an hour.
		if d, err := lim.Allow(ctx, []ratebudget.Check{{Rule: rule(10), Identity: "id", Cost: 1}}); err != nil || d.Allowed || d.RetryAfter > 6*time.Minute || d.RetryAfter < 5*time.Minute {
			t.Errorf("%T: a token: %+v, %v; want refused for 6 minutes", lim, d, err)
		}
	}
}
