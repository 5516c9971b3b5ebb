package memory

import (
	"context"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/argcheck"
)

// Reset forgets the state of each check's budget, as "Resetting a budget" in the
// [ratebudget] package documentation describes: the budget's next decision is made as
// on a budget never spent. Cost is ignored. The checks' budgets are reset together, atomically: the shards of every check are locked
// at once, so that a concurrent decision sees all of them reset or none. It returns a
// *[ratebudget.ConfigError] for no checks or an invalid rule, and no other error; the
// context is not consulted. It allocates nothing for checks whose identity and scope
// are at most 256 bytes together.
func (m *Limiter) Reset(_ context.Context, checks ...ratebudget.Check) error {
	m.ready()
	if err := argcheck.Reset(checks); err != nil {
		return err
	}
	var kbuf [8]memKey
	var hbuf [8]uint64
	var sbuf [8]int
	keys, hashes, shards := m.locate(checks, kbuf[:0], hbuf[:0], sbuf[:0])
	now := m.now()
	locked := m.lock(shards, now)
	for i := range checks {
		m.shards[shards[i]].forget(hashes[i], &keys[i], now)
	}
	m.unlock(&locked)
	return nil
}

// forget gives the budget of k (hash h), if the shard holds it, the state of no state
// at all at now, which the sweep then drops; s.mu is held. It does not mark the budget
// used.
func (s *memShard) forget(h uint64, k *memKey, now int64) {
	for b := s.chain(h); b != nil; b = b.next {
		if b.is(k) {
			// A closed fixed window, a bucket without deficit (full from its expiry on),
			// no rolling-window event and no lease.
			b.count, b.end, b.expires = 0, now, now
			if b.rolling != nil {
				b.rolling.events = b.rolling.events[:0]
			}
			return
		}
	}
}
