package lua

// Waiting reports how many decisions wait in coalesced groups, and for how many
// signatures a call is in flight.
func Waiting(l *Limiter) (members, flights int) {
	if l.coal == nil {
		return 0, 0
	}
	for i := range l.coal.shards {
		sh := &l.coal.shards[i]
		sh.mu.Lock()
		for _, f := range sh.m {
			flights++
			if f.next != nil {
				members += len(f.next.members)
			}
		}
		sh.mu.Unlock()
	}
	return members, flights
}

// OnSeal sets a function that runs, with the shard locked, whenever a coalesced group
// is sealed to be sent, just before its sender is woken. Set it before the limiter's first decision.
func OnSeal(l *Limiter, f func()) { l.coal.sealed = f }
