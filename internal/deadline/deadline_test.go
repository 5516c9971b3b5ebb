package deadline

import (
	"context"
	"testing"
	"time"
)

// TestEnded: a live context has not ended; a canceled one has, and so has one whose
// deadline has passed before its timer marked it done.
func TestEnded(t *testing.T) {
	if Ended(context.Background()) {
		t.Fatal("a context without deadline ended")
	}
	live, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if Ended(live) {
		t.Fatal("a context an hour from its deadline ended")
	}
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if !Ended(canceled) {
		t.Fatal("a canceled context has not ended")
	}
	// A deadline in the past: context.WithDeadline marks it done at once, so the clock
	// test needs a context whose Err is still nil.
	if !Ended(pastDeadline{context.Background()}) {
		t.Fatal("a context past its deadline, not yet marked done, has not ended")
	}
}

// pastDeadline is a context whose deadline has passed but whose Err is nil, as one is
// between its deadline and its timer.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Second), true }
