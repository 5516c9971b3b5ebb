package memory

import (
	"context"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// maxWindow is the longest Window that [ratebudget.Rule.Validate] accepts.
const maxWindow = 366 * 24 * time.Hour

// TestConvertDeficit: a deficit converted to another window's units is d × to / from
// rounded up, at most 2^53, exactly (against math/big) over the whole range of deficits
// and windows, products far beyond 64 bits included.
func TestConvertDeficit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	maxW := maxWindow.Milliseconds()
	want := func(d, from, to int64) int64 {
		n := new(big.Int).Mul(big.NewInt(d), big.NewInt(to))
		q, r := new(big.Int).QuoRem(n, big.NewInt(from), new(big.Int))
		if r.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		if q.Cmp(big.NewInt(maxScaled)) > 0 {
			return maxScaled
		}
		return q.Int64()
	}
	cases := [][3]int64{
		{1, 1, maxW}, {maxScaled, 1, maxW}, {maxScaled, maxW, 1}, {maxScaled, maxW, maxW - 1},
		{maxScaled - 1, maxW - 1, maxW}, {7_200_000, 3_600_000, 60_000}, {1, maxW, 1}, {maxW - 1, maxW, maxW - 1},
	}
	for range 100_000 {
		d := rng.Int64N(maxScaled + 1)
		if rng.IntN(2) == 0 {
			d = rng.Int64N(1 << rng.IntN(54))
		}
		cases = append(cases, [3]int64{d, 1 + rng.Int64N(maxW), 1 + rng.Int64N(maxW)})
	}
	for _, c := range cases {
		if got, w := convertDeficit(c[0], c[1], c[2]), want(c[0], c[1], c[2]); got != w {
			t.Fatalf("convertDeficit(%d, %d, %d) = %d, want %d", c[0], c[1], c[2], got, w)
		}
	}
}

// TestTokenBucketWindowChangeKeepsPartialToken: a token half refilled under one Window is
// half a token under the next: under 100 an hour, one spent, then 18s later (half of it
// back) one more, the bucket is 1.5 tokens short; under 100 a day too, where half a
// token takes 432s; a Window changed back and forth keeps it, and the waits say so at
// each rate. (The time since the last write refills at the rate of the rule deciding.)
func TestTokenBucketWindowChangeKeepsPartialToken(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m, err := New(WithClock(func() time.Time { return now }), WithSweepInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hour := ratebudget.Rule{Name: "tbw", Algorithm: ratebudget.TokenBucket, Limit: 100, Window: time.Hour}
	day := hour
	day.Window = 24 * time.Hour
	decide := func(r ratebudget.Rule, cost int64) ratebudget.Outcome {
		t.Helper()
		var o [1]ratebudget.Outcome
		if _, err := m.AllowEach(ctx, []ratebudget.Check{{Rule: r, Identity: "a", Cost: cost}}, o[:]); err != nil {
			t.Fatal(err)
		}
		return o[0]
	}
	decide(hour, 1)
	now = now.Add(18 * time.Second)
	decide(hour, 1)
	if o := decide(day, 99); o.Allowed || o.Remaining != 98 || o.RetryAfter != 432*time.Second {
		t.Fatalf("under 100 a day: %+v, want refused, 98 remaining, retry after 432s", o)
	}
	if o := decide(day, 98); !o.Allowed || o.ResetAfter != 99*864*time.Second+432*time.Second {
		t.Fatalf("under 100 a day: %+v, want admitted, full in 99.5 tokens at 864s", o)
	}
	if o := decide(hour, 1); o.Allowed || o.Remaining != 0 || o.RetryAfter != 18*time.Second || o.ResetAfter != 99*36*time.Second+18*time.Second {
		t.Fatalf("back under 100 an hour: %+v, want refused, retry after 18s, full after 99.5 tokens at 36s", o)
	}
}
