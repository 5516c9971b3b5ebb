package headers

import (
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
		if got := retryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
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
	policy := appendPolicy(nil, &Info{Policy: "a\"b\\c\x01", Limit: 7, Window: 1500 * time.Millisecond}, false)
	if got, want := string(policy), `"a\"b\\c";q=7;w=2`; got != want {
		t.Errorf("policy item = %s, want %s", got, want)
	}
	rl := appendRateLimit(nil, &Info{Policy: "api", Remaining: -1}, true)
	if got, want := string(rl), `"api";r=0;t=0`; got != want {
		t.Errorf("draft-10 RateLimit item = %s, want %s", got, want)
	}
}
