package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/memory"
)

// wantConfigError checks that err is a *ConfigError naming field (and rule, when not empty)
// that is neither a *StoreError nor a match of ErrStoreUnavailable.
var wantConfigError = limitertest.WantConfigError

// The limiter refuses a rule that Rule.Validate rejects before spending anything, with
// Validate's error.
func TestAllowValidatesRules(t *testing.T) {
	for _, tt := range limitertest.RuleCases() {
		if tt.Field == "" {
			continue
		}
		t.Run(tt.Name, func(t *testing.T) {
			m, _ := newMemory(t)
			if _, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: tt.Rule, Cost: 1}}); err == nil {
				t.Fatal("Limiter.Allow accepted an invalid rule")
			} else {
				wantConfigError(t, err, tt.Rule.Name, tt.Field)
			}
		})
	}
}

// The limiter decides the checks that ValidateChecks accepts, and refuses the others with
// its error, deciding nothing and creating no budget.
func TestAllowValidatesChecks(t *testing.T) {
	for _, tt := range limitertest.ChecksCases() {
		t.Run(tt.Name, func(t *testing.T) {
			m, _ := newMemory(t)
			d, err := m.Allow(context.Background(), tt.Checks)
			if tt.Field == "" {
				if err != nil {
					t.Fatalf("Allow: %v", err)
				}
				if !d.Allowed && !d.Exceeded {
					t.Fatalf("Allow: %+v", d)
				}
				return
			}
			wantConfigError(t, err, tt.Rule, tt.Field)
			if d != (ratebudget.Decision{}) || m.Len() != 0 {
				t.Fatalf("an invalid request decided %+v and left %d budgets", d, m.Len())
			}
		})
	}
}

// Among several checks, a rule without a name is named by its index, as ValidateChecks
// names it.
func TestAllowNamesUnnamedRule(t *testing.T) {
	a := ratebudget.Rule{Name: "a", Limit: 1, Window: time.Second}
	unnamed := ratebudget.Rule{Limit: 1, Window: time.Second}
	checks := []ratebudget.Check{{Rule: a, Cost: 1}, {Rule: unnamed, Cost: 1}}
	m, _ := newMemory(t)
	_, err := m.Allow(context.Background(), checks)
	wantConfigError(t, err, "", "Name")
	if want := "ratebudget: checks[1]: Name must not be empty"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

func TestNewOptions(t *testing.T) {
	tests := []struct {
		name  string
		opts  []memory.Option
		field string // "" = valid
	}{
		{"none", nil, ""},
		{"clock", []memory.Option{memory.WithClock(time.Now)}, ""},
		{"max budgets 64", []memory.Option{memory.WithMaxBudgets(64)}, ""},
		{"nil clock", []memory.Option{memory.WithClock(nil)}, "WithClock"},
		{"max budgets 63", []memory.Option{memory.WithMaxBudgets(63)}, "WithMaxBudgets"},
		{"nil option", []memory.Option{memory.WithClock(time.Now), nil}, "Option"},
		{"first error wins", []memory.Option{memory.WithMaxBudgets(0), memory.WithClock(nil)}, "WithMaxBudgets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := memory.New(tt.opts...)
			if tt.field == "" {
				if err != nil || m == nil {
					t.Fatalf("New: %v, %v", m, err)
				}
				if m.Len() != 0 {
					t.Fatalf("new limiter holds %d budgets", m.Len())
				}
				return
			}
			if m != nil {
				t.Fatalf("New returned a limiter with error %v", err)
			}
			wantConfigError(t, err, "", tt.field)
		})
	}
}

// A Limiter declared as a value (var m memory.Limiter, &memory.Limiter{}) is ready to
// use with the defaults: it decides, reserves, settles and renews as one made by New,
// also when its first calls are concurrent (run with -race).
func TestZeroLimiterIsReady(t *testing.T) {
	ctx := context.Background()
	fixed := ratebudget.Rule{Name: "r", Limit: 2, Window: time.Hour}
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Hour}

	var m memory.Limiter
	if n := m.Len(); n != 0 {
		t.Fatalf("zero Limiter: Len %d, want 0", n)
	}
	one := []ratebudget.Check{{Rule: fixed, Identity: "a", Cost: 1}}
	for i, want := range []bool{true, true, false} {
		d, err := m.Allow(ctx, one)
		if err != nil || d.Allowed != want {
			t.Fatalf("Allow %d: %+v, %v; want allowed %v", i, d, err, want)
		}
	}
	outcomes := make([]ratebudget.Outcome, 1)
	if d, err := m.AllowEach(ctx, []ratebudget.Check{{Rule: fixed, Identity: "b", Cost: 2}}, outcomes); err != nil || !d.Allowed || outcomes[0].Remaining != 0 {
		t.Fatalf("AllowEach: %+v %+v, %v", d, outcomes, err)
	}
	checks := []ratebudget.Check{{Rule: lease, Identity: "a", Cost: 1}}
	tickets := make([]ratebudget.Ticket, 1)
	if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed || tickets[0] == (ratebudget.Ticket{}) {
		t.Fatalf("Reserve: %+v %+v, %v", d, tickets, err)
	}
	if d, err := m.Allow(ctx, checks); err != nil || d.Allowed {
		t.Fatalf("Allow while the lease is held: %+v, %v", d, err)
	}
	if err := m.Renew(ctx, checks, tickets); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := m.Settle(ctx, checks, tickets, nil); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
		t.Fatalf("Allow once the lease is released: %+v, %v", d, err)
	}
	if n := m.Len(); n != 3 {
		t.Fatalf("Len %d, want 3", n)
	}

	// Concurrent first calls: each admission is counted once, in one set of shards.
	var z memory.Limiter
	const n = 8
	done := make(chan bool, n)
	for range n {
		go func() {
			d, err := z.Allow(ctx, []ratebudget.Check{{Rule: ratebudget.Rule{Name: "r", Limit: n, Window: time.Hour}, Identity: "shared", Cost: 1}})
			done <- err == nil && d.Allowed
		}()
	}
	for range n {
		if !<-done {
			t.Fatal("a concurrent first decision was refused or failed")
		}
	}
	d, err := z.Allow(ctx, []ratebudget.Check{{Rule: ratebudget.Rule{Name: "r", Limit: n, Window: time.Hour}, Identity: "shared", Cost: 1}})
	if err != nil || d.Allowed || z.Len() != 1 {
		t.Fatalf("after %d concurrent admissions of a limit of %d: %+v, %v, %d budgets; want a refusal and 1 budget", n, n, d, err, z.Len())
	}
}
