package memory_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// TestResetAllocatesNothing: a reset of budgets held as they are (short keys) allocates
// nothing, as its godoc says.
func TestResetAllocatesNothing(t *testing.T) {
	m, _ := newMemory(t)
	rule := ratebudget.Rule{Name: "api", Algorithm: ratebudget.RollingWindow, Limit: 5, Window: time.Minute}
	checks := []ratebudget.Check{{Rule: rule, Identity: "10.0.0.1", Cost: 1}, {Rule: rule, Identity: "10.0.0.2", Scope: "/x", Cost: 1}}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() {
		allow(t, m, checks...)
		if err := m.Reset(ctx, checks...); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Allow and Reset allocate %v times, want 0", n)
	}
	if d := allow(t, m, checks...); !d.Allowed || d.Remaining != 4 {
		t.Fatalf("after the resets: %+v, want admitted with 4 remaining", d)
	}
}

// TestResetConcurrent: resets race with decisions of the same budgets and of others
// (run with -race); once both stop, one more reset leaves every budget fresh, and the
// budgets never reset kept their spend.
func TestResetConcurrent(t *testing.T) {
	m, _ := newMemory(t)
	rule := ratebudget.Rule{Name: "api", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Hour}
	reset := []ratebudget.Check{{Rule: rule, Identity: "a"}, {Rule: rule, Identity: "b"}}
	kept := ratebudget.Check{Rule: rule, Identity: "c", Cost: 1}
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if g == 0 {
					if err := m.Reset(ctx, reset...); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				if _, err := m.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "a", Cost: 1}, {Rule: rule, Identity: "b", Cost: 1}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 3 {
		allow(t, m, kept)
	}
	wg.Wait()
	if err := m.Reset(ctx, reset...); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, m, ratebudget.Check{Rule: rule, Identity: "a", Cost: 10}, ratebudget.Check{Rule: rule, Identity: "b", Cost: 10}); !d.Allowed {
		t.Fatalf("after the last reset: %+v, want both buckets full", d)
	}
	if d := allow(t, m, kept); d.Remaining != 6 {
		t.Fatalf("a budget never reset: %+v, want 6 remaining", d)
	}
}
