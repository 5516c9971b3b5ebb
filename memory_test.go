package ratebudget_test

import (
	"fmt"
	"math/rand/v2"
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

// TestMemorySweepChangesNothing: dropping expired state never changes an answer. Two
// limiters on one clock, one sweeping every millisecond and one never within the test,
// get the same 20,000 random decisions (one to three checks, every time rule, windows of
// 5 to 80 ms, the clock moving 0 to 20 ms between decisions) and must answer each
// identically, waits included; the sweeping one must also hold fewer budgets.
func TestMemorySweepChangesNothing(t *testing.T) {
	clk := newFakeClock()
	mk := func(sweep time.Duration) *ratebudget.Memory {
		m, err := ratebudget.NewMemory(ratebudget.WithClock(clk.Now), ratebudget.WithSweepInterval(sweep))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	sweeping, keeping := mk(time.Millisecond), mk(time.Hour)
	var rules []ratebudget.Rule
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for i, w := range []time.Duration{5 * ms, 20 * ms, 80 * ms} {
			r := ratebudget.Rule{Name: fmt.Sprintf("%v-%d", alg, i), Algorithm: alg, Limit: int64(2 + 2*i), Window: w}
			if alg == ratebudget.TokenBucket && i == 1 {
				r.Burst = 9
			}
			rules = append(rules, r)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var admitted, refused int
	for i := range 20000 {
		clk.Advance(time.Duration(rng.IntN(21)) * ms)
		n := 1 + rng.IntN(3)
		checks := make([]ratebudget.Check, 0, n)
		for len(checks) < n {
			c := ratebudget.Check{Rule: rules[rng.IntN(len(rules))], Identity: fmt.Sprintf("id-%d", rng.IntN(40)), Cost: 1 + rng.Int64N(3)}
			dup := false
			for _, o := range checks {
				dup = dup || o.Rule.Name == c.Rule.Name && o.Identity == c.Identity
			}
			if !dup {
				checks = append(checks, c)
			}
		}
		want := allow(t, keeping, checks...)
		if got := allow(t, sweeping, checks...); got != want {
			t.Fatalf("decision %d of %+v: sweeping %+v, keeping %+v", i, checks, got, want)
		}
		if want.Allowed {
			admitted++
		} else {
			refused++
		}
	}
	t.Logf("%d admitted, %d refused; budgets held: %d sweeping, %d keeping", admitted, refused, sweeping.Len(), keeping.Len())
	if admitted < 2000 || refused < 2000 || sweeping.Len() >= keeping.Len()/4 {
		t.Fatalf("%d admitted, %d refused, %d and %d budgets held: the walk did not exercise sweeping",
			admitted, refused, sweeping.Len(), keeping.Len())
	}
}
