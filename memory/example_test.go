package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/memory"
)

// A fixed window of 3 requests per minute per client, anchored at the client's first
// admitted request. The clock is fixed so that the output is deterministic.
func ExampleLimiter_fixedWindow() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	m, err := memory.New(memory.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	rule := ratebudget.Rule{Name: "per-client", Algorithm: ratebudget.FixedWindow, Limit: 3, Window: time.Minute}
	for range 4 {
		d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: rule, Identity: "203.0.113.7", Cost: 1}})
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d reset=%v retry=%v\n", d.Allowed, d.Remaining, d.ResetAfter, d.RetryAfter)
	}
	now = now.Add(time.Minute) // the window has closed: a new one opens at the next admission
	d, _ := m.Allow(context.Background(), []ratebudget.Check{{Rule: rule, Identity: "203.0.113.7", Cost: 1}})
	fmt.Printf("allowed=%v remaining=%d reset=%v retry=%v\n", d.Allowed, d.Remaining, d.ResetAfter, d.RetryAfter)
	// Output:
	// allowed=true remaining=2 reset=1m0s retry=0s
	// allowed=true remaining=1 reset=1m0s retry=0s
	// allowed=true remaining=0 reset=1m0s retry=0s
	// allowed=false remaining=0 reset=1m0s retry=1m0s
	// allowed=true remaining=2 reset=1m0s retry=0s
}

// A token bucket refilled with 2 tokens per second (one per 500ms) holding up to 4: it
// starts full, its stored credit can be spent at once, and a request that can never fit is
// refused as Exceeded rather than told to retry.
func ExampleLimiter_tokenBucket() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	m, err := memory.New(memory.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	rule := ratebudget.Rule{Name: "api", Algorithm: ratebudget.TokenBucket, Limit: 2, Window: time.Second, Burst: 4}
	try := func(cost int64) {
		d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: rule, Identity: "account-42", Cost: cost}})
		if err != nil {
			panic(err)
		}
		fmt.Printf("cost=%d allowed=%v exceeded=%v remaining=%d/%d reset=%v retry=%v\n",
			cost, d.Allowed, d.Exceeded, d.Remaining, d.Limit, d.ResetAfter, d.RetryAfter)
	}
	try(3)
	try(1)
	try(1)
	now = now.Add(250 * time.Millisecond)
	try(1)
	try(5)
	// Output:
	// cost=3 allowed=true exceeded=false remaining=1/4 reset=1.5s retry=0s
	// cost=1 allowed=true exceeded=false remaining=0/4 reset=2s retry=0s
	// cost=1 allowed=false exceeded=false remaining=0/4 reset=2s retry=500ms
	// cost=1 allowed=false exceeded=false remaining=0/4 reset=1.75s retry=250ms
	// cost=5 allowed=false exceeded=true remaining=0/4 reset=1.75s retry=0s
}
