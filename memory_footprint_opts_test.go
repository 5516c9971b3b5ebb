package ratebudget_test

import (
	"strconv"
	"testing"

	"github.com/ratebudget/ratebudget"
)

// footprintMaxOption is the option that caps a limiter at the budgets v names.
func footprintMaxOption(t *testing.T, v string) ratebudget.MemoryOption {
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("RATEBUDGET_FOOTPRINT_MAX=%s: %v", v, err)
	}
	return ratebudget.WithMaxBudgets(n)
}

// footprintFitOption returns the options a limiter needs to hold entries budgets: a cap
// with room for the shards' uneven shares.
func footprintFitOption(_ testing.TB, entries int) []ratebudget.MemoryOption {
	return []ratebudget.MemoryOption{ratebudget.WithMaxBudgets(2 * entries)}
}
