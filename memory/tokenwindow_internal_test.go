package memory

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// maxWindow is the longest Window that [ratebudget.Rule.Validate] accepts.
const maxWindow = 366 * 24 * time.Hour

// TestTokenBucketWindowChangeKeepsPartialToken: a token half refilled under one Window is
// half a token under the next: under 100 an hour, one spent, then 18s later (half of it
// back) one more, the bucket is 1.5 tokens short; under 100 a day too, where half a
// token takes 432s (though the bucket is full in 54s, when the hour's state expires); a
// Window changed back and forth keeps it, and the waits say so at each rate. (The time since the last write refills at the rate of the rule deciding.)
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
	// Half a token is 432s under 100 a day, but the bucket written under 100 an hour is
	// full in 54s (1.5 tokens at 36s), when its state expires: the wait is that.
	if o := decide(day, 99); o.Allowed || o.Remaining != 98 || o.RetryAfter != 54*time.Second {
		t.Fatalf("under 100 a day: %+v, want refused, 98 remaining, retry after 54s (the bucket's expiry)", o)
	}
	if o := decide(day, 98); !o.Allowed || o.ResetAfter != 99*864*time.Second+432*time.Second {
		t.Fatalf("under 100 a day: %+v, want admitted, full in 99.5 tokens at 864s", o)
	}
	if o := decide(hour, 1); o.Allowed || o.Remaining != 0 || o.RetryAfter != 18*time.Second || o.ResetAfter != 99*36*time.Second+18*time.Second {
		t.Fatalf("back under 100 an hour: %+v, want refused, retry after 18s, full after 99.5 tokens at 36s", o)
	}
}
