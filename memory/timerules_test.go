package memory_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/memory"
)

// step is one request in a step table: move the clock by advance, then ask for cost units
// of the rule's budget; the other fields are the Decision wanted.
type step struct {
	advance   time.Duration
	cost      int64
	allowed   bool
	remaining int64
	reset     time.Duration
	retry     time.Duration
	exceeded  bool
}

const ms = time.Millisecond

func runSteps(t *testing.T, r ratebudget.Rule, steps []step) {
	t.Helper()
	m, clk := newMemory(t)
	var elapsed time.Duration
	for i, s := range steps {
		clk.Advance(s.advance)
		elapsed += s.advance
		d := allow(t, m, ratebudget.Check{Rule: r, Identity: "id", Cost: s.cost})
		got := step{s.advance, s.cost, d.Allowed, d.Remaining, d.ResetAfter, d.RetryAfter, d.Exceeded}
		if got != s {
			t.Errorf("step %d (t0%+v, cost %d):\n got allowed=%v remaining=%d reset=%v retry=%v exceeded=%v\nwant allowed=%v remaining=%d reset=%v retry=%v exceeded=%v",
				i, elapsed, s.cost,
				got.allowed, got.remaining, got.reset, got.retry, got.exceeded,
				s.allowed, s.remaining, s.reset, s.retry, s.exceeded)
		}
		if d.Rule != r.Name || d.Index != 0 || d.Limit != timerule.Capacity(&r) {
			t.Errorf("step %d: reported rule %q index %d limit %d, want %q 0 %d",
				i, d.Rule, d.Index, d.Limit, r.Name, timerule.Capacity(&r))
		}
	}
}

func TestFixedWindowSteps(t *testing.T) {
	r := ratebudget.Rule{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 3, Window: time.Second}
	runSteps(t, r, []step{
		// The window opens at the first admission (t0 = ...250ms, not a second boundary).
		{0, 1, true, 2, 1000 * ms, 0, false},
		{100 * ms, 1, true, 1, 900 * ms, 0, false},
		// count 2 + cost 2 > 3: refused, retry at the window's end.
		{100 * ms, 2, false, 1, 800 * ms, 800 * ms, false},
		{0, 1, true, 0, 800 * ms, 0, false},
		// A refusal neither counts nor extends the window.
		{500 * ms, 1, false, 0, 300 * ms, 300 * ms, false},
		{299 * ms, 1, false, 0, 1 * ms, 1 * ms, false},
		// The window closes exactly Window after it opened; the next admission starts at cost.
		{1 * ms, 1, true, 2, 1000 * ms, 0, false},
		// cost > limit can never be admitted: Exceeded, RetryAfter 0, nothing spent.
		{999 * ms, 4, false, 2, 1 * ms, 0, true},
		{1 * ms, 3, true, 0, 1000 * ms, 0, false},
		// An idle key: an Exceeded refusal opens no window...
		{5 * time.Second, 4, false, 3, 0, 0, true},
		// ...the next admission does, 400ms later.
		{400 * ms, 1, true, 2, 1000 * ms, 0, false},
		{999 * ms, 3, false, 2, 1 * ms, 1 * ms, false},
		{1 * ms, 3, true, 0, 1000 * ms, 0, false},
		// Clock going back: the window keeps its end, measured from the new now.
		{-200 * ms, 1, false, 0, 1200 * ms, 1200 * ms, false},
		{1200 * ms, 1, true, 2, 1000 * ms, 0, false},
	})
}

func TestTokenBucketSteps(t *testing.T) {
	t.Run("3 per second", func(t *testing.T) {
		// One token every 333.3ms: scaled arithmetic must round each wait up, exactly.
		r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 3, Window: time.Second}
		runSteps(t, r, []step{
			// Starts full.
			{0, 1, true, 2, 334 * ms, 0, false},
			{0, 2, true, 0, 1000 * ms, 0, false},
			{0, 1, false, 0, 1000 * ms, 334 * ms, false},
			// 333ms refill 0.999 token: still refused, 1ms to go.
			{333 * ms, 1, false, 0, 667 * ms, 1 * ms, false},
			{1 * ms, 1, true, 0, 1000 * ms, 0, false},
			{0, 4, false, 0, 1000 * ms, 0, true},
			// Refill stops at capacity.
			{5 * time.Second, 3, true, 0, 1000 * ms, 0, false},
			{666 * ms, 2, false, 1, 334 * ms, 1 * ms, false},
			{1 * ms, 2, true, 0, 1000 * ms, 0, false},
		})
	})
	t.Run("1 per 7ms", func(t *testing.T) {
		r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: 7 * ms}
		runSteps(t, r, []step{
			{0, 1, true, 0, 7 * ms, 0, false},
			{6 * ms, 1, false, 0, 1 * ms, 1 * ms, false},
			{1 * ms, 1, true, 0, 7 * ms, 0, false},
			{100 * ms, 2, false, 1, 0, 0, true},
			{0, 1, true, 0, 7 * ms, 0, false},
			{3 * ms, 1, false, 0, 4 * ms, 4 * ms, false},
		})
	})
	t.Run("burst above limit", func(t *testing.T) {
		// 2 tokens per second into a bucket of 5: one token per 500ms, 2.5s to fill.
		r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 2, Window: time.Second, Burst: 5}
		runSteps(t, r, []step{
			{0, 5, true, 0, 2500 * ms, 0, false},
			{499 * ms, 1, false, 0, 2001 * ms, 1 * ms, false},
			{1 * ms, 1, true, 0, 2500 * ms, 0, false},
			{1250 * ms, 1, true, 1, 1750 * ms, 0, false},
			{0, 2, false, 1, 1750 * ms, 250 * ms, false},
			{10 * time.Second, 6, false, 5, 0, 0, true},
			{0, 5, true, 0, 2500 * ms, 0, false},
		})
	})
	t.Run("burst below limit", func(t *testing.T) {
		// 10 tokens per second into a bucket of 2: one token per 100ms.
		r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Second, Burst: 2}
		runSteps(t, r, []step{
			{0, 2, true, 0, 200 * ms, 0, false},
			{50 * ms, 1, false, 0, 150 * ms, 50 * ms, false},
			{50 * ms, 1, true, 0, 200 * ms, 0, false},
			{time.Second, 3, false, 2, 0, 0, true},
			{0, 1, true, 1, 100 * ms, 0, false},
		})
	})
	t.Run("clock going back", func(t *testing.T) {
		// 2 tokens per 100ms (one per 50ms), capacity 2. Going back refills nothing and
		// panics not; the bucket keeps its later timestamp, and the waits are measured from
		// the new now, so that waiting RetryAfter is enough.
		r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 2, Window: 100 * ms}
		runSteps(t, r, []step{
			{0, 1, true, 1, 50 * ms, 0, false},
			// 30ms back: the stored token is still there, and no refill starts for 30ms.
			{-30 * ms, 1, true, 0, 130 * ms, 0, false},
			{0, 1, false, 0, 130 * ms, 80 * ms, false},
			{79 * ms, 1, false, 0, 51 * ms, 1 * ms, false},
			{1 * ms, 1, true, 0, 100 * ms, 0, false},
			{-time.Hour, 3, false, 0, time.Hour + 100*ms, 0, true},
			{time.Hour + 99*ms, 3, false, 1, 1 * ms, 0, true},
			{1 * ms, 3, false, 2, 0, 0, true},
		})
	})
}

func TestRollingWindowSteps(t *testing.T) {
	r := ratebudget.Rule{Name: "roll", Algorithm: ratebudget.RollingWindow, Limit: 5, Window: time.Second}
	runSteps(t, r, []step{
		{0, 2, true, 3, 1000 * ms, 0, false},        // event A: t0, cost 2
		{100 * ms, 3, true, 0, 1000 * ms, 0, false}, // event B: t0+100, cost 3
		// Needs 2 units: A (2) leaving is enough, at t0+1000.
		{100 * ms, 2, false, 0, 900 * ms, 800 * ms, false},
		// Needs 4 units: A and B must leave, at t0+1100.
		{0, 4, false, 0, 900 * ms, 900 * ms, false},
		// (now-window, now]: at t0+999 A is still inside...
		{799 * ms, 2, false, 0, 101 * ms, 1 * ms, false},
		// ...at t0+1000 it is out.
		{1 * ms, 2, true, 0, 1000 * ms, 0, false}, // event C: t0+1000, cost 2
		{0, 6, false, 0, 1000 * ms, 0, true},
		// t0+1100: B leaves, C (2) remains.
		{100 * ms, 1, true, 2, 1000 * ms, 0, false}, // event D: t0+1100, cost 1
		{0, 1, true, 1, 1000 * ms, 0, false},        // same millisecond: D now costs 2
		// t0+2000: C leaves; D (2) remains until t0+2100.
		{900 * ms, 4, false, 3, 100 * ms, 100 * ms, false},
		{0, 3, true, 0, 1000 * ms, 0, false}, // event E: t0+2000, cost 3
		// Idle past the window: all events gone.
		{5 * time.Second, 6, false, 5, 0, 0, true},
		{0, 5, true, 0, 1000 * ms, 0, false},
		// Clock going back: events stay in order, waits are measured from the new now.
		{-100 * ms, 1, false, 0, 1100 * ms, 1100 * ms, false},
		{1100 * ms, 1, true, 4, 1000 * ms, 0, false},
	})
}

var algorithms = []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow}

// TestExceededSpendsNothing: for every time rule, a cost above the rule's capacity is
// refused as Exceeded with RetryAfter 0, creates no state and spends nothing.
func TestExceededSpendsNothing(t *testing.T) {
	for _, algo := range algorithms {
		for _, burst := range []int64{0, 7} {
			if burst != 0 && algo != ratebudget.TokenBucket {
				continue
			}
			r := ratebudget.Rule{Name: "r", Algorithm: algo, Limit: 5, Window: time.Second, Burst: burst}
			t.Run(fmt.Sprintf("%v/burst=%d", algo, burst), func(t *testing.T) {
				m, clk := newMemory(t)
				capacity := timerule.Capacity(&r)
				for _, cost := range []int64{capacity + 1, 2 * capacity, bound.MaxLimit} {
					d := allow(t, m, ratebudget.Check{Rule: r, Cost: cost})
					want := ratebudget.Decision{Outcome: ratebudget.Outcome{Exceeded: true, Remaining: capacity}, Rule: "r", Limit: capacity}
					if d != want {
						t.Fatalf("fresh, cost %d: got %+v, want %+v", cost, d, want)
					}
				}
				if n := m.Len(); n != 0 {
					t.Fatalf("Exceeded refusals created %d budgets", n)
				}
				allow(t, m, ratebudget.Check{Rule: r, Cost: 2})
				clk.Advance(10 * ms)
				before := probe(t, m, r, "", "")
				for range 3 {
					if d := probe(t, m, r, "", ""); d != before {
						t.Fatalf("Exceeded refusal changed the budget: %+v then %+v", before, d)
					}
				}
				if before.Remaining != capacity-2 {
					t.Fatalf("Remaining %d after spending 2 of %d", before.Remaining, capacity)
				}
				d := allow(t, m, ratebudget.Check{Rule: r, Cost: capacity - 2})
				if !d.Allowed || d.Remaining != 0 {
					t.Fatalf("the rest of the budget: got %+v", d)
				}
			})
		}
	}
}

// op is one step of a random request sequence.
type op struct {
	advance time.Duration
	cost    int64
}

// TestWaitsAreExact replays random request sequences and checks, after every decision,
// that the reported numbers are exact rather than plausible:
//   - Remaining: cost Remaining is admitted now and Remaining+1 is refused;
//   - RetryAfter: the same request is refused 1ms before it and admitted at it;
//   - ResetAfter: the budget is not whole 1ms before it and whole at it.
//
// The clock sometimes goes back.
func TestWaitsAreExact(t *testing.T) {
	rules := []ratebudget.Rule{
		{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 7, Window: 50 * ms},
		{Name: "token", Algorithm: ratebudget.TokenBucket, Limit: 3, Window: 20 * ms},
		{Name: "token-burst", Algorithm: ratebudget.TokenBucket, Limit: 2, Window: 7 * ms, Burst: 9},
		{Name: "token-small", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 30 * ms, Burst: 3},
		{Name: "rolling", Algorithm: ratebudget.RollingWindow, Limit: 7, Window: 50 * ms},
	}
	for _, r := range rules {
		t.Run(r.Name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(r.Name))))
			ops := make([]op, 150)
			for i := range ops {
				adv := time.Duration(rng.IntN(12)) * ms
				if rng.IntN(25) == 0 {
					adv = -time.Duration(rng.IntN(30)) * ms
				}
				ops[i] = op{adv, 1 + rng.Int64N(timerule.Capacity(&r))}
			}
			check := func(cost int64) ratebudget.Check { return ratebudget.Check{Rule: r, Identity: "x", Cost: cost} }
			replay := func(n int) (*memory.Limiter, *fakeClock, ratebudget.Decision) {
				m, clk := newMemory(t)
				var d ratebudget.Decision
				for _, o := range ops[:n] {
					clk.Advance(o.advance)
					d = allow(t, m, check(o.cost))
				}
				return m, clk, d
			}
			refusals := 0
			for i := 1; i <= len(ops); i++ {
				cost := ops[i-1].cost
				_, _, d := replay(i)
				if d.Exceeded {
					t.Fatalf("op %d: cost %d <= capacity reported Exceeded", i, cost)
				}

				m, _, _ := replay(i)
				if d.Remaining > 0 {
					if got := allow(t, m, check(d.Remaining)); !got.Allowed {
						t.Errorf("op %d: Remaining %d but a cost of %d is refused: %+v", i, d.Remaining, d.Remaining, got)
					}
				}
				m, _, _ = replay(i)
				if d.Remaining < timerule.Capacity(&r) {
					if got := allow(t, m, check(d.Remaining+1)); got.Allowed {
						t.Errorf("op %d: Remaining %d but a cost of %d is admitted", i, d.Remaining, d.Remaining+1)
					}
				}

				if !d.Allowed {
					refusals++
					if d.RetryAfter <= 0 {
						t.Fatalf("op %d: refusal without RetryAfter: %+v", i, d)
					}
					m, clk, _ := replay(i)
					clk.Advance(d.RetryAfter - ms)
					if got := allow(t, m, check(cost)); got.Allowed {
						t.Errorf("op %d: cost %d admitted 1ms before RetryAfter %v", i, cost, d.RetryAfter)
					}
					clk.Advance(ms)
					if got := allow(t, m, check(cost)); !got.Allowed {
						t.Errorf("op %d: cost %d refused at RetryAfter %v: %+v", i, cost, d.RetryAfter, got)
					}
				} else if d.RetryAfter != 0 {
					t.Errorf("op %d: admission with RetryAfter %v", i, d.RetryAfter)
				}

				m, clk, _ := replay(i)
				if d.ResetAfter > 0 {
					clk.Advance(d.ResetAfter - ms)
					if p := probe(t, m, r, "x", ""); p.Remaining == timerule.Capacity(&r) || p.ResetAfter != ms {
						t.Errorf("op %d: 1ms before ResetAfter %v: %+v", i, d.ResetAfter, p)
					}
					clk.Advance(ms)
				}
				if p := probe(t, m, r, "x", ""); p.Remaining != timerule.Capacity(&r) || p.ResetAfter != 0 {
					t.Errorf("op %d: at ResetAfter %v the budget is not whole: %+v", i, d.ResetAfter, p)
				}
			}
			if refusals < 10 {
				t.Fatalf("only %d refusals in %d requests: the sequence does not exercise refusals", refusals, len(ops))
			}
		})
	}
}

// TestTokenBucketStartsFull: a new identity's bucket holds its whole capacity whatever the
// clock reads and however long the bucket takes to refill: a bucket that refills in more
// time than has passed since the Unix epoch (capacity 100 refilled 1 per 366 days), and a
// simulation clock at the epoch itself. Its first request may take the whole capacity,
// in a decision of one check or of several.
func TestTokenBucketStartsFull(t *testing.T) {
	slow := ratebudget.Rule{Name: "slow", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: 100, Window: 8784 * time.Hour}
	minute := ratebudget.Rule{Name: "minute", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Minute}
	other := ratebudget.Rule{Name: "other", Limit: 5, Window: time.Second}
	for _, tc := range []struct {
		name  string
		start time.Time
		rule  ratebudget.Rule
	}{
		{"slow refill", t0, slow},
		{"epoch clock", time.UnixMilli(0), minute},
		{"just after the epoch", time.UnixMilli(1000), minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			clk.Advance(tc.start.Sub(clk.Now()))
			m, err := memory.New(memory.WithClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			capacity := timerule.Capacity(&tc.rule)
			refill := time.Duration(capacity) * tc.rule.Window / time.Duration(tc.rule.Limit)
			whole := allow(t, m, ratebudget.Check{Rule: tc.rule, Identity: "whole", Cost: capacity})
			if !whole.Allowed || whole.Remaining != 0 || whole.ResetAfter != refill {
				t.Errorf("a new bucket's whole capacity: %+v, want admitted, 0 remaining, reset %v", whole, refill)
			}
			one := allow(t, m, ratebudget.Check{Rule: tc.rule, Identity: "one", Cost: 1})
			if !one.Allowed || one.Remaining != capacity-1 {
				t.Errorf("one token of a new bucket: %+v, want admitted, %d remaining", one, capacity-1)
			}
			many := allow(t, m,
				ratebudget.Check{Rule: tc.rule, Identity: "many", Cost: capacity},
				ratebudget.Check{Rule: other, Identity: "many", Cost: 1})
			if !many.Allowed || many.Rule != tc.rule.Name || many.Remaining != 0 {
				t.Errorf("a new bucket's whole capacity next to another rule: %+v, want admitted, %s with 0 remaining", many, tc.rule.Name)
			}
		})
	}
}

// TestLongWaitsSaturate: a token bucket may take longer to fill than a time.Duration
// holds (capacity 2^40 refilled 1 per 8 s: about 279,000 years). Its waits are then the
// longest Duration, never a wrapped (negative or short) one; shorter waits stay exact.
func TestLongWaitsSaturate(t *testing.T) {
	const longest = time.Duration(math.MaxInt64)
	for _, r := range []ratebudget.Rule{
		{Name: "huge", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: bound.MaxLimit, Window: 8 * time.Second},
		{Name: "daily", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: 100_000_000, Window: 24 * time.Hour},
	} {
		t.Run(r.Name, func(t *testing.T) {
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			m, clk := newMemory(t)
			c := ratebudget.Check{Rule: r, Identity: "id", Cost: timerule.Capacity(&r)}
			if d := allow(t, m, c); !d.Allowed || d.ResetAfter != longest {
				t.Fatalf("the whole capacity: %+v, want admitted with ResetAfter %v", d, longest)
			}
			clk.Advance(time.Millisecond)
			c.Cost = 1
			if d := allow(t, m, c); d.Allowed || d.ResetAfter != longest || d.RetryAfter != r.Window-time.Millisecond {
				t.Fatalf("one more unit: %+v, want refused, ResetAfter %v, RetryAfter %v", d, longest, r.Window-time.Millisecond)
			}
		})
	}
}
