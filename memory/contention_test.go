package memory_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/memory"
)

const (
	workers = 32
	limit   = 5
	rounds  = 20
)

// race runs workers goroutines that all call request(i) once, released together by a
// closed channel, and returns their decisions.
func race(t *testing.T, m *memory.Limiter, request func(i int) []ratebudget.Check) []ratebudget.Decision {
	t.Helper()
	start := make(chan struct{})
	out := make([]ratebudget.Decision, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		checks := request(i)
		wg.Go(func() {
			<-start
			out[i], errs[i] = m.Allow(context.Background(), checks)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	return out
}

// TestContentionSingleBudget: 32 concurrent requests against a budget of 5 admit exactly 5,
// for every time rule; the admitted ones see each remaining count once.
func TestContentionSingleBudget(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algname.Of(algo), func(t *testing.T) {
			r := ratebudget.Rule{Name: "shared", Algorithm: algo, Limit: limit, Window: time.Minute}
			for round := range rounds {
				m, _ := newMemory(t)
				ds := race(t, m, func(int) []ratebudget.Check { return []ratebudget.Check{{Rule: r, Cost: 1}} })
				var remaining []int64
				for _, d := range ds {
					if d.Allowed {
						remaining = append(remaining, d.Remaining)
					} else if d.Exceeded || d.Remaining != 0 || d.RetryAfter <= 0 {
						t.Fatalf("round %d: refusal %+v", round, d)
					}
				}
				slices.Sort(remaining)
				if !slices.Equal(remaining, []int64{0, 1, 2, 3, 4}) {
					t.Fatalf("round %d: admitted with remaining %v, want exactly [0 1 2 3 4]", round, remaining)
				}
				if p := probe(t, m, r, "", ""); p.Remaining != 0 {
					t.Fatalf("round %d: remaining %d after the race", round, p.Remaining)
				}
			}
		})
	}
}

// TestContentionMultiCheck: every request spends from one shared budget of 5 (each time
// rule in turn) plus per-user and per-worker budgets that hash to other shards, with the
// checks in different orders. Exactly 5 requests are admitted, and the refused ones
// charged none of their other budgets.
func TestContentionMultiCheck(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algname.Of(algo), func(t *testing.T) {
			shared := ratebudget.Rule{Name: "shared", Algorithm: algo, Limit: limit, Window: time.Minute}
			user := ratebudget.Rule{Name: "user", Algorithm: ratebudget.TokenBucket, Limit: 100, Window: time.Minute}
			worker := ratebudget.Rule{Name: "worker", Algorithm: ratebudget.RollingWindow, Limit: 100, Window: time.Minute}
			users := []string{"u0", "u1", "u2", "u3"}
			for round := range rounds {
				m, _ := newMemory(t)
				ds := race(t, m, func(i int) []ratebudget.Check {
					checks := []ratebudget.Check{
						{Rule: shared, Cost: 1},
						{Rule: user, Identity: users[i%len(users)], Cost: 2},
						{Rule: worker, Identity: fmt.Sprint("w", i), Scope: "/r", Cost: 3},
					}
					if i%2 == 1 {
						slices.Reverse(checks)
					}
					return checks
				})
				admitted := 0
				for _, d := range ds {
					if d.Allowed {
						admitted++
					} else if d.Rule != "shared" {
						t.Fatalf("round %d: refusal by %q: %+v", round, d.Rule, d)
					}
				}
				if admitted != limit {
					t.Fatalf("round %d: admitted %d, want %d", round, admitted, limit)
				}
				spentUser, spentWorker := int64(0), int64(0)
				for _, u := range users {
					spentUser += 100 - probe(t, m, user, u, "").Remaining
				}
				for i := range workers {
					spentWorker += 100 - probe(t, m, worker, fmt.Sprint("w", i), "/r").Remaining
				}
				if spentUser != 2*limit || spentWorker != 3*limit {
					t.Fatalf("round %d: user budgets spent %d, worker budgets %d; want %d and %d",
						round, spentUser, spentWorker, 2*limit, 3*limit)
				}
				usersAdmitted := map[string]bool{}
				for i, d := range ds {
					if d.Allowed {
						usersAdmitted[users[i%len(users)]] = true
					}
				}
				if n, want := m.Len(), 1+len(usersAdmitted)+limit; n != want {
					t.Fatalf("round %d: %d budgets held, want %d (refused requests create none)", round, n, want)
				}
			}
		})
	}
}

// TestContentionWithTime: concurrent requests while another goroutine moves the clock.
// A fixed window of 5 per 10ms, over 200ms, opens at most 21 windows, and each window
// admits its 5 units once: counting admissions by their position in the window (from
// Remaining), no position is reached more often than the one before it.
func TestContentionWithTime(t *testing.T) {
	m, clk := newMemory(t)
	r := ratebudget.Rule{Name: "r", Limit: limit, Window: 10 * ms}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var byPosition [limit]int
	total := 0
	for range workers {
		wg.Go(func() {
			<-start
			for range 50 {
				d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: r, Cost: 1}})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					byPosition[limit-1-d.Remaining]++
					total++
					mu.Unlock()
				}
			}
		})
	}
	wg.Go(func() {
		<-start
		for range 200 {
			clk.Advance(ms)
		}
	})
	close(start)
	wg.Wait()
	for k := 1; k < limit; k++ {
		if byPosition[k] > byPosition[k-1] {
			t.Fatalf("admissions by position in the window: %v", byPosition)
		}
	}
	if windows := byPosition[0]; windows < 1 || windows > 21 || total > limit*windows {
		t.Fatalf("%d admissions in %d windows: %v", total, windows, byPosition)
	}
}
