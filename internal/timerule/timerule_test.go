package timerule

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
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

// TestElapsed: an outcome's waits shrink by the time elapsed since its request was sent,
// rounded up to whole milliseconds, never below zero, and the reset stays no earlier
// than the retry.
func TestElapsed(t *testing.T) {
	o := ratebudget.Outcome{Remaining: 3, ResetAfter: 10 * time.Millisecond, RetryAfter: 4 * time.Millisecond}
	for _, c := range []struct {
		elapsed      time.Duration
		reset, retry time.Duration
	}{
		{0, 10 * time.Millisecond, 4 * time.Millisecond},
		{time.Microsecond, 10 * time.Millisecond, 4 * time.Millisecond}, // rounded up
		{time.Millisecond, 9 * time.Millisecond, 3 * time.Millisecond},
		{4 * time.Millisecond, 6 * time.Millisecond, 0},
		{20 * time.Millisecond, 0, 0},
	} {
		got := Elapsed(o, 1000, 1000+int64(c.elapsed))
		if got.ResetAfter != c.reset || got.RetryAfter != c.retry || got.Remaining != 3 {
			t.Errorf("after %v: %+v, want reset %v, retry %v", c.elapsed, got, c.reset, c.retry)
		}
	}
	admitted := ratebudget.Outcome{Allowed: true, ResetAfter: time.Millisecond}
	if got := Elapsed(admitted, 0, int64(time.Millisecond)/2); got.RetryAfter != 0 || got.ResetAfter != time.Millisecond {
		t.Errorf("an admission half a millisecond on: %+v, want no retry and a reset of 1ms", got)
	}
}

// TestDuration: whole milliseconds convert exactly, and a wait beyond the longest
// Duration saturates there.
func TestDuration(t *testing.T) {
	if got := Duration(1500); got != 1500*time.Millisecond {
		t.Errorf("Duration(1500) = %v", got)
	}
	if got := Duration(MaxScaled); got != math.MaxInt64 {
		t.Errorf("Duration(2^53) = %v, want the longest Duration", got)
	}
}

// TestTokenWait: a bucket that holds enough waits for nothing; else the lag, then the
// refill of what is missing rounded up to whole ms.
func TestTokenWait(t *testing.T) {
	for _, c := range [][5]int64{ // want, level, lag, rate, wait
		{10, 10, 5, 3, 0},
		{10, 11, 5, 3, 0},
		{10, 9, 0, 3, 1},
		{10, 4, 0, 3, 2},
		{10, 4, 7, 3, 9},
		{10, -20, 0, 3, 10}, // in debt
	} {
		if got := TokenWait(c[0], c[1], c[2], c[3]); got != c[4] {
			t.Errorf("TokenWait(%d, %d, %d, %d) = %d, want %d", c[0], c[1], c[2], c[3], got, c[4])
		}
	}
}

// TestUntilAvailable: a fixed window and a calendar period free at their end; a token bucket at its next whole
// unit, counted back from its reset (rounded up to whole ms); at least 1 ns, so that a
// header sends it; nothing for a whole budget, a rolling window or leases.
func TestUntilAvailable(t *testing.T) {
	token := ratebudget.Rule{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 3, Window: 9 * time.Second} // a unit per 3s
	fixed := ratebudget.Rule{Name: "f", Algorithm: ratebudget.FixedWindow, Limit: 3, Window: 9 * time.Second}
	rolling := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 3, Window: 9 * time.Second}
	calendar := ratebudget.Rule{Name: "c", Algorithm: ratebudget.Calendar, Limit: 3, Period: ratebudget.Day}
	for _, c := range []struct {
		r           *ratebudget.Rule
		remaining   int64
		reset, want time.Duration
	}{
		{&token, 1, 6 * time.Second, 3 * time.Second}, // two short: the first back in 3s
		{&token, 2, 3 * time.Second, 3 * time.Second},
		{&token, 0, 8*time.Second + 500*time.Microsecond, 2*time.Second + time.Millisecond}, // rounded up
		{&token, 3, 0, 0},
		{&token, 1, 3 * time.Second, time.Nanosecond}, // 1 ms early at most: never below 1ns
		{&fixed, 0, 4 * time.Second, 4 * time.Second},
		{&fixed, 3, 4 * time.Second, 0},
		{&rolling, 0, 4 * time.Second, 0},
		{&calendar, 1, 5 * time.Hour, 5 * time.Hour}, // the period's end
		{&calendar, 3, 5 * time.Hour, 0},
	} {
		if got := UntilAvailable(c.r, Capacity(c.r), c.remaining, c.reset); got != c.want {
			t.Errorf("%s, %d remaining, reset %v: %v, want %v", c.r.Name, c.remaining, c.reset, got, c.want)
		}
	}
	if got := LeaseRetry(time.Hour); got != time.Second {
		t.Errorf("LeaseRetry(1h) = %v, want 1s", got)
	}
	if got := LeaseRetry(time.Millisecond); got != time.Millisecond {
		t.Errorf("LeaseRetry(1ms) = %v, want 1ms", got)
	}
}

// TestCapacity: a rule's capacity is its Burst for a token bucket whose Burst is set, its
// Limit otherwise, and it is the Limit that ratebudget.Combine reports for the rule (the
// root package's own copy of the formula).
func TestCapacity(t *testing.T) {
	for _, c := range []struct {
		r    ratebudget.Rule
		want int64
	}{
		{ratebudget.Rule{Name: "f", Limit: 10, Window: time.Second}, 10},
		{ratebudget.Rule{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Second}, 10},
		{ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Burst: 25, Window: time.Second}, 25},
		{ratebudget.Rule{Name: "tb1", Algorithm: ratebudget.TokenBucket, Limit: 10, Burst: 1, Window: time.Second}, 1},
		{ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 7, Window: time.Second}, 7},
		{ratebudget.Rule{Name: "i", Algorithm: ratebudget.InFlight, Limit: 3, Window: time.Second}, 3},
		{ratebudget.Rule{Name: "c", Algorithm: ratebudget.Calendar, Limit: 1 << 40, Period: ratebudget.Day}, 1 << 40},
	} {
		if got := Capacity(&c.r); got != c.want {
			t.Errorf("Capacity(%s) = %d, want %d", c.r.Name, got, c.want)
		}
		d := ratebudget.Combine([]ratebudget.Check{{Rule: c.r, Cost: 1}}, []ratebudget.Outcome{{Allowed: true}})
		if d.Limit != c.want {
			t.Errorf("Combine's Limit for %s = %d, want %d", c.r.Name, d.Limit, c.want)
		}
	}
}
