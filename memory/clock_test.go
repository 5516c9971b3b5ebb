package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/memory"
)

// t0 is the fake clocks' start: deliberately not on a second boundary, so that a window
// anchored at the first admission is told apart from one aligned to the epoch.
var t0 = time.UnixMilli(1_767_225_600_250)

// fakeClock is a manual clock for the limiter: time moves only when Advance is called
// (a negative duration moves it back).
type fakeClock = limitertest.FakeClock

func newFakeClock() *fakeClock { return limitertest.NewFakeClock(t0) }

func newMemory(t testing.TB, opts ...memory.Option) (*memory.Limiter, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	m, err := memory.New(append([]memory.Option{memory.WithClock(clk.Now)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, clk
}

func allow(t testing.TB, m *memory.Limiter, checks ...ratebudget.Check) ratebudget.Decision {
	t.Helper()
	d, err := m.Allow(context.Background(), checks)
	if err != nil {
		t.Fatalf("Allow(%+v): %v", checks, err)
	}
	return d
}

// probe reports the budget's state without spending: a check whose cost exceeds the rule's
// capacity is refused as Exceeded and carries the budget's Remaining and ResetAfter.
func probe(t testing.TB, m *memory.Limiter, r ratebudget.Rule, identity, scope string) ratebudget.Decision {
	t.Helper()
	d := allow(t, m, ratebudget.Check{Rule: r, Identity: identity, Scope: scope, Cost: timerule.Capacity(&r) + 1})
	if d.Allowed || !d.Exceeded || d.RetryAfter != 0 {
		t.Fatalf("probe of %s/%q/%q: want Exceeded with RetryAfter 0, got %+v", r.Name, identity, scope, d)
	}
	return d
}
