package memory

import "time"

// WithSweepInterval sets how often each shard of the limiter starts dropping expired
// state, in whole milliseconds, at least 1 (otherwise every 10s): tests make sweeps
// frequent, or rare.
func WithSweepInterval(d time.Duration) Option {
	return func(m *Limiter) error {
		m.sweep = max(d.Milliseconds(), 1)
		return nil
	}
}

// Len reports the number of budgets currently held, expired ones not yet swept included.
func (m *Limiter) Len() int { return int(m.sumShards(func(s *memShard) uint64 { return uint64(s.n) })) }

// Evictions reports the number of budgets dropped at the cap (WithMaxBudgets) before
// their state expired, since the limiter was made.
func (m *Limiter) Evictions() uint64 {
	return m.sumShards(func(s *memShard) uint64 { return s.evictions })
}

// sumShards adds f of every shard, each read under its lock.
func (m *Limiter) sumShards(f func(*memShard) uint64) uint64 {
	var n uint64
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += f(s)
		s.mu.Unlock()
	}
	return n
}
