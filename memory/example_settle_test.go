package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/memory"
)

// Reserve an estimate, do the work, then settle at what it really cost: the part not
// used is given back to the budget.
func ExampleLimiter_Settle() {
	lim, _ := memory.New() // a *lua.Limiter settles alike
	ctx := context.Background()
	checks := []ratebudget.Check{{
		Rule:     ratebudget.Rule{Name: "tokens", Limit: 1000, Window: time.Minute},
		Identity: "account-7",
		Cost:     300, // the estimate
	}}
	tickets := make([]ratebudget.Ticket, len(checks))
	d, err := lim.Reserve(ctx, checks, tickets, nil)
	if err != nil || !d.Allowed {
		fmt.Println("refused", err)
		return
	}
	fmt.Println("reserved, remaining", d.Remaining)

	used := int64(120) // what the work really took
	if err := lim.Settle(ctx, checks, tickets, []int64{used}); err != nil {
		fmt.Println(err)
		return
	}
	checks[0].Cost = 1
	d, _ = lim.Allow(ctx, checks)
	fmt.Println("after settling at 120, remaining", d.Remaining)
	// Output:
	// reserved, remaining 700
	// after settling at 120, remaining 879
}

// An InFlight rule admits at most Limit pieces of work at once per identity. A lease is
// held from Reserve until Settle releases it, and expires after Window if it never is
// (its process died).
func ExampleLimiter_Settle_inFlight() {
	lim, _ := memory.New()
	ctx := context.Background()
	slots := []ratebudget.Check{{
		Rule:     ratebudget.Rule{Name: "exports", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Minute},
		Identity: "account-7",
		Cost:     1,
	}}
	var held [][]ratebudget.Ticket
	for i := range 3 {
		tickets := make([]ratebudget.Ticket, 1)
		d, _ := lim.Reserve(ctx, slots, tickets, nil)
		fmt.Printf("export %d: allowed %v, running slots left %d\n", i+1, d.Allowed, d.Remaining)
		if d.Allowed {
			held = append(held, tickets)
		}
	}
	_ = lim.Settle(ctx, slots, held[0], nil) // the first export is done: its lease is released
	d, _ := lim.Reserve(ctx, slots, make([]ratebudget.Ticket, 1), nil)
	fmt.Println("after one finished: allowed", d.Allowed)
	// Output:
	// export 1: allowed true, running slots left 1
	// export 2: allowed true, running slots left 0
	// export 3: allowed false, running slots left 0
	// after one finished: allowed true
}
