package meta

import (
	"math"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/problem"
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
		if got := problem.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("problem.RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if got := seconds(0); got != 0 {
		t.Errorf("seconds(0) = %d, want 0", got)
	}
	if got := seconds(1500 * time.Millisecond); got != 2 {
		t.Errorf("seconds(1.5s) = %d, want 2", got)
	}
}

func TestStructuredFieldValues(t *testing.T) {
	t.Parallel()
	policy := appendPolicy(nil, &Info{Policy: "a\"b\\c\x01", Limit: 7, Window: 1500 * time.Millisecond})
	if got, want := string(policy), `"a\"b\\c";q=7;w=2`; got != want {
		t.Errorf("policy item = %s, want %s", got, want)
	}
	rl := appendRateLimit(nil, &Info{Policy: "api", Remaining: -1, Available: 1500 * time.Millisecond}, true)
	if got, want := string(rl), `"api";r=0;t=2`; got != want {
		t.Errorf("draft-10 RateLimit item = %s, want %s", got, want)
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
		if got := seconds(d); got != want {
			t.Errorf("seconds(%d) = %d, want %d", d, got, want)
		}
		if got := problem.RetryAfterSeconds(d); got != want {
			t.Errorf("problem.RetryAfterSeconds(%d) = %d, want %d", d, got, want)
		}
	}
	if got := seconds(most - most%time.Second); got != want-1 {
		t.Errorf("seconds of a whole number of seconds: %d, want %d", got, want-1)
	}
}

// The IETF fields are RFC 9651 structured fields, whose integers have at most 15 digits:
// a larger q or r would make a recipient discard the whole field, so they are clamped
// to the largest sf-integer.
func TestStructuredFieldIntegerRange(t *testing.T) {
	t.Parallel()
	in := &Info{Policy: "p", Limit: math.MaxInt64, Remaining: 1e15, Window: time.Duration(math.MaxInt64), Available: time.Duration(math.MaxInt64)}
	if got, want := string(appendPolicy(nil, in)), `"p";q=999999999999999;w=9223372037`; got != want {
		t.Errorf("policy item = %s, want %s", got, want)
	}
	if got, want := string(appendRateLimit(nil, in, false)), `"p";r=999999999999999;t=9223372036`; got != want {
		t.Errorf("RateLimit item = %s, want %s", got, want)
	}
	in.Remaining = 999999999999999
	if got, want := string(appendRateLimit(nil, in, true)), `"p";r=999999999999999;t=9223372037`; got != want {
		t.Errorf("draft-10 RateLimit item = %s, want %s", got, want)
	}
}
