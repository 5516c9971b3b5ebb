package lua

import (
	"time"

	"github.com/ratebudget/ratebudget"
)

// Waiting reports how many decisions wait in coalesced groups, and for how many
// signatures a decision is in flight.
func Waiting(l *Limiter) (members, flights int) {
	coal := coalescerOf(l)
	if coal == nil {
		return 0, 0
	}
	for i := range coal.mu {
		sh := &coal.mu[i]
		sh.Lock()
		for _, f := range sh.m {
			flights++
			if f.next != nil {
				members += len(f.next.waiting)
			}
		}
		sh.Unlock()
	}
	return members, flights
}

// OnSeal sets a function that runs, with the shard locked, whenever a coalesced group
// is sealed, just before its members are woken. Set it before the limiter's first
// decision.
func OnSeal(l *Limiter, f func()) { coalescerOf(l).sealed = f }

// coalescerOf returns l's coalescing layer, nil without WithCoalescing.
func coalescerOf(l *Limiter) *coalescer {
	top := ratebudget.Limiter(l.top)
	if l.refusals != nil {
		top = l.refusals.Inner()
	}
	c, _ := top.(*coalescer)
	return c
}

// AllowSource is allow.lua.
var AllowSource = allowSource

// TopologyError is topologyError, for tests.
var TopologyError = topologyError

// SettleSource is settle.lua as it is run: after allow.lua as a function.
var SettleSource = settleSource

// MarkerTTL is how long a reservation's marker, or a void's tombstone, is kept.
const MarkerTTL = markerTTL

// WithRefusalClock sets the refusal cache's clock: the time since any fixed origin.
func WithRefusalClock(now func() time.Duration) Option {
	return func(c *config) error {
		c.refusalClock = now
		return nil
	}
}

// Key returns the Redis key that holds c's budget.
func (l *Limiter) Key(c ratebudget.Check) string { return l.core.keys.Key(c) }

// SetClock makes l compute Calendar periods around now's readings instead of time.Now,
// as a caller whose clock is off would. Set it before the limiter's first decision.
func SetClock(l *Limiter, now func() time.Time) { l.core.now = now }

// RepairStats counts a limiter's repairs: Queued those taken on, Landed those the store
// answered, Dropped those given up, Pending those waiting or being sent.
type RepairStats struct {
	Queued, Landed, Dropped uint64
	Pending                 int
}

// RepairCounts returns l's repair counts since New.
func RepairCounts(l *Limiter) RepairStats {
	r := &l.core.repair
	r.mu.Lock()
	pending := len(r.queue) + r.sending
	r.mu.Unlock()
	return RepairStats{Queued: r.queued.Load(), Landed: r.landed.Load(), Dropped: r.dropped.Load(), Pending: pending}
}
