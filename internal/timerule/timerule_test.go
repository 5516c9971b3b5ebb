package timerule

import (
	"math/big"
	"math/rand/v2"
	"testing"
)

// maxWindow is the longest Window (ms) that [ratebudget.Rule.Validate] accepts: 366 days.
const maxWindow int64 = 366 * 24 * 3600 * 1000

// TestConvertDeficit: a deficit converted to another window's units is d × to / from
// rounded up, at most 2^53, exactly (against math/big) over the whole range of deficits
// and windows, products far beyond 64 bits included.
func TestConvertDeficit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	maxW := maxWindow
	want := func(d, from, to int64) int64 {
		n := new(big.Int).Mul(big.NewInt(d), big.NewInt(to))
		q, r := new(big.Int).QuoRem(n, big.NewInt(from), new(big.Int))
		if r.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		if q.Cmp(big.NewInt(MaxScaled)) > 0 {
			return MaxScaled
		}
		return q.Int64()
	}
	cases := [][3]int64{
		{1, 1, maxW}, {MaxScaled, 1, maxW}, {MaxScaled, maxW, 1}, {MaxScaled, maxW, maxW - 1},
		{MaxScaled - 1, maxW - 1, maxW}, {7_200_000, 3_600_000, 60_000}, {1, maxW, 1}, {maxW - 1, maxW, maxW - 1},
	}
	for range 100_000 {
		d := rng.Int64N(MaxScaled + 1)
		if rng.IntN(2) == 0 {
			d = rng.Int64N(1 << rng.IntN(54))
		}
		cases = append(cases, [3]int64{d, 1 + rng.Int64N(maxW), 1 + rng.Int64N(maxW)})
	}
	for _, c := range cases {
		if got, w := ConvertDeficit(c[0], c[1], c[2]), want(c[0], c[1], c[2]); got != w {
			t.Fatalf("ConvertDeficit(%d, %d, %d) = %d, want %d", c[0], c[1], c[2], got, w)
		}
	}
}
