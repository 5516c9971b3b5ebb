package timerule

import (
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// SpentFewer gives a coalesced member back the refill of the units after its own,
// exactly, and without overflow when units x window ms exceed 64 bits.
func TestSpentFewerRefill(t *testing.T) {
	r := ratebudget.Rule{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 3, Window: 9 * time.Second}
	o := ratebudget.Outcome{Allowed: true, Remaining: 1, ResetAfter: 10 * time.Second}
	if got := SpentFewer(&r, o, 2); got.Remaining != 3 || got.ResetAfter != 4*time.Second {
		t.Fatalf("2 units more: %+v, want Remaining 3, ResetAfter 10s - 2 x 3s", got)
	}
	huge := ratebudget.Rule{Name: "h", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: bound.MaxLimit, Window: 366 * 24 * time.Hour}
	o = ratebudget.Outcome{Allowed: true, ResetAfter: time.Hour}
	for _, more := range []int64{1 << 20, 1 << 30, bound.MaxLimit / 2} {
		if got := SpentFewer(&huge, o, more); got.ResetAfter != 0 {
			t.Errorf("%d units more, a refill past every Duration: ResetAfter %v, want 0", more, got.ResetAfter)
		}
	}
}
