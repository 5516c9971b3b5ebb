package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
)

// TestDebtOutcome: after a settle above its reservation the budget is in debt, which
// AllowEach's outcome reports as a negative Remaining, and the Decision as 0.
func TestDebtOutcome(t *testing.T) {
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		m, _ := newMemory(t)
		checks := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "jobs", Algorithm: alg, Limit: 10, Window: time.Minute}, Identity: "worker", Cost: 5}}
		tickets := make([]ratebudget.Ticket, 1)
		if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("%s: Reserve: %+v, %v", algname.Of(alg), d, err)
		}
		if err := m.Settle(ctx, checks, tickets, []int64{15}); err != nil {
			t.Fatal(err)
		}
		outs := make([]ratebudget.Outcome, 1)
		d, err := m.AllowEach(ctx, checks, outs)
		if err != nil || d.Allowed || d.Remaining != 0 || outs[0].Remaining != -5 {
			t.Fatalf("%v in debt of 5: %+v, outcome %+v, %v; want refused, Remaining 0, the outcome's -5", alg, d, outs[0], err)
		}
	}
}
