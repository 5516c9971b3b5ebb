package memory

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// retryByWalk is a refused rolling-window decision's retry time (ms from now) found by
// summing the events' costs oldest first: the reference for the binary search, and the
// way it was found before (see BenchmarkRollingRefusal).
func retryByWalk(b *budget, r *ratebudget.Rule, cost, now int64) int64 {
	w := r.Window.Milliseconds()
	ev := b.trimRolling(now, w)
	need, freed, prev := b.count+cost-r.Limit, int64(0), b.rolling.base
	for _, e := range ev {
		freed += e.n - prev // the event's cost
		prev = e.n
		if freed >= need {
			return e.at + w - now
		}
	}
	return ev[len(ev)-1].at + w - now
}

// checkLog fails unless b's log is consistent: times increasing, every cost positive,
// and b.count their sum.
func checkLog(t *testing.T, b *budget) {
	t.Helper()
	if b.rolling == nil {
		return
	}
	sum := int64(0)
	for i, e := range b.rolling.events {
		c := b.rolling.costOf(i)
		if c <= 0 || i > 0 && e.at <= b.rolling.events[i-1].at {
			t.Fatalf("event %d of %+v: cost %d", i, b.rolling.events, c)
		}
		sum += c
	}
	if sum != b.count {
		t.Fatalf("count %d, events sum to %d", b.count, sum)
	}
}

// TestRollingRetryExactAtBoundaries: a refused rolling-window decision's RetryAfter is
// the exact wait: one millisecond earlier the same check is still refused, at it the
// check is admitted. Every cost that can be refused is tried against a log of unequal
// costs, merged events, one event partly and one wholly given back, with aged events
// trimmed first, and with cumulative sums about to wrap past the int64 range.
func TestRollingRetryExactAtBoundaries(t *testing.T) {
	r := ratebudget.Rule{Name: "roll", Algorithm: ratebudget.RollingWindow, Limit: 40, Window: time.Second}
	for _, tc := range []struct {
		name string
		base int64 // the cumulative sums' origin
	}{{"sums from 0", 0}, {"sums wrapping", math.MaxInt64 - 20}} {
		t.Run(tc.name, func(t *testing.T) {
			// build returns a limiter holding one budget whose log, in the window at the
			// time it returns, costs 2, 5 (two merged), 1, 1 (6 given back to 1), 7, 3, 4,
			// 6 (29 in all; a 9 given back wholly left no event), behind an aged event of 9.
			build := func() (*Limiter, *manualClock, ratebudget.Check) {
				m, clk := newTestMemory(t)
				c := ratebudget.Check{Rule: r, Identity: "id", Cost: 9}
				reserveSettle(t, m, c, 9) // ages out below
				m.budgetOf(c).rolling.base = tc.base
				m.budgetOf(c).rolling.events[0].n = tc.base + 9
				clk.advance(10 * time.Millisecond)
				for _, step := range []struct {
					cost, actual int64
					advance      time.Duration // ms, after the step
				}{
					{2, 2, 100}, {3, 3, 0}, {2, 2, 50}, {1, 1, 50}, {6, 1, 1},
					{9, 0, 1}, {7, 7, 200}, {3, 3, 99}, {4, 4, 1}, {6, 6, 493},
				} {
					reserveSettle(t, m, ratebudget.Check{Rule: r, Identity: "id", Cost: step.cost}, step.actual)
					clk.advance(step.advance * time.Millisecond)
				}
				// Now 1,005ms after the first event: it has aged out, the others not.
				if b := m.budgetOf(c); b.count != 38 || len(b.rolling.events) != 9 {
					t.Fatalf("count %d, events %+v; want 38 in 9 events", b.count, b.rolling.events)
				}
				return m, clk, c
			}
			ctx := context.Background()
			for cost := int64(12); cost <= r.Limit; cost++ {
				m, clk, c := build()
				c.Cost = cost
				b := m.budgetOf(c)
				want := retryByWalk(b, &r, cost, m.now())
				checkLog(t, b)
				d, _ := m.Allow(ctx, []ratebudget.Check{c})
				if d.Allowed || d.RetryAfter != timerule.Duration(want) {
					t.Fatalf("cost %d: %+v, want refused with RetryAfter %dms", cost, d, want)
				}
				clk.advance(d.RetryAfter - time.Millisecond)
				if d, _ := m.Allow(ctx, []ratebudget.Check{c}); d.Allowed || d.RetryAfter != time.Millisecond {
					t.Fatalf("cost %d, 1ms before RetryAfter: %+v, want refused for 1ms more", cost, d)
				}
				clk.advance(time.Millisecond)
				if d, _ := m.Allow(ctx, []ratebudget.Check{c}); !d.Allowed {
					t.Fatalf("cost %d, at RetryAfter: %+v, want admitted", cost, d)
				}
				checkLog(t, m.budgetOf(c))
			}
		})
	}
}

// TestRollingRetryMatchesWalk: over random admissions, give-backs, extras, and a clock
// that moves back as well as forward, every refused rolling-window decision's RetryAfter
// equals the reference walk's, and the log stays consistent.
func TestRollingRetryMatchesWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	r := ratebudget.Rule{Name: "roll", Algorithm: ratebudget.RollingWindow, Limit: 50, Window: 200 * time.Millisecond}
	m, clk := newTestMemory(t)
	ctx := context.Background()
	refused := 0
	for i := range 20_000 {
		c := ratebudget.Check{Rule: r, Identity: "id", Cost: 1 + rng.Int64N(r.Limit)}
		if b := m.budgetOf(c); b != nil && b.rolling != nil {
			checkLog(t, b)
			// Whether it is refused, and the reference wait, on a copy: both trim.
			cp := *b
			cp.rolling = &rollingEvents{events: append([]event(nil), b.rolling.events...), base: b.rolling.base}
			cp.trimRolling(m.now(), r.Window.Milliseconds())
			if cp.count+c.Cost > r.Limit {
				want := retryByWalk(&cp, &r, c.Cost, m.now())
				refused++
				d, _ := m.Allow(ctx, []ratebudget.Check{c})
				if d.Allowed || d.RetryAfter != timerule.Duration(want) {
					t.Fatalf("step %d, cost %d: %+v, want refused with RetryAfter %dms", i, c.Cost, d, want)
				}
				continue
			}
		}
		tk := make([]ratebudget.Ticket, 1)
		if d, _ := m.Reserve(ctx, []ratebudget.Check{c}, tk, nil); d.Allowed {
			switch rng.IntN(4) {
			case 0:
				_ = m.Settle(ctx, []ratebudget.Check{c}, tk, []int64{rng.Int64N(c.Cost)})
			case 1:
				_ = m.Settle(ctx, []ratebudget.Check{c}, tk, []int64{c.Cost + rng.Int64N(2*r.Limit)})
			}
		}
		switch rng.IntN(10) {
		case 0:
			clk.advance(-time.Duration(rng.IntN(30)) * time.Millisecond)
		case 1, 2, 3:
		default:
			clk.advance(time.Duration(rng.IntN(25)) * time.Millisecond)
		}
	}
	if refused < 1000 {
		t.Fatalf("only %d refusals compared", refused)
	}
}

// BenchmarkRollingRefusal: a refused cost of 90,000 against a rolling-window log of
// 100,000 events of cost 1, the retry time found by the binary search (a decision through
// Allow) and by the walk it replaced (summing the costs oldest first, the shard locked as
// a decision locks it). And the steady state of such a log (one event leaving the window,
// one admitted, per decision) with the aged event resliced off the log (a decision
// through Allow) and with the log copied down, as it was before.
func BenchmarkRollingRefusal(b *testing.B) {
	setup := func(b *testing.B, r ratebudget.Rule) (*Limiter, *manualClock, []ratebudget.Check) {
		clk := &manualClock{t: time.UnixMilli(1_767_225_600_250)}
		m, err := New(WithClock(clk.now))
		if err != nil {
			b.Fatal(err)
		}
		c := []ratebudget.Check{{Rule: r, Identity: "big", Cost: 1}}
		for range 100_000 {
			if d, _ := m.Allow(context.Background(), c); !d.Allowed {
				b.Fatal(d)
			}
			clk.advance(time.Millisecond)
		}
		return m, clk, c
	}
	refuse := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 100_000, Window: time.Hour}
	b.Run("refusal/search", func(b *testing.B) {
		m, _, c := setup(b, refuse)
		c[0].Cost = 90_000
		for b.Loop() {
			if d, _ := m.Allow(context.Background(), c); d.Allowed || d.RetryAfter == 0 {
				b.Fatal(d)
			}
		}
	})
	b.Run("refusal/walk", func(b *testing.B) {
		m, _, c := setup(b, refuse)
		k := keyOf(&c[0])
		h := m.hashOf(&k)
		s := &m.shards[h%memShards]
		for b.Loop() {
			s.mu.Lock()
			retry := retryByWalk(s.get(h, &k), &refuse, 90_000, m.now())
			s.mu.Unlock()
			if retry == 0 {
				b.Fatal(retry)
			}
		}
	})
	steady := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 200_000, Window: 100 * time.Second}
	b.Run("steady/reslice", func(b *testing.B) {
		m, clk, c := setup(b, steady)
		for b.Loop() {
			if d, _ := m.Allow(context.Background(), c); !d.Allowed {
				b.Fatal(d)
			}
			clk.advance(time.Millisecond)
		}
	})
	b.Run("steady/copy", func(b *testing.B) {
		m, clk, c := setup(b, steady)
		k := keyOf(&c[0])
		h := m.hashOf(&k)
		s := &m.shards[h%memShards]
		w := steady.Window.Milliseconds()
		for b.Loop() {
			now := m.now()
			s.mu.Lock()
			bg := s.get(h, &k)
			// The trim as it was: the live events copied to the array's start.
			ev := bg.rolling.events
			n := 0
			for n < len(ev) && ev[n].at <= now-w {
				n++
			}
			if n > 0 {
				bg.count -= ev[n-1].n - bg.rolling.base
				bg.rolling.base = ev[n-1].n
				bg.rolling.events = append(ev[:0], ev[n:]...)
			}
			o := decideRolling(bg, &steady, 1, now, true)
			s.mu.Unlock()
			if !o.Allowed {
				b.Fatal(o)
			}
			clk.advance(time.Millisecond)
		}
	})
}

// TestRollingTrimDoesNotCopy: dropping the events that left the window costs time in
// proportion to them, not to the log: the events still held are not moved, for a rolling
// window (admitted or refused) as for in-flight leases.
func TestRollingTrimDoesNotCopy(t *testing.T) {
	ctx := context.Background()
	for _, r := range []ratebudget.Rule{
		{Name: "roll", Algorithm: ratebudget.RollingWindow, Limit: 1000, Window: time.Second},
		{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 1000, Window: time.Second},
	} {
		for _, cost := range []int64{1, r.Limit} {
			if r.Algorithm == ratebudget.InFlight && cost > 1 {
				continue
			}
			m, clk := newTestMemory(t)
			c := ratebudget.Check{Rule: r, Identity: "id", Cost: 1}
			for range r.Limit {
				if d, _ := m.Allow(ctx, []ratebudget.Check{c}); !d.Allowed {
					t.Fatalf("%s: %+v", r.Name, d)
				}
				clk.advance(time.Millisecond)
			}
			clk.advance(2 * time.Millisecond) // the oldest three have left the window
			ev := m.budgetOf(c).rolling.events
			kept := &ev[3]
			c.Cost = cost // 1: admitted (a lease: refused), Limit: refused
			_, _ = m.Allow(ctx, []ratebudget.Check{c})
			if got := m.budgetOf(c).rolling.events; len(got) < 997 || &got[0] != kept {
				t.Fatalf("%s, cost %d: %d events, the live ones moved", r.Name, cost, len(got))
			}
		}
	}
}
