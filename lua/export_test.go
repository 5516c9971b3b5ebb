package lua

// Waiting reports how many decisions wait in coalesced groups, and for how many
// signatures a decision is in flight.
func Waiting(l *Limiter) (members, flights int) {
	if l.coal == nil {
		return 0, 0
	}
	for i := range l.coal.mu {
		sh := &l.coal.mu[i]
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
func OnSeal(l *Limiter, f func()) { l.coal.sealed = f }

// AllowSource is allow.lua.
var AllowSource = allowSource

// TopologyError is topologyError, for tests.
var TopologyError = topologyError

// SettleSource is settle.lua as it is run: after allow.lua as a function.
var SettleSource = settleSource

// MarkerTTL is how long a reservation's marker, or a void's tombstone, is kept.
const MarkerTTL = markerTTL
