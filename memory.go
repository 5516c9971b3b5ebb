package ratebudget

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"time"
)

const memShards = 64

// Memory is the in-process [Limiter]: the same time rules as the Redis limiter (package
// lua), kept in this process's memory. It is exact for one process; several processes
// each using a Memory each have their own budget (see the middleware's local fallback for
// a documented partitioning).
//
// Memory is safe for concurrent use. State is reclaimed once it no longer differs from no
// state at all (the fixed window closed, the bucket refilled, the rolling window's events
// aged out), so memory is bounded by the number of identities active within a window. No
// goroutine is started: reclaiming happens during calls.
type Memory struct {
	now    func() int64 // Unix milliseconds
	seed   maphash.Seed
	sweep  int64 // ms between sweeps of one shard
	shards [memShards]memShard
}

type memShard struct {
	mu        sync.Mutex
	m         map[uint64]*budget // by hash of the key; budgets whose hashes collide are chained
	n         int                // budgets held
	nextSweep int64
	_         [32]byte // keep hot mutexes on separate cache lines
}

type memKey struct {
	name     string
	algo     Algorithm
	identity string
	scope    string
}

// MemoryOption configures a [Memory].
type MemoryOption func(*Memory) error

// WithClock makes the limiter read time from now, for tests and simulations. now must
// not be nil. The default reads the wall clock once and then follows the monotonic
// clock, so setting the system clock does not move budgets.
func WithClock(now func() time.Time) MemoryOption {
	return func(m *Memory) error {
		if now == nil {
			return &ConfigError{Field: "WithClock", Problem: "clock must not be nil"}
		}
		m.now = func() int64 { return now().UnixMilli() }
		return nil
	}
}

// WithSweepInterval sets how often each shard drops expired state (default 10s). It must
// be at least one millisecond.
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(m *Memory) error {
		if d < time.Millisecond {
			return &ConfigError{Field: "WithSweepInterval", Problem: "must be at least 1ms, got " + d.String()}
		}
		m.sweep = d.Milliseconds()
		return nil
	}
}

// NewMemory returns an empty in-process limiter, or a *[ConfigError] naming the first
// invalid option (a nil option included).
func NewMemory(opts ...MemoryOption) (*Memory, error) {
	m := &Memory{now: monotonicClock(), seed: maphash.MakeSeed(), sweep: 10_000}
	for _, o := range opts {
		if o == nil {
			return nil, &ConfigError{Field: "MemoryOption", Problem: "must not be nil"}
		}
		if err := o(m); err != nil {
			return nil, err
		}
	}
	for i := range m.shards {
		m.shards[i].m = make(map[uint64]*budget)
	}
	return m, nil
}

var _ Limiter = (*Memory)(nil)

// monotonicClock returns a clock (Unix milliseconds) that reads wall time once and then
// advances with the monotonic clock, so that setting the system clock moves no budget.
func monotonicClock() func() int64 {
	start := time.Now()
	ms := start.UnixMilli()
	return func() int64 { return ms + time.Since(start).Milliseconds() }
}

// Len reports the number of budgets currently held, expired ones not yet swept included.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}

// hashOf hashes a budget's key: the map key within a shard, and the shard.
func (m *Memory) hashOf(k *memKey) uint64 {
	h := maphash.String(m.seed, k.identity)
	h ^= bits.RotateLeft64(maphash.String(m.seed, k.name), 21) + uint64(k.algo)
	if k.scope != "" {
		h ^= bits.RotateLeft64(maphash.String(m.seed, k.scope), 42)
	}
	return h
}

func (m *Memory) shardOf(k *memKey) int { return int(m.hashOf(k) % memShards) }

// get returns the budget of k (hash h), or nil.
func (s *memShard) get(h uint64, k *memKey) *budget {
	for b := s.m[h]; b != nil; b = b.next {
		if b.key == *k {
			return b
		}
	}
	return nil
}

// add creates the budget of k (hash h), which must not exist.
func (s *memShard) add(h uint64, k *memKey) *budget {
	b := &budget{key: *k, next: s.m[h]}
	s.m[h] = b
	s.n++
	return b
}

// Allow decides all checks at once, all-or-nothing. It returns an error only for invalid
// checks; the context is not consulted (a decision takes no I/O).
func (m *Memory) Allow(_ context.Context, checks []Check) (Decision, error) {
	if !checksValid(checks) {
		if err := ValidateChecks(checks); err != nil {
			return Decision{}, err
		}
	}
	now := m.now()
	if len(checks) == 1 {
		c := &checks[0]
		k := memKey{c.Rule.Name, c.Rule.Algorithm, c.Identity, c.Scope}
		h := m.hashOf(&k)
		s := &m.shards[h%memShards]
		s.mu.Lock()
		m.maybeSweep(s, now)
		var o [1]Outcome
		if b := s.get(h, &k); b != nil {
			o[0] = decide(b, &c.Rule, c.Cost, now, true) // writes only if it admits
		} else if o[0] = decide(nil, &c.Rule, c.Cost, now, false); o[0].Allowed {
			// State is created only for an admission: refusals leave nothing behind.
			o[0] = decide(s.add(h, &k), &c.Rule, c.Cost, now, true)
		}
		s.mu.Unlock()
		return Combine(checks, o[:]), nil
	}
	return m.allowMany(checks, now), nil
}

func (m *Memory) allowMany(checks []Check, now int64) Decision {
	var kbuf [8]memKey
	var hbuf [8]uint64
	var sbuf [8]int
	var obuf [8]Outcome
	keys, hashes, shards, outs := kbuf[:0], hbuf[:0], sbuf[:0], obuf[:0]
	for i := range checks {
		c := &checks[i]
		k := memKey{c.Rule.Name, c.Rule.Algorithm, c.Identity, c.Scope}
		h := m.hashOf(&k)
		keys = append(keys, k)
		hashes = append(hashes, h)
		shards = append(shards, int(h%memShards))
		outs = append(outs, Outcome{})
	}
	// Lock each distinct shard once, in ascending order, so that concurrent calls cannot
	// deadlock.
	var locked [memShards]bool
	for _, s := range shards {
		locked[s] = true
	}
	for i := range locked {
		if locked[i] {
			m.shards[i].mu.Lock()
			m.maybeSweep(&m.shards[i], now)
		}
	}
	allowed := true
	for i := range checks {
		outs[i] = decide(m.shards[shards[i]].get(hashes[i], &keys[i]), &checks[i].Rule, checks[i].Cost, now, false)
		allowed = allowed && outs[i].Allowed
	}
	if allowed {
		for i := range checks {
			s := &m.shards[shards[i]]
			b := s.get(hashes[i], &keys[i])
			if b == nil {
				b = s.add(hashes[i], &keys[i])
			}
			outs[i] = decide(b, &checks[i].Rule, checks[i].Cost, now, true)
		}
	}
	for i := range locked {
		if locked[i] {
			m.shards[i].mu.Unlock()
		}
	}
	return Combine(checks, outs)
}

// maybeSweep drops the shard's expired state; s.mu must be held.
func (m *Memory) maybeSweep(s *memShard, now int64) {
	if now < s.nextSweep {
		return
	}
	s.nextSweep = now + m.sweep
	for h, head := range s.m {
		var kept *budget
		for b := head; b != nil; {
			next := b.next
			if b.expires > now {
				b.next, kept = kept, b
			} else {
				s.n--
			}
			b = next
		}
		if kept == nil {
			delete(s.m, h)
		} else {
			s.m[h] = kept
		}
	}
}
