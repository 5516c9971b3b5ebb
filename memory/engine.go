package memory

import (
	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// budget is one budget's in-process state. Which fields are used depends on the rule's
// algorithm; all times are Unix milliseconds. It is kept small (112 bytes on 64-bit
// platforms): every tracked identity costs one.
type budget struct {
	// FixedWindow: count admitted in the window that ends at end.
	// TokenBucket: count is the deficit (full - level) in scaled units (tokens × window
	// ms, of the Window in winHi and winLo) at time end, as the Redis limiter keeps it: a
	// rule whose Burst or Window changes under the same name keeps what was spent, in
	// tokens, whatever its capacity or window (see tokenLevel and
	// timerule.ConvertDeficit).
	// RollingWindow: count is the sum of the events' costs.
	// InFlight: unused.
	// Calendar: count admitted in the calendar period [end, expires): end holds the
	// period's start.
	count, end int64
	// expires is when the state becomes equal to no state at all and can be dropped.
	expires int64
	// name, identity, scope, algo and digest are the budget's key (see memKey), h its
	// hash.
	name, identity, scope string
	h                     uint64
	// rolling holds a RollingWindow budget's events, or an InFlight budget's leases (nil
	// for the other algorithms, and until the first admission).
	rolling *rollingEvents
	// next is the budget whose key hashes alike (see memShard), newer the next budget in
	// its shard's queue, oldest first.
	next, newer *budget
	algo        ratebudget.Algorithm
	digest      bool
	// marks holds marked (set by every lookup that finds the budget and cleared when the
	// shard's eviction hand passes it over, see memShard.makeRoom) and sharedHash (set
	// once another budget has had the same hash, see memShard.unchain).
	marks uint8
	// winHi<<32 | winLo is a TokenBucket's Window in ms, the unit of its deficit (35 bits
	// for 366 days; 0 until the first write). They fill what would be padding.
	winHi uint8
	winLo uint32
}

// budget marks.
const (
	marked     = 1 << iota // used since the eviction hand last passed it
	sharedHash             // another budget has had the same hash
)

// window is the Window (ms) of b's token-bucket deficit, 0 when none was written.
func (b *budget) window() int64 { return int64(b.winHi)<<32 | int64(b.winLo) }

// setWindow records w (ms, below 2^40) as the Window of b's token-bucket deficit.
func (b *budget) setWindow(w int64) { b.winHi, b.winLo = uint8(w>>32), uint32(w) }

// is reports whether b is the budget of k.
func (b *budget) is(k *memKey) bool {
	return b.algo == k.algo && b.digest == k.digest && b.name == k.name && b.scope == k.scope && b.identity == k.identity
}

// rollingEvents are a RollingWindow budget's admitted events, oldest first, one per
// millisecond, each with the cumulative cost admitted up to and including it; or an
// InFlight budget's leases, in order of expiry, each an event whose at is the lease's
// expiry and n the lease's number.
//
// A rolling window's cumulative sums start from base, the sum before events[0]: the cost
// of events[i] is events[i].n minus events[i-1].n (base for the first), the cost of the
// events up to i is events[i].n - base, and b.count is the newest event's n - base. So a
// refusal finds the event whose leaving frees enough by a binary search, where summing
// the costs would take time in proportion to the log. Sums are only ever compared as
// differences, which stay below 2^43 (a window holds at most twice its Limit): they are
// exact even after a long-lived budget's sums have wrapped past the int64 range (Go
// defines signed overflow to wrap).
type rollingEvents struct {
	events []event
	base   int64
}

// event is a rolling-window event (n: the cumulative cost, see rollingEvents) or a lease
// (n: its number).
type event struct{ at, n int64 }

// costOf is the cost of the rolling-window event at i.
func (r *rollingEvents) costOf(i int) int64 {
	if i == 0 {
		return r.events[0].n - r.base
	}
	return r.events[i].n - r.events[i-1].n
}

// trimRolling drops b's rolling-window events that left the window (now-w, now] and
// takes their cost off b.count. It returns the events still held. Dropping k events
// costs O(k): the log is resliced, not copied (append reallocates it, live events only,
// when it reaches the end of its array).
func (b *budget) trimRolling(now, w int64) []event {
	r := b.rolling
	ev := r.events
	n := 0
	for n < len(ev) && ev[n].at <= now-w {
		n++
	}
	if n == 0 {
		return ev
	}
	b.count -= ev[n-1].n - r.base
	r.base = ev[n-1].n
	if n == len(ev) {
		ev = ev[:0] // empty: reuse the array from its start
	} else {
		ev = ev[n:]
	}
	r.events = ev
	return ev
}

// addRolling records cost admitted (or charged) at at, which no event of b follows, into
// b's log, merging it into the newest event when that is of the same millisecond.
func (b *budget) addRolling(at, cost int64) {
	if b.rolling == nil {
		b.rolling = &rollingEvents{}
	}
	r := b.rolling
	acc := r.base + b.count + cost
	if n := len(r.events); n > 0 && r.events[n-1].at == at {
		r.events[n-1].n = acc
	} else {
		r.events = append(r.events, event{at: at, n: acc})
	}
	b.count += cost
}

// freedBy returns the index of the oldest rolling-window event of r whose leaving the
// window frees at least need (the events up to it cost at least need), or len(events)
// when all of them free less.
func (r *rollingEvents) freedBy(need int64) int {
	ev := r.events
	lo, hi := 0, len(ev)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if ev[mid].n-r.base >= need {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// decide computes the outcome of spending cost under r at now (Unix ms) from state b
// (nil: none). When commit is true and the outcome is an admission it writes the new
// state into *b, which must then be non-nil (a budget just created must first be given
// the state of no state at all, see freshState); an InFlight admission takes lease as its
// lease's number, and a Calendar rule finds its period in cal. A refusal never writes, apart from dropping rolling-window events and
// leases that have expired, which changes no outcome.
func decide(b *budget, r *ratebudget.Rule, cost, now int64, commit bool, lease int64, cal *timerule.PeriodCache) ratebudget.Outcome {
	switch r.Algorithm {
	case ratebudget.Calendar:
		return decideCalendar(b, r, cost, now, commit, cal)
	case ratebudget.TokenBucket:
		return decideToken(b, r, cost, now, commit)
	case ratebudget.RollingWindow:
		return decideRolling(b, r, cost, now, commit)
	case ratebudget.InFlight:
		return decideInFlight(b, r, now, commit, lease)
	}
	return decideFixed(b, r, cost, now, commit)
}

func decideFixed(b *budget, r *ratebudget.Rule, cost, now int64, commit bool) ratebudget.Outcome {
	limit, w := r.Limit, r.Window.Milliseconds()
	count, end := int64(0), now+w
	if b != nil && now < b.end {
		count, end = b.count, b.end
	}
	if cost > limit {
		reset := int64(0) // an untouched window resets nothing
		if count != 0 {
			reset = end - now
		}
		return ratebudget.Outcome{Exceeded: true, Remaining: limit - count, ResetAfter: timerule.Duration(reset)}
	}
	if count+cost > limit {
		return ratebudget.Outcome{Remaining: limit - count, ResetAfter: timerule.Duration(end - now), RetryAfter: timerule.Duration(end - now)}
	}
	if commit {
		b.count, b.end, b.expires = count+cost, end, end
	}
	return ratebudget.Outcome{Allowed: true, Remaining: limit - count - cost, ResetAfter: timerule.Duration(end - now)}
}

// decideCalendar counts as decideFixed does, in the calendar period that contains now
// rather than a window opened by the first admission: the budget's count holds while its
// period's start (b.end) is the start of the period of now, as the Redis limiter's does,
// and a request of another period starts at 0. Reset and retry are at the period's end.
// It repeats decideFixed's three outcomes on purpose: one function shared by both cost a
// fixed window's decision 8% (BenchmarkMemoryAllow/fixed 119 to 129 ns, alternated).
func decideCalendar(b *budget, r *ratebudget.Rule, cost, now int64, commit bool, cal *timerule.PeriodCache) ratebudget.Outcome {
	limit := r.Limit
	count := int64(0)
	start, end := cal.Of(r, now)
	if b != nil && b.end == start && now < b.expires {
		count = b.count
	}
	if cost > limit {
		reset := int64(0) // an untouched period resets nothing
		if count != 0 {
			reset = end - now
		}
		return ratebudget.Outcome{Exceeded: true, Remaining: limit - count, ResetAfter: timerule.Duration(reset)}
	}
	if count+cost > limit {
		return ratebudget.Outcome{Remaining: limit - count, ResetAfter: timerule.Duration(end - now), RetryAfter: timerule.Duration(end - now)}
	}
	if commit {
		b.count, b.end, b.expires = count+cost, start, end
	}
	return ratebudget.Outcome{Allowed: true, Remaining: limit - count - cost, ResetAfter: timerule.Duration(end - now)}
}

func decideToken(b *budget, r *ratebudget.Rule, cost, now int64, commit bool) ratebudget.Outcome {
	rate, w := r.Limit, r.Window.Milliseconds()
	capacity := timerule.Capacity(r)
	full := capacity * w   // fits: Validate bounds it by 2^53
	d, ts := int64(0), now // the deficit, and the time it is measured at
	lag := int64(0)        // how far the clock is behind the bucket's timestamp
	if b != nil {
		// As tokenLevel reads it, written out here: the call, which the compiler does not
		// inline, cost a single-check decision 8-35% in BenchmarkMemoryAllow/token.
		var elapsed int64
		elapsed, lag = timerule.SinceWrite(b.end, now)
		ts = max(b.end, now)
		d = b.count
		if bw := b.window(); bw != w && d > 0 {
			d = timerule.ConvertDeficit(d, bw, w) // the Window changed under the same name
		}
		// Full once refilled at this rule's rate, or at the latest when the rule that
		// wrote the bucket would have refilled it (its expiry, as a Redis key's: a
		// Limit lowered under the same name), whether or not the sweep dropped it.
		if now >= b.expires {
			d = 0
		} else {
			d = timerule.RefilledDeficit(d, elapsed, rate, full)
		}
	}
	level := full - d
	// A refusal's waits end, at the latest, when the bucket is full by its expiry (a
	// rate lowered since the write: the state is dropped then, as a Redis key expires).
	expiry := int64(-1)
	if b != nil && b.expires > now {
		expiry = b.expires - now
	}
	if cost > capacity {
		return ratebudget.Outcome{Exceeded: true, Remaining: timerule.Tokens(level, w), ResetAfter: timerule.Duration(timerule.UntilExpiry(timerule.TokenWait(full, level, lag, rate), expiry))}
	}
	need := cost * w
	if level < need {
		return ratebudget.Outcome{
			Remaining:  timerule.Tokens(level, w),
			ResetAfter: timerule.Duration(timerule.UntilExpiry(timerule.TokenWait(full, level, lag, rate), expiry)),
			RetryAfter: timerule.Duration(timerule.UntilExpiry(timerule.TokenWait(need, level, lag, rate), expiry)),
		}
	}
	level -= need
	toFull := timerule.TokenWait(full, level, lag, rate)
	if commit {
		b.count, b.end, b.expires = full-level, ts, now+toFull
		b.setWindow(w)
	}
	return ratebudget.Outcome{Allowed: true, Remaining: timerule.Tokens(level, w), ResetAfter: timerule.Duration(toFull)}
}

func decideRolling(b *budget, r *ratebudget.Rule, cost, now int64, commit bool) ratebudget.Outcome {
	limit, w := r.Limit, r.Window.Milliseconds()
	var sum, last int64
	var events []event
	if b != nil && b.rolling != nil {
		events = b.trimRolling(now, w)
		sum = b.count
		if len(events) > 0 {
			last = events[len(events)-1].at
		}
	}
	at := max(now, last) // keep events in order if the clock went back
	reset := int64(0)
	if len(events) > 0 {
		reset = timerule.LeavesAfter(last, w, now)
	}
	if cost > limit {
		return ratebudget.Outcome{Exceeded: true, Remaining: limit - sum, ResetAfter: timerule.Duration(reset)}
	}
	if sum+cost > limit {
		// The oldest event whose leaving frees enough (there is one: cost <= limit, so
		// what is needed is at most sum, and sum > 0 means events).
		retry := reset
		if len(events) > 0 {
			if i := b.rolling.freedBy(sum + cost - limit); i < len(events) {
				retry = timerule.LeavesAfter(events[i].at, w, now)
			}
		}
		return ratebudget.Outcome{Remaining: limit - sum, ResetAfter: timerule.Duration(reset), RetryAfter: timerule.Duration(retry)}
	}
	if commit {
		b.addRolling(at, cost)
		b.expires = at + w
	}
	return ratebudget.Outcome{Allowed: true, Remaining: limit - sum - cost, ResetAfter: timerule.Duration(timerule.LeavesAfter(at, w, now))}
}
