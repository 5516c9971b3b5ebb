package refusal

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// Limiter is a refusal cache in front of another limiter: a refusal that the inner
// limiter decided with a wait is repeated, without asking it, for requests of the
// refused cost on the same budget (of at least that cost under a fixed window) until
// the wait is over, for at most [MaxRepeat] (see the package documentation for why this
// is exact). It is safe for concurrent use.
//
// AllowEach repeats a refusal with every check's outcome only for the very checks
// (budgets, costs, order) the store refused, while no check's budget was spent or given
// back through this limiter since, and before any refused check's wait is over; else
// it asks the inner limiter. Spends are tracked in a fixed table of generations
// (genSlots counters, bumped per budget on every admission and settle seen while the
// cache holds refusals): a collision only sends a request to the store. Spends by
// other processes, and by this one while a refusal is on its way back from the store,
// are not seen: the outcomes are then a snapshot, as a refusal's report already is.
type Limiter struct {
	inner  Inner
	cache  *Cache
	s1, s2 maphash.Seed
	gens   [genSlots]atomic.Uint64
	// backs counts give-backs ([Limiter.GaveBack]); backAt holds, per slot of gens, the
	// count at the slot's latest give-back, so that a refusal decided before a give-back
	// of its budget is not cached once that give-back has dropped the budget's refusals.
	backs  atomic.Uint64
	backAt [genSlots]atomic.Uint64
}

// genSlots is the size of a Limiter's table of generations.
const genSlots = 1024

// Inner is the limiter a refusal cache is in front of.
type Inner interface {
	ratebudget.Limiter
	AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
}

// Wrap returns a refusal cache of at most maxEntries refusals in front of inner. now,
// when not nil, is the cache's clock, read for every decision (the time since any fixed
// origin, never going back; it must be safe for concurrent use); nil is the monotonic
// clock.
func Wrap(inner Inner, maxEntries int, now func() time.Duration) *Limiter {
	c := New(maxEntries)
	c.clock = now
	return &Limiter{inner: inner, cache: c, s1: maphash.MakeSeed(), s2: maphash.MakeSeed()}
}

// Inner returns the limiter the cache is in front of.
func (l *Limiter) Inner() Inner { return l.inner }

// keyLen is the length of a check's cache key: two 64-bit seeded hashes of the check's
// budget (rule name and algorithm, identity and scope: what names its budget in the
// store), then one of the rule's parameters (Limit, Window, Burst, and a Calendar rule's
// Period, WeekStart and Location's name; see budgetLen), so that a key's size does
// not depend on the identity's and a collision cannot be searched for without the
// seeds.
const keyLen = budgetLen + 8

// key appends the cache key of c's budget to dst; buf is a reusable buffer, returned
// grown.
func (l *Limiter) key(dst, buf []byte, c *ratebudget.Check) ([]byte, []byte) {
	r := &c.Rule
	buf = binary.AppendUvarint(buf[:0], uint64(len(r.Name)))
	buf = append(buf, r.Name...)
	buf = binary.AppendUvarint(buf, uint64(r.Algorithm))
	buf = binary.AppendUvarint(buf, uint64(len(c.Identity)))
	buf = append(buf, c.Identity...)
	buf = append(buf, c.Scope...)
	dst = binary.LittleEndian.AppendUint64(dst, maphash.Bytes(l.s1, buf))
	dst = binary.LittleEndian.AppendUint64(dst, maphash.Bytes(l.s2, buf))
	buf = binary.AppendUvarint(buf[:0], uint64(r.Limit))
	buf = binary.AppendUvarint(buf, uint64(r.Window))
	buf = binary.AppendUvarint(buf, uint64(r.Burst))
	if r.Algorithm == ratebudget.Calendar {
		// Rules that differ only in their periods never share a refusal.
		buf = append(buf, r.Period...)
		buf = append(buf, 0, byte(r.WeekStart))
		if r.Location != nil {
			buf = append(buf, r.Location.String()...)
		}
	}
	dst = binary.LittleEndian.AppendUint64(dst, maphash.Bytes(l.s1, buf))
	return dst, buf
}

// Allow repeats a cached refusal for checks, or asks the inner limiter and remembers
// its refusal. An invalid request is never answered from the cache.
func (l *Limiter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	var keys, buf []byte
	sent, backs := l.cache.Now(), l.backs.Load()
	if !l.cache.Empty() {
		var d ratebudget.Decision
		var ok bool
		if d, keys, buf, ok = l.cached(checks, sent); ok {
			return d, nil
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
			l.spent(keys[keyLen*i : keyLen*(i+1)])
		}
	case storable(d, len(checks)):
		// d reports the outcome the inner limiter decided for checks[d.Index].
		var k []byte
		if keys != nil {
			k = keys[keyLen*d.Index : keyLen*(d.Index+1)]
		} else {
			k, _ = l.key(nil, buf, &checks[d.Index])
		}
		l.cache.StoreIf(k, checks[d.Index].Cost, sent, d, nil, l.noBackSince(k, backs))
	}
	return d, nil
}

// cached looks the checks' budgets up at sent: it returns the cached refusal with the
// longest wait, when one is found, no check exceeds its capacity (which makes the
// decision Exceeded, which no cached refusal reports: the inner limiter decides it)
// and the checks are valid; and the checks' keys, and the key buffer, it built.
func (l *Limiter) cached(checks []ratebudget.Check, sent int64) (best ratebudget.Decision, keys, buf []byte, ok bool) {
	keys = make([]byte, 0, keyLen*len(checks))
	found, exceeded := false, false
	for i := range checks {
		c := &checks[i]
		keys, buf = l.key(keys, buf, c)
		exceeded = exceeded || c.Cost > timerule.Capacity(&c.Rule)
		d, hit := l.cache.Lookup(keys[keyLen*i:keyLen*(i+1)], c.Cost, sameCost(&c.Rule), sent)
		if hit && (!found || d.RetryAfter > best.RetryAfter) {
			d.Index = i
			best, found = d, true
		}
	}
	return best, keys, buf, found && !exceeded && ratebudget.ValidateChecks(checks) == nil
}

// storable reports whether d, the inner limiter's decision of n checks, is a refusal
// with a wait, of a check it names: one to cache.
func storable(d ratebudget.Decision, n int) bool {
	return !d.Allowed && !d.Exceeded && d.RetryAfter > 0 && d.Index >= 0 && d.Index < n
}

// ForgetChecks drops the refusals cached for the budgets of checks: they were spent by
// an admission decided without the cache (a reservation's, a lease's), so that a cached
// refusal no longer reports them as they are. After a give-back, call GaveBack.
func (l *Limiter) ForgetChecks(checks []ratebudget.Check) {
	if l.cache.Empty() {
		return
	}
	var key, buf []byte
	for i := range checks {
		key, buf = l.key(key[:0], buf, &checks[i])
		l.spent(key)
	}
}

// GaveBack drops the refusals cached for the budgets of checks, as ForgetChecks does,
// when budget was given back to them (a settle): a refusal that Redis decided before the
// give-back and that reaches the cache after it is not cached either, since its wait
// may no longer hold.
func (l *Limiter) GaveBack(checks []ratebudget.Check) {
	var key, buf []byte
	for i := range checks {
		key, buf = l.key(key[:0], buf, &checks[i])
		// The count is raised before the refusal is dropped (under its shard's lock,
		// even when the cache looks empty), and a refusal is stored only while its
		// slot's count is the one read before its request was sent, under that lock:
		// it is either dropped or never stored.
		at := &l.backAt[genSlot(key)]
		for v := l.backs.Add(1); ; {
			old := at.Load()
			if old >= v || at.CompareAndSwap(old, v) {
				break
			}
		}
		l.cache.forget(key)
		l.gens[genSlot(key)].Add(1)
	}
}

// noBackSince returns whether no budget of key's slot was given back since the count of
// give-backs was backs.
func (l *Limiter) noBackSince(key []byte, backs uint64) func() bool {
	at := &l.backAt[genSlot(key)]
	return func() bool { return at.Load() <= backs }
}

// spent records that the budget of key was spent or given back: its refusal, if any,
// is dropped, and snapshots that include it no longer hold.
func (l *Limiter) spent(key []byte) {
	l.cache.Forget(key)
	l.gens[genSlot(key)].Add(1)
}

// sameCost reports whether a refusal under r repeats for its own cost only: a fixed
// window's and a calendar period's wait is its end whatever the cost, a token bucket's
// and a rolling window's grow with it.
func sameCost(r *ratebudget.Rule) bool {
	return r.Algorithm != ratebudget.FixedWindow && r.Algorithm != ratebudget.Calendar
}

func genSlot(key []byte) uint64 { return binary.LittleEndian.Uint64(key) % genSlots }

// AllowEach is Allow, reporting every check's outcome in outs (len(checks) elements;
// see Limiter for when a cached refusal answers).
func (l *Limiter) AllowEach(ctx context.Context, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	if len(outs) != len(checks) || len(checks) == 0 {
		return l.inner.AllowEach(ctx, checks, outs) // it reports the error
	}
	sent, backs := l.cache.Now(), l.backs.Load()
	// The checks' keys, then their costs: the snapshot's Checks.
	var kb [4 * (keyLen + 8)]byte
	sig, buf := kb[:0], []byte(nil)
	for i := range checks {
		sig, buf = l.key(sig, buf, &checks[i])
	}
	keys := sig[:keyLen*len(checks)]
	for i := range checks {
		sig = binary.LittleEndian.AppendUint64(sig, uint64(checks[i].Cost))
	}
	var gb [4]uint64
	gens := gb[:0]
	for i := range checks {
		gens = append(gens, l.gens[genSlot(keys[keyLen*i:])].Load())
	}
	if !l.cache.Empty() && l.repeat(checks, outs, keys, sig, gens, sent) {
		return ratebudget.Combine(checks, outs), nil
	}
	d, err := l.inner.AllowEach(ctx, checks, outs)
	if err != nil {
		return d, err
	}
	switch {
	case d.Allowed:
		for i := 0; i < len(checks) && !l.cache.Empty(); i++ {
			l.spent(keys[keyLen*i : keyLen*(i+1)])
		}
	case storable(d, len(checks)):
		snap := &Snapshot{Checks: string(sig), Outs: append([]ratebudget.Outcome(nil), outs...), Sent: sent, Gens: append([]uint64(nil), gens...)}
		k := keys[keyLen*d.Index : keyLen*(d.Index+1)]
		l.cache.StoreIf(k, checks[d.Index].Cost, sent, d, snap, l.noBackSince(k, backs))
	}
	return d, nil
}

// repeat sets outs to the outcomes of a cached refusal's snapshot of the very checks
// (keys, their signature sig, and their generations gens) as of sent, and reports
// whether it found one that holds (see holds). It finds none when a check exceeds its
// capacity, or for invalid checks.
func (l *Limiter) repeat(checks []ratebudget.Check, outs []ratebudget.Outcome, keys, sig []byte, gens []uint64, sent int64) bool {
	for i := range checks {
		if checks[i].Cost > timerule.Capacity(&checks[i].Rule) {
			return false
		}
	}
	for i := range checks {
		_, snap, ok := l.cache.LookupEach(keys[keyLen*i:keyLen*(i+1)], checks[i].Cost, sameCost(&checks[i].Rule), sent)
		if !ok || !l.holds(snap, sig, gens, sent) || ratebudget.ValidateChecks(checks) != nil {
			continue
		}
		for j := range outs {
			outs[j] = timerule.Elapsed(snap.Outs[j], snap.Sent, sent)
		}
		return true
	}
	return false
}

// holds reports whether snap gives the outcomes of the checks named sig, whose
// generations are gens, at now: the same checks, none spent since, and every refused
// check's wait still running (after it, that check might be admitted).
func (l *Limiter) holds(snap *Snapshot, sig []byte, gens []uint64, now int64) bool {
	if snap == nil || snap.Checks != string(sig) || len(snap.Outs) != len(gens) {
		return false
	}
	for j, o := range snap.Outs {
		if snap.Gens[j] != gens[j] || !o.Allowed && snap.Sent+int64(o.RetryAfter) <= now {
			return false
		}
	}
	return true
}
