package memory_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/memory"
)

// A limiter capped at 1,024 budgets (16 per shard) meets 5,000 identities that each send
// one request (a rotating flood), while one client keeps sending. The limiter holds no
// more than its cap: the one-off identities are the ones evicted (the first one's next
// request starts from a fresh budget), so the client that keeps sending is still held to
// its 3 requests per minute.
func ExampleWithMaxBudgets() {
	m, err := memory.New(memory.WithMaxBudgets(1024))
	if err != nil {
		panic(err)
	}
	rule := ratebudget.Rule{Name: "per-client", Algorithm: ratebudget.FixedWindow, Limit: 3, Window: time.Minute}
	ctx := context.Background()
	admitted := 0
	for i := range 5000 {
		_, _ = m.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "flood-" + strconv.Itoa(i), Cost: 1}})
		if d, _ := m.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "203.0.113.7", Cost: 1}}); d.Allowed {
			admitted++
		}
	}
	d, _ := m.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "flood-0", Cost: 1}})
	fmt.Println("flood-0's second request, remaining:", d.Remaining)
	fmt.Println("requests of the steady client admitted:", admitted)
	// Output:
	// flood-0's second request, remaining: 2
	// requests of the steady client admitted: 3
}
