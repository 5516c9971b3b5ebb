package argcheck

import (
	"errors"
	"testing"

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
