package problem

import (
	"math"
	"testing"
	"time"
)

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 1}, {-time.Second, 1}, {time.Nanosecond, 1}, {999 * time.Millisecond, 1},
		{time.Second, 1}, {time.Second + time.Millisecond, 2}, {59*time.Second + 1, 60}, {time.Hour, 3600},
	} {
		if got := RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if got := Seconds(0); got != 0 {
		t.Errorf("seconds(0) = %d, want 0", got)
	}
	if got := Seconds(1500 * time.Millisecond); got != 2 {
		t.Errorf("seconds(1.5s) = %d, want 2", got)
	}
}

// A duration near its maximum (time.Duration(math.MaxInt64) is a common "forever") is
// rounded up without overflow: Retry-After is never 1 for a wait of centuries, and no
// seconds value is negative.
func TestSecondsHuge(t *testing.T) {
	t.Parallel()
	const most = time.Duration(math.MaxInt64)
	want := int64(most/time.Second) + 1 // 9223372036.854775807 s, rounded up
	for _, d := range []time.Duration{most, most - time.Second/2, most - 1} {
		if got := Seconds(d); got != want {
			t.Errorf("seconds(%d) = %d, want %d", d, got, want)
		}
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%d) = %d, want %d", d, got, want)
		}
	}
	if got := Seconds(most - most%time.Second); got != want-1 {
		t.Errorf("seconds of a whole number of seconds: %d, want %d", got, want-1)
	}
}
