package middleware

import (
	"math/bits"

	"github.com/ratebudget/ratebudget"
)

// tighter reports whether admitted decision a reports a more restrictive rule than b:
// a smaller share of its capacity left (Remaining/Limit), or the same share and a longer
// reset. It is the comparison ratebudget.Combine makes among one limiter's checks, made
// across limiters, so that rules of different units (requests, tokens, bytes) compare
// like with like.
func tighter(a, b *ratebudget.Decision) bool {
	// a.Remaining/a.Limit < b.Remaining/b.Limit, exactly: every factor is below 2^40.
	ahi, alo := bits.Mul64(uint64(max(a.Remaining, 0)), uint64(max(b.Limit, 1)))
	bhi, blo := bits.Mul64(uint64(max(b.Remaining, 0)), uint64(max(a.Limit, 1)))
	if ahi != bhi {
		return ahi < bhi
	}
	if alo != blo {
		return alo < blo
	}
	return a.ResetAfter > b.ResetAfter
}
