package refusal

import (
	"context"
	"encoding/binary"
	"hash/maphash"

	"github.com/ratebudget/ratebudget"
)

// Limiter is a refusal cache in front of another limiter: a refusal that the inner
// limiter decided with a wait is repeated, without asking it, for requests of at least
// the refused cost on the same budget until the wait is over (see the package
// documentation for why this is exact). It is safe for concurrent use.
type Limiter struct {
	inner  ratebudget.Limiter
	cache  *Cache
	s1, s2 maphash.Seed
}

// Wrap returns a refusal cache of at most maxEntries refusals in front of inner.
func Wrap(inner ratebudget.Limiter, maxEntries int) *Limiter {
	return &Limiter{inner: inner, cache: New(maxEntries), s1: maphash.MakeSeed(), s2: maphash.MakeSeed()}
}

// keyLen is the length of a budget's cache key: two 64-bit seeded hashes of the check's
// budget (rule parameters, identity and scope), so that a key's size does not depend on
// the identity's and a collision cannot be searched for without the seeds.
const keyLen = 16

// key appends the cache key of c's budget to dst; buf is a reusable buffer, returned
// grown.
func (l *Limiter) key(dst, buf []byte, c *ratebudget.Check) ([]byte, []byte) {
	r := &c.Rule
	buf = binary.AppendUvarint(buf[:0], uint64(len(r.Name)))
	buf = append(buf, r.Name...)
	buf = binary.AppendUvarint(buf, uint64(r.Algorithm))
	buf = binary.AppendUvarint(buf, uint64(r.Limit))
	buf = binary.AppendUvarint(buf, uint64(r.Window))
	buf = binary.AppendUvarint(buf, uint64(r.Burst))
	buf = binary.AppendUvarint(buf, uint64(len(c.Identity)))
	buf = append(buf, c.Identity...)
	buf = append(buf, c.Scope...)
	dst = binary.LittleEndian.AppendUint64(dst, maphash.Bytes(l.s1, buf))
	dst = binary.LittleEndian.AppendUint64(dst, maphash.Bytes(l.s2, buf))
	return dst, buf
}

// Allow repeats a cached refusal for checks, or asks the inner limiter and remembers
// its refusal. An invalid request is never answered from the cache.
func (l *Limiter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	var keys, buf []byte
	sent := l.cache.Now()
	if !l.cache.Empty() {
		keys = make([]byte, 0, keyLen*len(checks))
		found, exceeded := false, false
		var best ratebudget.Decision
		for i := range checks {
			c := &checks[i]
			keys, buf = l.key(keys, buf, c)
			// A check that exceeds its capacity makes the decision Exceeded, which no
			// cached refusal reports: the inner limiter decides it.
			exceeded = exceeded || c.Cost > c.Rule.Capacity()
			d, ok := l.cache.Lookup(keys[keyLen*i:keyLen*(i+1)], c.Cost, sent)
			if ok && (!found || d.RetryAfter > best.RetryAfter) {
				d.Index = i
				best, found = d, true
			}
		}
		if found && !exceeded && ratebudget.ValidateChecks(checks) == nil {
			return best, nil
		}
	}
	d, err := l.inner.Allow(ctx, checks)
	if err != nil {
		return d, err
	}
	switch {
	case d.Allowed:
		// The spend makes any refusal cached for these budgets a stale report.
		for i := 0; i < len(checks) && !l.cache.Empty(); i++ {
			if keys == nil {
				keys = make([]byte, 0, keyLen*len(checks))
				for j := range checks {
					keys, buf = l.key(keys, buf, &checks[j])
				}
			}
			l.cache.Forget(keys[keyLen*i : keyLen*(i+1)])
		}
	case !d.Exceeded && d.RetryAfter > 0 && d.Index >= 0 && d.Index < len(checks):
		// d reports the outcome the inner limiter decided for checks[d.Index].
		var k []byte
		if keys != nil {
			k = keys[keyLen*d.Index : keyLen*(d.Index+1)]
		} else {
			k, _ = l.key(nil, buf, &checks[d.Index])
		}
		l.cache.Store(k, checks[d.Index].Cost, sent, d)
	}
	return d, nil
}

// ForgetChecks drops the refusals cached for the budgets of checks: budget was given
// back to them (a settled decision), so that a cached wait may no longer hold.
func (l *Limiter) ForgetChecks(checks []ratebudget.Check) {
	if l.cache.Empty() {
		return
	}
	var key, buf []byte
	for i := range checks {
		key, buf = l.key(key[:0], buf, &checks[i])
		l.cache.Forget(key)
	}
}
