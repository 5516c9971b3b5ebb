package ratebudget

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"hash/maphash"
	"io"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"time"
)

const memShards = 64

// defaultMaxBudgets is the number of budgets a [Memory] holds at most unless
// [WithMaxBudgets] says otherwise.
const defaultMaxBudgets = 100_000

// Memory is the in-process [Limiter]: the same time rules as the Redis limiter (package
// lua), kept in this process's memory. It is exact for one process; several processes
// each using a Memory each have their own budget (see the middleware's local fallback for
// a documented partitioning).
//
// Memory implements [Settler]: settling is exact, and a decision's checks are settled
// atomically, as they are decided.
//
// Make one with [NewMemory]: the zero Memory holds no budgets, and its decisions and
// settles return a *[ConfigError] naming Memory (package middleware refuses it in New).
//
// Memory is safe for concurrent use. State is reclaimed once it no longer differs from no
// state at all (the fixed window closed, the bucket refilled, the rolling window's events
// aged out, the leases released or expired). No goroutine is started: reclaiming happens
// during calls, a sweep of each shard at most once per [WithSweepInterval], spread over
// the calls that reach the shard: a call visits at most 32 of its shard's budgets, so
// that no call pays for the whole shard.
//
// The number of budgets held is capped ([WithMaxBudgets], default 100,000: about 17 MB of heap when identities are as short as IP addresses), so
// that identities rotating faster than their windows end (a botnet, random IPv6
// addresses, made-up API keys) cannot grow the process without bound. Budgets are spread
// over 64 shards by a keyed hash, and each shard holds at most its share of the cap. A
// new budget that would exceed its shard's share first evicts one, chosen as a
// second-chance approximation of least recently used: a hand walks the shard's budgets
// oldest first and drops the first one that has expired or has not been looked up since
// it was created or the hand last passed it; a budget looked up since (admitted or
// refused) has its mark cleared and is passed over. So a service-wide budget, or a client
// that keeps sending, stays tracked while identities seen once go first. The budgets of
// the request being decided are never evicted.
//
// The consequence of an eviction: the evicted identity's next request starts from a fresh
// budget (an empty window, a full bucket, no lease held), so within that window it may be
// admitted up to one rule capacity more than the rule allows; an InFlight budget's leases
// are lost with it (up to Limit more may be held at once until they end, and renewing one
// reports [ErrLeaseLost]). Budgets still held are exact: nothing is
// ever admitted beyond the rules for an identity that is tracked. Refusals of identities
// that hold no budget create none, and so evict nothing. [Memory.Evictions] counts
// evictions of budgets that had not expired: a count that keeps growing means the cap is
// too small for the traffic, or that identities are being rotated.
type Memory struct {
	now    func() int64 // Unix milliseconds
	seed   maphash.Seed
	sweep  int64 // ms between sweeps of one shard
	max    int   // budgets held at most, over all shards
	shards [memShards]memShard
}

// memShard is one shard's budgets: a map by hash of the key, where budgets whose hashes
// collide are chained, and a queue of every budget, oldest first, that the sweep walks
// and from whose head evictions are taken.
//
// While the map is being replaced by a smaller one (see sweep), old holds the chains not
// yet moved: a chain is in one of the two maps, and is moved to m before it changes.
type memShard struct {
	mu          sync.Mutex
	m           map[uint64]*budget
	old         map[uint64]*budget // the map being replaced, or nil
	oldest      *budget            // head of the queue
	newest      *budget            // tail of the queue
	kept        *budget            // the last budget the sweep under way kept; nil: it goes on at the head
	n, max, big int                // budgets held; at most; most held since the map was made
	unswept     int                // queue entries the sweep under way may still visit; 0: none under way
	nextSweep   int64
	evictions   uint64
	leases      int64    // InFlight leases numbered so far
	_           [24]byte // keep hot mutexes on separate cache lines
}

type memKey struct {
	name     string
	identity string
	scope    string
	algo     Algorithm
	// digest reports that identity holds the SHA-256 of the check's identity and scope
	// (see keyOf) and scope is empty. A digest key never equals a key held as it is.
	digest bool
}

// maxKeyText is the most bytes of identity and scope together that a budget holds as they
// are. Longer ones are held as a 32-byte digest, so that a budget's memory is bounded
// whatever the caller's keys: the cap ([WithMaxBudgets]) counts budgets.
const maxKeyText = 256

// keyOf returns the key of c's budget: its rule's name and algorithm, and its identity
// and scope as they are when they are at most maxKeyText bytes together, or else their
// SHA-256 (the identity's length, the identity, the scope), so that distinct identities
// and scopes stay distinct budgets.
func keyOf(c *Check) memKey {
	if len(c.Identity)+len(c.Scope) <= maxKeyText {
		return memKey{name: c.Rule.Name, identity: c.Identity, scope: c.Scope, algo: c.Rule.Algorithm}
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(c.Identity)))
	h.Write(n[:])
	io.WriteString(h, c.Identity)
	io.WriteString(h, c.Scope)
	var sum [sha256.Size]byte
	return memKey{name: c.Rule.Name, identity: string(h.Sum(sum[:0])), algo: c.Rule.Algorithm, digest: true}
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

// WithSweepInterval sets how often each shard drops expired state (default 10s): a sweep
// of a shard starts at most this often, once the previous one ended. A sweep visits at
// most 32 budgets per call that reaches the shard, so a shard of n budgets is swept within
// its next n/32 calls (rounded up). It must be at least one millisecond; it is used in
// whole milliseconds (a fraction is dropped).
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(m *Memory) error {
		if d < time.Millisecond {
			return &ConfigError{Field: "WithSweepInterval", Problem: "must be at least 1ms, got " + d.String()}
		}
		m.sweep = d.Milliseconds()
		return nil
	}
}

// WithMaxBudgets caps the number of budgets the limiter holds at n (default 100,000). A budget costs about 150 to 175 bytes of heap, its map entry and
// an identity as long as an IP address included, and about 400 bytes at most whatever
// the identity and scope (longer than 256 bytes together, they are held as a 32-byte
// digest), so the cap bounds the limiter's memory.
// The cap is split evenly over 64 shards, so n must be at least 64. A shard holds more
// than its share only when one request names more of that shard's budgets than the share
// (which takes a cap below 64 times the checks of a request): it then holds that
// request's budgets, until its next new budget. Small caps protect less: with a share of
// one budget per shard, every new budget replaces the one its shard held. See [Memory]
// for what happens at the cap.
func WithMaxBudgets(n int) MemoryOption {
	return func(m *Memory) error {
		if n < memShards {
			return &ConfigError{Field: "WithMaxBudgets", Problem: "must be at least " + strconv.Itoa(memShards) + ", got " + strconv.Itoa(n)}
		}
		m.max = n
		return nil
	}
}

// NewMemory returns an empty in-process limiter, or a *[ConfigError] naming the first
// invalid option (a nil option included).
func NewMemory(opts ...MemoryOption) (*Memory, error) {
	m := &Memory{now: monotonicClock(), seed: maphash.MakeSeed(), sweep: 10_000, max: defaultMaxBudgets}
	for _, o := range opts {
		if o == nil {
			return nil, &ConfigError{Field: "MemoryOption", Problem: "must not be nil"}
		}
		if err := o(m); err != nil {
			return nil, err
		}
	}
	for i := range m.shards {
		s := &m.shards[i]
		s.m = make(map[uint64]*budget)
		s.max = m.max / memShards
		if i < m.max%memShards {
			s.max++
		}
	}
	return m, nil
}

var _ Limiter = (*Memory)(nil)

// errZeroMemory is the error of every decision and settle of a Memory that NewMemory did
// not make: the zero Memory has no shards to hold budgets in, nor a clock.
var errZeroMemory = &ConfigError{Field: "Memory", Problem: "is the zero value, which holds no budgets: make it with NewMemory"}

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

// Evictions reports the number of budgets dropped at the cap ([WithMaxBudgets]) before
// their state expired, since the limiter was made.
func (m *Memory) Evictions() uint64 {
	var n uint64
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.evictions
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

// chain returns the first of the budgets of hash h, or nil.
func (s *memShard) chain(h uint64) *budget {
	head := s.m[h]
	if head == nil && s.old != nil {
		head = s.old[h]
	}
	return head
}

// own moves the chain of hash h from the map being replaced, if it is there, to s.m, so
// that a change to the chain is made in s.m alone.
func (s *memShard) own(h uint64) {
	if s.old == nil {
		return
	}
	if head, ok := s.old[h]; ok {
		delete(s.old, h)
		s.m[h] = head
	}
}

// find returns the budget of k (hash h), or nil, and whether any budget has hash h.
// Finding a budget marks it used.
func (s *memShard) find(h uint64, k *memKey) (found *budget, collides bool) {
	head := s.chain(h)
	for b := head; b != nil; b = b.next {
		if b.is(k) {
			b.marks |= marked
			return b, true
		}
	}
	return nil, head != nil
}

// get returns the budget of k (hash h), or nil, as find does.
func (s *memShard) get(h uint64, k *memKey) *budget {
	b, _ := s.find(h, k)
	return b
}

// add creates the budget of k (hash h), which must not exist, at the end of the queue.
// It does not enforce the shard's cap: see makeRoom.
func (s *memShard) add(h uint64, k *memKey) *budget { return s.insert(h, k, true, nil) }

// insert is add for a caller that knows from find whether any budget has hash h: when
// none does (collides false), the map is not read again. A non-nil spare (a budget just
// evicted, which nothing refers to) is reused rather than a new one allocated.
func (s *memShard) insert(h uint64, k *memKey, collides bool, spare *budget) *budget {
	b := spare
	if b == nil {
		b = new(budget)
	}
	id, scope := k.identity, k.scope
	if !k.digest { // a digest is the budget's own already
		id, scope = s.ownKey(id, scope)
	}
	*b = budget{name: k.name, identity: id, scope: scope, algo: k.algo, digest: k.digest, h: h}
	if collides {
		s.own(h)
		if b.next = s.m[h]; b.next != nil {
			b.marks |= sharedHash
			for o := b.next; o != nil; o = o.next {
				o.marks |= sharedHash
			}
		}
	}
	s.m[h] = b
	if s.newest == nil {
		s.oldest = b
	} else {
		s.newest.newer = b
	}
	s.newest = b
	s.n++
	s.big = max(s.big, s.n)
	return b
}

// ownKey returns copies of identity and scope, for a new budget of the shard: the scope
// of the shard's newest budget when it is the same (a scope is most often a route
// pattern, shared by many budgets), else in one allocation with the identity. A budget
// holds copies, not the caller's strings: one sliced out of a large string (an address
// out of a long header, a path out of a long request line) would keep all of it alive
// for as long as the budget lives. Only a new budget copies its key: a decision on a
// budget that exists allocates nothing.
func (s *memShard) ownKey(identity, scope string) (string, string) {
	if scope != "" && s.newest != nil && s.newest.scope == scope {
		return strings.Clone(identity), s.newest.scope
	}
	if identity == "" || scope == "" {
		return strings.Clone(identity), strings.Clone(scope)
	}
	both := identity + scope
	return both[:len(identity)], both[len(identity):]
}

// unchain removes b from the map; the queue is the caller's to fix.
func (s *memShard) unchain(b *budget) {
	h := b.h
	if b.marks&sharedHash == 0 { // alone under its hash: one map operation (two while the map is replaced)
		delete(s.m, h)
		if s.old != nil {
			delete(s.old, h)
		}
		s.n--
		return
	}
	s.own(h)
	p := s.m[h]
	if p == b {
		if b.next == nil {
			delete(s.m, h)
		} else {
			s.m[h] = b.next
		}
	} else {
		for p.next != b {
			p = p.next
		}
		p.next = b.next
	}
	b.next = nil
	s.n--
}

// makeRoom evicts budgets from the head of the shard's queue until one more fits within
// the shard's cap; s.mu must be held. The eviction hand is the queue's head: a budget
// that has expired, or that has not been used since it was created or last passed over,
// is dropped; one that has been used is given a second chance (its mark cleared, moved to
// the end of the queue). The budgets in keep (the current request's) are never dropped:
// when the shard holds nothing else, the cap gives way. It returns the last budget
// dropped, for reuse, or nil.
func (s *memShard) makeRoom(now int64, keep []*budget) (spare *budget) {
	// Two passes at most: the first clears every mark, the second finds a victim.
	for steps := 2*s.n + 1; s.n >= s.max && steps > 0; steps-- {
		b := s.oldest
		s.oldest = b.newer
		b.newer = nil
		if b == s.kept {
			s.kept = nil // the sweep under way goes on at the new head, which followed b
		}
		if (b.expires <= now || b.marks&marked == 0) && !kept(keep, b) {
			if s.oldest == nil {
				s.newest = nil
			}
			if b.expires > now {
				s.evictions++
			}
			s.unchain(b)
			spare = b
			continue
		}
		b.marks &^= marked
		if s.oldest == nil {
			s.oldest = b
		} else {
			s.newest.newer = b
			s.newest = b
		}
	}
	return spare
}

func kept(keep []*budget, b *budget) bool {
	for _, k := range keep {
		if k == b {
			return true
		}
	}
	return false
}

// Allow decides all checks at once, all-or-nothing. It returns an error only for invalid
// checks; the context is not consulted (a decision takes no I/O): a context already
// canceled is decided, and spent, as any other, where the Redis limiter sends nothing
// and spends nothing. A caller that must not spend for canceled work checks
// ctx.Err() first, as package middleware does.
func (m *Memory) Allow(_ context.Context, checks []Check) (Decision, error) {
	return m.allow(checks, nil, nil)
}

// AllowEach decides as Allow does and sets outcomes[i] to checks[i]'s outcome
// ([Reporter]). outcomes must have len(checks) elements.
func (m *Memory) AllowEach(_ context.Context, checks []Check, outcomes []Outcome) (Decision, error) {
	if len(outcomes) != len(checks) {
		return Decision{}, &ConfigError{Field: "outcomes", Problem: "must have one element per check"}
	}
	return m.allow(checks, outcomes, nil)
}

// Reserve decides as Allow does and, when it admits, records each check's spend in
// tickets for [Memory.Settle] and [Memory.Renew]; on a refusal or an error it zeroes
// them. tickets must hold at least len(checks) entries. outcomes is nil, or receives
// each check's outcome as AllowEach's does.
func (m *Memory) Reserve(_ context.Context, checks []Check, tickets []Ticket, outcomes []Outcome) (Decision, error) {
	// Zero first, so that an invalid call, too, leaves nothing to settle.
	clear(tickets[:min(len(tickets), len(checks))])
	if len(tickets) < len(checks) {
		if err := ValidateSettle(checks, tickets, nil); err != nil {
			return Decision{}, err
		}
	}
	if outcomes != nil && len(outcomes) != len(checks) {
		return Decision{}, &ConfigError{Field: "outcomes", Problem: "must have one element per check"}
	}
	return m.allow(checks, outcomes, tickets[:len(checks)])
}

// allow decides checks; out is nil or receives each check's outcome, tickets is nil or
// receives each check's ticket.
func (m *Memory) allow(checks []Check, out []Outcome, tickets []Ticket) (Decision, error) {
	if m.now == nil {
		return Decision{}, errZeroMemory
	}
	if err := ValidateChecks(checks); err != nil {
		return Decision{}, err
	}
	now := m.now()
	if len(checks) == 1 {
		c := &checks[0]
		k := keyOf(c)
		h := m.hashOf(&k)
		s := &m.shards[h%memShards]
		s.mu.Lock()
		m.maybeSweep(s, now)
		lease := s.lease(&c.Rule)
		var o [1]Outcome
		b, collides := s.find(h, &k)
		if b != nil {
			o[0] = decide(b, &c.Rule, c.Cost, now, true, lease) // writes only if it admits
		} else if o[0] = decide(nil, &c.Rule, c.Cost, now, false, lease); o[0].Allowed {
			// State is created only for an admission: refusals leave nothing behind.
			spare := s.makeRoom(now, nil)
			b = s.insert(h, &k, collides, spare)
			freshState(b, &c.Rule, now)
			o[0] = decide(b, &c.Rule, c.Cost, now, true, lease)
		}
		if tickets != nil {
			tickets[0] = Ticket{}
			if o[0].Allowed {
				tickets[0] = ticketOf(b, &c.Rule, now, lease)
			}
		}
		s.mu.Unlock()
		if out != nil {
			out[0] = o[0]
		}
		return Combine(checks, o[:]), nil
	}
	return m.allowMany(checks, now, out, tickets), nil
}

// lease numbers the next InFlight lease of the shard (0 for the other time rules); s.mu
// must be held. Numbers are never reused, so a ticket names at most one lease.
func (s *memShard) lease(r *Rule) int64 {
	if r.Algorithm != InFlight {
		return 0
	}
	s.leases++
	return s.leases
}

// locate appends each check's key, its hash and its shard to keys, hashes and shards.
func (m *Memory) locate(checks []Check, keys []memKey, hashes []uint64, shards []int) ([]memKey, []uint64, []int) {
	for i := range checks {
		c := &checks[i]
		k := keyOf(c)
		h := m.hashOf(&k)
		keys = append(keys, k)
		hashes = append(hashes, h)
		shards = append(shards, int(h%memShards))
	}
	return keys, hashes, shards
}

func (m *Memory) allowMany(checks []Check, now int64, out []Outcome, tickets []Ticket) Decision {
	var kbuf [8]memKey
	var hbuf [8]uint64
	var sbuf [8]int
	var obuf [8]Outcome
	var bbuf [8]*budget
	keys, hashes, shards := m.locate(checks, kbuf[:0], hbuf[:0], sbuf[:0])
	outs, found := obuf[:0], bbuf[:0]
	for range checks {
		outs = append(outs, Outcome{})
		found = append(found, nil)
	}
	locked := m.lock(shards, now)
	allowed := true
	for i := range checks {
		found[i] = m.shards[shards[i]].get(hashes[i], &keys[i])
		outs[i] = decide(found[i], &checks[i].Rule, checks[i].Cost, now, false, 0)
		allowed = allowed && outs[i].Allowed
	}
	if allowed {
		for i := range checks {
			b := found[i]
			s := &m.shards[shards[i]]
			if b == nil {
				// Room is made before the budget exists, and never at the expense of
				// this request's other budgets, whose outcomes are already decided. The
				// map is read again: an earlier check of this request may share h.
				b = s.insert(hashes[i], &keys[i], true, s.makeRoom(now, found))
				freshState(b, &checks[i].Rule, now)
				found[i] = b
			}
			lease := s.lease(&checks[i].Rule)
			outs[i] = decide(b, &checks[i].Rule, checks[i].Cost, now, true, lease)
			if tickets != nil {
				tickets[i] = ticketOf(b, &checks[i].Rule, now, lease)
			}
		}
	} else {
		// Nothing was spent: the checks that fit are reported with their budgets as
		// they are.
		for i := range checks {
			if outs[i].Allowed {
				outs[i] = unspent(found[i], &checks[i].Rule, now)
			}
		}
		if tickets != nil {
			clear(tickets)
		}
	}
	m.unlock(&locked)
	copy(out, outs)
	return Combine(checks, outs)
}

// lock locks each distinct shard of shards once, in ascending order, so that concurrent
// calls cannot deadlock, and sweeps it when due. It returns the set to unlock.
func (m *Memory) lock(shards []int, now int64) (locked [memShards]bool) {
	for _, s := range shards {
		locked[s] = true
	}
	for i := range locked {
		if locked[i] {
			m.shards[i].mu.Lock()
			m.maybeSweep(&m.shards[i], now)
		}
	}
	return locked
}

func (m *Memory) unlock(locked *[memShards]bool) {
	for i := range locked {
		if locked[i] {
			m.shards[i].mu.Unlock()
		}
	}
}

// sweepBatch is the most queue entries a call visits in one shard to drop expired
// state: a sweep of a shard is spread over the calls that reach it, so that no call pays
// for the whole shard.
const sweepBatch = 32

// maybeSweep drops the shard's expired state; s.mu must be held. A sweep walks the
// queue, at most sweepBatch entries per call, going on where the previous call stopped;
// one starts at most once per sweep interval, and visits at most the budgets held when it
// started (later ones wait for the next). When the shard holds less than a quarter of the
// most it held since its map was made, the map is made again, small, so that the memory
// of a past flood of identities is given back: the budgets move to the new map as the
// next sweep passes them.
func (m *Memory) maybeSweep(s *memShard, now int64) {
	if s.unswept == 0 {
		// Due at the planned time, or at once when the clock went back behind the last
		// sweep: else a clock (WithClock) that jumped ahead and came back would stop the
		// sweeps until it reached the far time again.
		if now < s.nextSweep && s.nextSweep-now <= m.sweep {
			return
		}
		s.nextSweep = now + m.sweep
		s.kept, s.unswept = nil, s.n
	}
	s.sweep(now)
}

// sweep goes on with the sweep under way for at most sweepBatch queue entries, dropping
// those expired at now; s.mu must be held.
func (s *memShard) sweep(now int64) {
	prev := s.kept
	b := s.oldest
	if prev != nil {
		b = prev.newer
	}
	for steps := sweepBatch; steps > 0 && b != nil && s.unswept > 0; steps-- {
		s.unswept--
		newer := b.newer
		if b.expires > now {
			s.own(b.h)
			prev = b
		} else {
			if prev == nil {
				s.oldest = newer
			} else {
				prev.newer = newer
			}
			if newer == nil {
				s.newest = prev
			}
			b.newer = nil
			s.unchain(b)
		}
		b = newer
	}
	s.kept = prev
	if b != nil && s.unswept > 0 {
		return // more next call
	}
	s.kept, s.unswept = nil, 0
	switch {
	case s.old != nil && len(s.old) == 0:
		s.old = nil
	case s.old != nil:
		// Some budgets were not reached (the eviction hand moved them behind budgets
		// created since the sweep began): sweep again, at once, to move them.
		s.unswept = s.n
	case s.big >= 1024 && s.n < s.big/4:
		s.old, s.m, s.big = s.m, make(map[uint64]*budget, s.n), s.n
		s.unswept = s.n
	}
}
