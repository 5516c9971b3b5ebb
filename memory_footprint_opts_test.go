package ratebudget_test

import (
	"testing"

	"github.com/ratebudget/ratebudget"
)

// footprintMaxOption is the option that caps a limiter at the budgets v names.
func footprintMaxOption(t *testing.T, v string) ratebudget.MemoryOption {
	t.Fatalf("RATEBUDGET_FOOTPRINT_MAX=%s: this version of Memory has no cap", v)
	return nil
}

// footprintFitOption returns the options a limiter needs to hold entries budgets.
func footprintFitOption(testing.TB, int) []ratebudget.MemoryOption { return nil }
