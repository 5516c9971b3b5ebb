package memory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// budgetOf returns the budget of c in m, or nil.
func (m *Limiter) budgetOf(c ratebudget.Check) *budget {
	k := keyOf(&c)
	h := m.hashOf(&k)
	s := &m.shards[h%memShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := s.find(h, &k)
	return b
}

func reserveSettle(t *testing.T, m *Limiter, c ratebudget.Check, actual int64) {
	t.Helper()
	tk := make([]ratebudget.Ticket, 1)
	if d, err := m.Reserve(context.Background(), []ratebudget.Check{c}, tk, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve(%+v) = %+v, %v", c, d, err)
	}
	if err := m.Settle(context.Background(), []ratebudget.Check{c}, tk, []int64{actual}); err != nil {
		t.Fatal(err)
	}
}

// TestSettleDebtBounded: however large and however often the extra, debt stays within one
// capacity, and a token bucket's deficit within 2^53 scaled units.
func TestSettleDebtBounded(t *testing.T) {
	m, clk := newTestMemory(t)
	rules := []ratebudget.Rule{
		{Name: "f", Algorithm: ratebudget.FixedWindow, Limit: 5, Window: time.Minute},
		{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 5, Window: time.Minute},
		{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 5, Window: time.Minute},
		{Name: "t-max-window", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: maxWindow},
		{Name: "t-2p53", Algorithm: ratebudget.TokenBucket, Limit: bound.MaxLimit, Window: 8192 * time.Millisecond},
	}
	for _, r := range rules {
		c := ratebudget.Check{Rule: r, Identity: "debtor", Cost: 1}
		for range 3 {
			reserveSettle(t, m, c, bound.MaxLimit)
			clk.advance(time.Millisecond)
			// Refused now, but reserve needs an admission: give one back to admit again.
			b := m.budgetOf(c)
			switch r.Algorithm {
			case ratebudget.TokenBucket:
				full := timerule.Capacity(&r) * r.Window.Milliseconds()
				charge(b, &r, bound.MaxLimit, m.now(), &m.cal) // again, from the debt
				if b.count > 2*full || b.count > timerule.MaxScaled {
					t.Fatalf("%s: deficit %d, want at most %d (a level of at least minus the capacity) and within 2^53", r.Name, b.count, min(2*full, timerule.MaxScaled))
				}
				b.count = 0 // admit again
			default:
				if b.count > 2*r.Limit {
					t.Fatalf("%s: count %d, want at most %d", r.Name, b.count, 2*r.Limit)
				}
				if r.Algorithm == ratebudget.FixedWindow {
					b.count = 0
				}
			}
			if r.Algorithm == ratebudget.RollingWindow {
				clk.advance(r.Window) // the log ages out
			}
		}
	}
}

// TestLeasesStayOrdered: leases are kept in order of expiry when the clock goes back and
// when leases are renewed, so that pruning the oldest keeps every live one; each expires
// a Window after it was taken or renewed, by the clock then.
func TestLeasesStayOrdered(t *testing.T) {
	clk := &manualClock{t: time.UnixMilli(1_767_225_600_250)}
	m, err := New(WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	r := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 10, Window: time.Second}
	c := []ratebudget.Check{{Rule: r, Identity: "x", Cost: 1}}
	var tickets [][]ratebudget.Ticket
	for i := range 6 {
		tk := make([]ratebudget.Ticket, 1)
		if d, err := m.Reserve(context.Background(), c, tk, nil); err != nil || !d.Allowed {
			t.Fatalf("lease %d: %+v, %v", i, d, err)
		}
		tickets = append(tickets, tk)
		if i == 2 {
			clk.advance(-500 * time.Millisecond) // the clock goes back
		} else {
			clk.advance(100 * time.Millisecond)
		}
	}
	if err := m.Renew(context.Background(), c, tickets[1]); err != nil {
		t.Fatal(err)
	}
	ev := m.budgetOf(c[0]).rolling.events
	for i := 1; i < len(ev); i++ {
		if ev[i].at < ev[i-1].at {
			t.Fatalf("leases out of order: %+v", ev)
		}
	}
	// Taken at t0, +100ms, +200ms, then (the clock gone back) -300ms, -200ms, -100ms;
	// lease 1 renewed at t0: each expires a second later.
	t0 := int64(1_767_225_600_250)
	want := map[int64]int64{0: t0, 1: t0, 2: t0 + 200, 3: t0 - 300, 4: t0 - 200, 5: t0 - 100}
	for _, e := range ev {
		for i, tk := range tickets {
			if tk[0].ID == e.n && e.at != want[int64(i)]+1000 {
				t.Errorf("lease %d expires at t0%+dms, want t0%+dms", i, e.at-t0, want[int64(i)]+1000-t0)
			}
		}
	}
	// Every lease expires within a Window of the latest clock reading.
	clk.advance(time.Second + 500*time.Millisecond)
	if d, _ := m.Allow(context.Background(), c); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("after every lease expired: %+v", d)
	}
}

// TestSettleChargesAGoneBudget: an extra settled after the budget was swept is spent on a
// budget created for it; a refund or release of a gone budget creates nothing.
func TestSettleChargesAGoneBudget(t *testing.T) {
	m, clk := newTestMemory(t, WithSweepInterval(time.Millisecond))
	fixed := ratebudget.Check{Rule: ratebudget.Rule{Name: "f", Limit: 5, Window: time.Second}, Identity: "late", Cost: 1}
	lease := ratebudget.Check{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 5, Window: time.Second}, Identity: "late", Cost: 1}
	checks := []ratebudget.Check{fixed, lease}
	tk := make([]ratebudget.Ticket, 2)
	if d, _ := m.Reserve(context.Background(), checks, tk, nil); !d.Allowed {
		t.Fatal(d)
	}
	clk.advance(2 * time.Second) // both expire
	sweepAll(m)
	if m.budgetOf(fixed) != nil || m.budgetOf(lease) != nil {
		t.Fatal("budgets not swept")
	}
	if err := m.Settle(context.Background(), checks, tk, []int64{7, 1}); err != nil {
		t.Fatal(err)
	}
	if b := m.budgetOf(fixed); b == nil || b.count != 6 {
		t.Fatalf("extra of a swept budget: %+v, want a new window counting 6", b)
	}
	if m.budgetOf(lease) != nil {
		t.Fatal("releasing a gone lease created a budget")
	}
}

// TestReleasedLeasesAreReclaimed: a budget whose leases are all released is no state at
// all: the next sweep drops it.
func TestReleasedLeasesAreReclaimed(t *testing.T) {
	m, clk := newTestMemory(t, WithSweepInterval(time.Millisecond))
	c := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 5, Window: time.Hour}, Identity: "done", Cost: 1}}
	tk := make([]ratebudget.Ticket, 1)
	m.Reserve(context.Background(), c, tk, nil)
	if err := m.Settle(context.Background(), c, tk, nil); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Millisecond)
	sweepAll(m)
	if m.budgetOf(c[0]) != nil {
		t.Fatal("a budget without leases outlived its sweep")
	}
}

// sweepAll sweeps every shard now, when its sweep is due.
func sweepAll(m *Limiter) {
	now := m.now()
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		m.maybeSweep(s, now)
		s.mu.Unlock()
	}
}

// TestReserveOutcomes: Reserve reports every check's outcome as AllowEach does, and
// refuses an outcomes slice of the wrong length before deciding anything.
func TestReserveOutcomes(t *testing.T) {
	m, _ := newTestMemory(t)
	checks := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "f", Limit: 5, Window: time.Minute}, Identity: "o", Cost: 2},
		{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}, Identity: "o", Cost: 1},
	}
	tk := make([]ratebudget.Ticket, 2)
	out := make([]ratebudget.Outcome, 2)
	if _, err := m.Reserve(context.Background(), checks, tk, out[:1]); err == nil {
		t.Fatal("Reserve accepted one outcome for two checks")
	}
	if d, err := m.Reserve(context.Background(), checks, tk, out); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	if !out[0].Allowed || out[0].Remaining != 3 || !out[1].Allowed || out[1].Remaining != 0 {
		t.Fatalf("outcomes %+v", out)
	}
	if d, _ := m.Reserve(context.Background(), checks, tk, out); d.Allowed || !out[0].Allowed || out[1].Allowed {
		t.Fatalf("second reserve: %+v, outcomes %+v: want refused by the lease alone", d, out)
	}
}

// TestSettleKeepsItsOwnBudgets: a settle that creates a budget again for an extra (the
// one the decision spent in was swept) never evicts another budget of the same
// decision, whichever check comes first. With one budget per shard, a decision spends in
// two budgets of one shard; the first expires and is swept, and the settle charges it an
// extra: the second budget keeps its spend, and nothing is evicted.
func TestSettleKeepsItsOwnBudgets(t *testing.T) {
	m, clk := newTestMemory(t, WithMaxBudgets(memShards), WithSweepInterval(time.Millisecond))
	short := ratebudget.Rule{Name: "short", Limit: 5, Window: time.Second}
	long := ratebudget.Rule{Name: "long", Limit: 5, Window: time.Hour}
	a := ratebudget.Check{Rule: short, Identity: "a", Cost: 1}
	b := ratebudget.Check{Rule: long, Cost: 1}
	for i := 0; m.shardOf(&memKey{name: long.Name, identity: b.Identity, algo: long.Algorithm}) != m.shardOf(&memKey{name: short.Name, identity: a.Identity, algo: short.Algorithm}); i++ {
		b.Identity = fmt.Sprint("b-", i)
	}
	checks := []ratebudget.Check{a, b}
	tk := make([]ratebudget.Ticket, 2)
	if d, err := m.Reserve(context.Background(), checks, tk, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	clk.advance(2 * time.Second)
	if err := m.Settle(context.Background(), checks, tk, []int64{3, 1}); err != nil {
		t.Fatal(err)
	}
	if n := m.Evictions(); n != 0 {
		t.Errorf("%d evictions, want none", n)
	}
	if bb := m.budgetOf(b); bb == nil || bb.count != 1 {
		t.Errorf("the decision's other budget after the settle: %+v, want it held, counting 1", bb)
	}
	if ab := m.budgetOf(a); ab == nil || ab.count != 2 {
		t.Errorf("the budget charged again: %+v, want a new window counting 2", ab)
	}
}
