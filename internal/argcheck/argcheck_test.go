package argcheck

import (
	"errors"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// TestOutcomes: one outcome per check is fine; fewer or more is a configuration error
// naming the field.
func TestOutcomes(t *testing.T) {
	if err := Outcomes(2, 2); err != nil {
		t.Fatalf("2 outcomes for 2 checks: %v", err)
	}
	for _, n := range []int{0, 1, 3} {
		var ce *ratebudget.ConfigError
		if err := Outcomes(2, n); !errors.As(err, &ce) || ce.Field != "outcomes" {
			t.Fatalf("%d outcomes for 2 checks: %v, want a ConfigError of field outcomes", n, err)
		}
	}
}

// TestSettle: a settle's or renew's arguments are the checks as ValidateChecks accepts
// them, a ticket per check at least, and nil costs or one cost per check in 0..2^40; any
// other is a configuration error naming the field.
func TestSettle(t *testing.T) {
	r := ratebudget.Rule{Name: "r", Limit: 5, Window: time.Second}
	checks := []ratebudget.Check{{Rule: r, Identity: "a", Cost: 2}, {Rule: r, Identity: "b", Cost: 1}}
	tickets := make([]ratebudget.Ticket, 2)
	for _, costs := range [][]int64{nil, {0, 0}, {3, 1 << 40}} {
		if err := Settle(checks, tickets, costs); err != nil {
			t.Errorf("costs %v: %v", costs, err)
		}
	}
	if err := Settle(checks, make([]ratebudget.Ticket, 3), nil); err != nil {
		t.Errorf("3 tickets for 2 checks: %v", err)
	}
	for _, tc := range []struct {
		name    string
		checks  []ratebudget.Check
		tickets int
		costs   []int64
		field   string
		problem string
	}{
		{"no check", nil, 0, nil, "checks", "must not be empty"},
		{"too few tickets", checks, 1, nil, "tickets", "has 1 entries for 2 checks"},
		{"too few costs", checks, 2, []int64{1}, "costs", "has 1 entries for 2 checks"},
		{"too many costs", checks, 2, []int64{1, 1, 1}, "costs", "has 3 entries for 2 checks"},
		{"negative cost", checks, 2, []int64{1, -1}, "costs", "must be in 0..1099511627776, got -1"},
		{"cost above 2^40", checks, 2, []int64{1<<40 + 1, 0}, "costs", "must be in 0..1099511627776, got 1099511627777"},
	} {
		var ce *ratebudget.ConfigError
		err := Settle(tc.checks, make([]ratebudget.Ticket, tc.tickets), tc.costs)
		if !errors.As(err, &ce) || ce.Field != tc.field || ce.Problem != tc.problem {
			t.Errorf("%s: %v, want a ConfigError of field %s: %s", tc.name, err, tc.field, tc.problem)
		}
	}
}
