package algname_test

import (
	"testing"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
)

// Each time rule's name, without allocating; "Algorithm(n)" for another value.
func TestOf(t *testing.T) {
	for a, want := range map[ratebudget.Algorithm]string{
		ratebudget.FixedWindow: "fixed", ratebudget.TokenBucket: "token", ratebudget.RollingWindow: "rolling",
		ratebudget.InFlight: "inflight", ratebudget.Calendar: "calendar", ratebudget.Algorithm(5): "Algorithm(5)", ratebudget.Algorithm(255): "Algorithm(255)",
	} {
		if got := algname.Of(a); got != want {
			t.Errorf("Algorithm %d: Of = %q, want %q", uint8(a), got, want)
		}
		if a <= ratebudget.Calendar {
			if n := testing.AllocsPerRun(100, func() { _ = algname.Of(a) }); n != 0 {
				t.Errorf("Algorithm %d: Of allocates %v times, want 0", uint8(a), n)
			}
		}
	}
}
