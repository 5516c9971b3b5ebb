package ratebudget_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// TestMemoryBound: state lives as long as it differs from no state. Budgets of every time
// rule are held while their windows run, and dropped once the windows have passed and a
// sweep interval has elapsed, on the next call that reaches their shard.
func TestMemoryBound(t *testing.T) {
	const sweep = 50 * time.Millisecond
	m, clk := newMemory(t, ratebudget.WithSweepInterval(sweep))
	rules := []ratebudget.Rule{
		{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 4, Window: time.Second},
		// 4 tokens per 500ms into a bucket of 8: 1s from empty to full.
		{Name: "token", Algorithm: ratebudget.TokenBucket, Limit: 4, Window: 500 * ms, Burst: 8},
		{Name: "rolling", Algorithm: ratebudget.RollingWindow, Limit: 4, Window: time.Second},
	}
	const identities = 100
	for i := range identities {
		for _, r := range rules {
			d := allow(t, m, ratebudget.Check{Rule: r, Identity: fmt.Sprint("id", i), Scope: "/s", Cost: r.Capacity()})
			if !d.Allowed || d.ResetAfter != time.Second {
				t.Fatalf("%s: %+v", r.Name, d)
			}
		}
	}
	want := identities * len(rules)
	if n := m.Len(); n != want {
		t.Fatalf("Len %d, want %d", n, want)
	}
	// Probes (Exceeded checks of the same budgets) reach every shard that holds state,
	// spending and creating nothing.
	probeAll := func(wantRemaining func(ratebudget.Rule) int64) {
		t.Helper()
		for i := range identities {
			for _, r := range rules {
				if d := probe(t, m, r, fmt.Sprint("id", i), "/s"); d.Remaining != wantRemaining(r) {
					t.Fatalf("%s/id%d: %+v", r.Name, i, d)
				}
			}
		}
	}
	clk.Advance(time.Second - ms)
	probeAll(func(r ratebudget.Rule) int64 {
		if r.Algorithm == ratebudget.TokenBucket {
			return r.Capacity() - 1 // 999ms of refill: 7.992 tokens
		}
		return 0
	})
	if n := m.Len(); n != want {
		t.Fatalf("1ms before the windows end: Len %d, want %d", n, want)
	}
	clk.Advance(ms + sweep)
	probeAll(func(r ratebudget.Rule) int64 { return r.Capacity() })
	if n := m.Len(); n != 0 {
		t.Fatalf("after the windows and a sweep interval: Len %d, want 0", n)
	}
}
