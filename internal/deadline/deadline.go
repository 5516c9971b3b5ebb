// Package deadline tells whether a context has ended, as a failure caused by its
// deadline sees it.
package deadline

import (
	"context"
	"time"
)

// Ended reports whether ctx is done or its deadline has passed. A call cut short by the
// deadline (a client's socket deadline, set from the context's) can return before the
// context's timer has marked it done: for what the failure says, the context has ended
// all the same. It reads the clock when ctx has a deadline and is not done: ask it of a
// failed call, not on every request.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
