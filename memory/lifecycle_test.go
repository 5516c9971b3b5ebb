package memory_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/memory"
)

// stressLeases runs goroutines that each take a lease of a shared InFlight budget of
// limit 4 together with a spend of a budget of their own (a new identity every few
// rounds, so that budgets come and go), renew it, and settle it, some at a higher cost
// and some cancelled. It returns the most leases held at once, as the callers counted
// them. With evicting set, a renewal may find its lease lost (its budget evicted).
func stressLeases(t *testing.T, m *memory.Limiter, evicting bool) int64 {
	t.Helper()
	const workers, each = 8, 400
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 4, Window: time.Hour}
	api := ratebudget.Rule{Name: "api", Limit: 1000, Window: time.Hour}
	var held, most atomic.Int64
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			tickets := make([]ratebudget.Ticket, 2)
			for i := range each {
				checks := []ratebudget.Check{
					{Rule: slots, Identity: "shared", Cost: 1},
					{Rule: api, Identity: "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i/4), Cost: 2},
				}
				d, err := m.Reserve(ctx, checks, tickets, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				n := held.Add(1)
				for o := most.Load(); n > o && !most.CompareAndSwap(o, n); o = most.Load() {
				}
				if err := m.Renew(ctx, checks, tickets); err != nil && !(evicting && errors.Is(err, ratebudget.ErrLeaseLost)) {
					t.Errorf("renewing a live lease: %v", err)
				}
				held.Add(-1) // before the settle: a slot is free once released
				var costs []int64
				if i%3 != 0 {
					costs = []int64{1, int64(i % 5)}
				}
				if err := m.Settle(ctx, checks, tickets, costs); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	// Every lease was released: the limit is free again.
	var free [][]ratebudget.Ticket
	for range 5 {
		tk := make([]ratebudget.Ticket, 1)
		d, err := m.Reserve(ctx, []ratebudget.Check{{Rule: slots, Identity: "shared", Cost: 1}}, tk, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			free = append(free, tk)
		}
	}
	if len(free) != 4 {
		t.Fatalf("after every lease was settled, %d of 4 slots are free", len(free))
	}
	return most.Load()
}

// Under concurrent reservations, renewals and settles, a tracked in-flight budget never
// holds more leases than its limit, and every settled lease is released.
func TestStressLeasesNeverAboveTheLimit(t *testing.T) {
	t.Parallel()
	m, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	if n := stressLeases(t, m, false); n > 4 {
		t.Fatalf("%d leases held at once, limit 4", n)
	}
	if n := m.Evictions(); n != 0 {
		t.Fatalf("%d evictions under the default cap", n)
	}
}

// At a cap that evicts budgets all the time (one per shard), settles of budgets evicted
// meanwhile change nothing else, the number of budgets held stays within the cap but
// for a request's own, and every lease is released in the end.
func TestStressLeasesWhileEvicting(t *testing.T) {
	t.Parallel()
	m, err := memory.New(memory.WithMaxBudgets(64))
	if err != nil {
		t.Fatal(err)
	}
	stressLeases(t, m, true)
	if m.Evictions() == 0 {
		t.Fatal("no eviction: the test does not evict")
	}
	if n := m.Len(); n > 64+2 {
		t.Fatalf("%d budgets held, cap 64", n)
	}
}
