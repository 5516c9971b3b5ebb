package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/israce"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/memory"
)

// TestMemoryBound: state lives as long as it differs from no state. Budgets of every time
// rule are held while their windows run, and dropped once the windows have passed and a
// sweep interval has elapsed, on the next call that reaches their shard.
func TestMemoryBound(t *testing.T) {
	const sweep = 50 * time.Millisecond
	m, clk := newMemory(t, memory.WithSweepInterval(sweep))
	rules := []ratebudget.Rule{
		{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 4, Window: time.Second},
		// 4 tokens per 500ms into a bucket of 8: 1s from empty to full.
		{Name: "token", Algorithm: ratebudget.TokenBucket, Limit: 4, Window: 500 * ms, Burst: 8},
		{Name: "rolling", Algorithm: ratebudget.RollingWindow, Limit: 4, Window: time.Second},
	}
	const identities = 100
	for i := range identities {
		for _, r := range rules {
			d := allow(t, m, ratebudget.Check{Rule: r, Identity: fmt.Sprint("id", i), Scope: "/s", Cost: timerule.Capacity(&r)})
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
			return timerule.Capacity(&r) - 1 // 999ms of refill: 7.992 tokens
		}
		return 0
	})
	if n := m.Len(); n != want {
		t.Fatalf("1ms before the windows end: Len %d, want %d", n, want)
	}
	clk.Advance(ms + sweep)
	probeAll(func(r ratebudget.Rule) int64 { return timerule.Capacity(&r) })
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
	mk := func(sweep time.Duration) *memory.Limiter {
		m, err := memory.New(memory.WithClock(clk.Now), memory.WithSweepInterval(sweep))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	sweeping, keeping := mk(time.Millisecond), mk(time.Hour)
	var rules []ratebudget.Rule
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for i, w := range []time.Duration{5 * ms, 20 * ms, 80 * ms} {
			r := ratebudget.Rule{Name: fmt.Sprintf("%s-%d", algname.Of(alg), i), Algorithm: alg, Limit: int64(2 + 2*i), Window: w}
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

// TestWithMaxBudgetsValidation: a cap below one budget per shard is refused at
// construction with a *ConfigError naming the option; 64 is accepted.
func TestWithMaxBudgetsValidation(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 63} {
		_, err := memory.New(memory.WithMaxBudgets(n))
		var ce *ratebudget.ConfigError
		if !errors.As(err, &ce) || ce.Field != "WithMaxBudgets" {
			t.Errorf("WithMaxBudgets(%d): got %v, want a *ConfigError for WithMaxBudgets", n, err)
		}
	}
	if _, err := memory.New(memory.WithMaxBudgets(64)); err != nil {
		t.Errorf("WithMaxBudgets(64): %v", err)
	}
}

// TestMemoryCapFlood: 20,000 identities, each seen once, flood a limiter capped at 512
// budgets while a client that keeps knocking asks after every flood request, and every
// request also spends from a service-wide budget. The limiter never holds more than 512
// budgets; every budget it dropped is counted; the knocking client is admitted exactly
// its limit and refused after, and the service-wide budget admits exactly its limit:
// budgets that are used again are not the ones evicted.
func TestMemoryCapFlood(t *testing.T) {
	const maxBudgets, flood = 512, 20_000
	m, _ := newMemory(t, memory.WithMaxBudgets(maxBudgets))
	perClient := ratebudget.Rule{Name: "per-client", Algorithm: ratebudget.FixedWindow, Limit: 10, Window: time.Hour}
	service := ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 15_000, Window: time.Hour}
	knocker, admittedKnocker, admittedFlood := 0, 0, 0
	for i := range flood {
		d := allow(t, m, ratebudget.Check{Rule: perClient, Identity: fmt.Sprint("flood-", i), Cost: 1},
			ratebudget.Check{Rule: service, Cost: 1})
		if d.Allowed {
			admittedFlood++
		}
		if d := allow(t, m, ratebudget.Check{Rule: perClient, Identity: "knocker", Cost: 1}); d.Allowed {
			admittedKnocker++
		}
		knocker++
		if n := m.Len(); n > maxBudgets {
			t.Fatalf("after %d flood requests: %d budgets held, cap %d", i+1, n, maxBudgets)
		}
	}
	if admittedKnocker != 10 {
		t.Errorf("knocking client: %d of %d requests admitted, want exactly 10", admittedKnocker, knocker)
	}
	if admittedFlood != 15_000 {
		t.Errorf("service-wide budget: %d of %d requests admitted, want exactly 15000", admittedFlood, flood)
	}
	// Budgets created: one per flood identity admitted, the knocker's, the service's.
	if created, held := uint64(admittedFlood+2), uint64(m.Len()); m.Evictions() != created-held {
		t.Errorf("Evictions %d, want %d created - %d held", m.Evictions(), created, held)
	}
	// Refused flood requests (the service budget empty) created nothing.
	if d := probe(t, m, service, "", ""); d.Remaining != 0 {
		t.Errorf("service budget: %+v", d)
	}
}

// TestMemoryCapConcurrent: under the race detector, goroutines flood a limiter capped at
// 256 budgets with new identities, each request also spending from a service-wide budget,
// while another goroutine reads Len and Evictions. Nothing panics or races, the cap holds
// at every read, and the service-wide budget (found by every request that could evict in
// its shard, so never evicted) admits exactly its limit.
func TestMemoryCapConcurrent(t *testing.T) {
	const maxBudgets, workers, perWorker, serviceLimit = 256, 8, 1500, 5000
	m, err := memory.New(memory.WithMaxBudgets(maxBudgets))
	if err != nil {
		t.Fatal(err)
	}
	perClient := ratebudget.Rule{Name: "per-client", Algorithm: ratebudget.RollingWindow, Limit: 3, Window: time.Hour}
	service := ratebudget.Rule{Name: "service", Algorithm: ratebudget.FixedWindow, Limit: serviceLimit, Window: time.Hour}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var overCap atomic.Int64
	var reader sync.WaitGroup
	reader.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := m.Len(); n > maxBudgets {
				overCap.Store(int64(n))
			}
			_ = m.Evictions()
		}
	})
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				checks := []ratebudget.Check{
					{Rule: perClient, Identity: fmt.Sprintf("w%d-%d", w, i), Cost: 1},
					{Rule: service, Cost: 1},
				}
				d, err := m.Allow(context.Background(), checks)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	reader.Wait()
	if n := overCap.Load(); n != 0 {
		t.Errorf("Len read %d, cap %d", n, maxBudgets)
	}
	if n := admitted.Load(); n != serviceLimit {
		t.Errorf("admitted %d, want exactly the service-wide limit %d", n, serviceLimit)
	}
	if m.Evictions() == 0 {
		t.Error("no evictions: the test did not reach the cap")
	}
}

// TestMemoryAllowAllocs: a decision on budgets that exist allocates nothing, for one
// check, for three and for a Calendar rule's, while the limiter is at its cap; the first decision of a new
// identity at the cap allocates only the copy of its identity that its budget holds.
func TestMemoryAllowAllocs(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates")
	}
	m, _ := newMemory(t, memory.WithMaxBudgets(64))
	for i := range 1000 { // at the cap, evicting
		allow(t, m, ratebudget.Check{Rule: benchRule, Identity: fmt.Sprint("fill-", i), Cost: 1})
	}
	one := []ratebudget.Check{{Rule: benchRule, Identity: "203.0.113.7", Cost: 1}}
	three := []ratebudget.Check{
		{Rule: benchRule, Identity: "203.0.113.7", Cost: 1},
		{Rule: ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 1 << 30, Window: time.Millisecond}, Cost: 1},
		{Rule: ratebudget.Rule{Name: "account", Algorithm: ratebudget.RollingWindow, Limit: bound.MaxLimit, Window: time.Hour}, Identity: "acct-42", Scope: "/orders", Cost: 1},
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	calendar := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: bound.MaxLimit, Period: ratebudget.Day, Location: ny}, Identity: "203.0.113.7", Cost: 1},
	}
	for name, checks := range map[string][]ratebudget.Check{"one": one, "three": three, "calendar": calendar} {
		allow(t, m, checks...) // the budgets exist
		allocs := testing.AllocsPerRun(200, func() {
			if d := allow(t, m, checks...); !d.Allowed {
				t.Fatalf("%s: %+v", name, d)
			}
		})
		if allocs != 0 {
			t.Errorf("%s check(s): %v allocations per decision, want 0", name, allocs)
		}
	}
	// A new identity at the cap takes the memory of the budget it evicts, and copies its
	// identity (see TestMemoryKeysPinNothing).
	ids := make([]string, 201)
	for i := range ids {
		ids[i] = fmt.Sprint("new-", i)
	}
	i := 0
	fresh := []ratebudget.Check{{Rule: benchRule, Cost: 1}}
	allocs := testing.AllocsPerRun(200, func() {
		fresh[0].Identity = ids[i]
		if d := allow(t, m, fresh...); !d.Allowed {
			t.Fatalf("new identity: %+v", d)
		}
		i++
	})
	if allocs != 1 || m.Len() > 64 {
		t.Errorf("new identities at the cap: %v allocations per decision, %d budgets held; want 1 and at most 64", allocs, m.Len())
	}
}

// TestMemorySettleAllocs: reserving and settling budgets that exist allocates nothing,
// for every time rule (a Calendar one included) in one decision: cancelling, settling lower, in debt, and taking
// and releasing a lease.
func TestMemorySettleAllocs(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates")
	}
	m, _ := newMemory(t)
	checks := []ratebudget.Check{
		{Rule: benchRule, Identity: "203.0.113.7", Cost: 2},
		{Rule: ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 1 << 30, Window: time.Millisecond}, Cost: 2},
		{Rule: ratebudget.Rule{Name: "account", Algorithm: ratebudget.RollingWindow, Limit: bound.MaxLimit, Window: time.Hour}, Identity: "acct-42", Scope: "/orders", Cost: 2},
		{Rule: ratebudget.Rule{Name: "running", Algorithm: ratebudget.InFlight, Limit: 4, Window: time.Minute}, Identity: "203.0.113.7", Cost: 1},
		{Rule: ratebudget.Rule{Name: "monthly", Algorithm: ratebudget.Calendar, Limit: bound.MaxLimit, Period: ratebudget.Month}, Identity: "203.0.113.7", Cost: 2},
	}
	ctx := context.Background()
	tickets := make([]ratebudget.Ticket, len(checks))
	costs := [][]int64{nil, {1, 1, 1, 1, 1}, {2, 3, 3, 1, 3}}
	run := func(i int) {
		if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
		if err := m.Settle(ctx, checks, tickets, costs[i%len(costs)]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 { // the budgets exist, the lease slice has its room
		run(i)
	}
	i := 0
	allocs := testing.AllocsPerRun(300, func() { run(i); i++ })
	if allocs != 0 {
		t.Errorf("%v allocations per reserve and settle, want 0", allocs)
	}
}
