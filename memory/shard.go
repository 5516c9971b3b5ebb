package memory

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/maphash"
	"io"
	"math/bits"
	"strings"
	"sync"

	"github.com/ratebudget/ratebudget"
)

// The shards of a Limiter: where budgets are found, created, evicted at the cap and
// swept once expired. Every function on a memShard runs with its mutex held.

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
	algo     ratebudget.Algorithm
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
func keyOf(c *ratebudget.Check) memKey {
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

// hashOf hashes a budget's key: the map key within a shard, and the shard.
func (m *Limiter) hashOf(k *memKey) uint64 {
	h := maphash.String(m.seed, k.identity)
	h ^= bits.RotateLeft64(maphash.String(m.seed, k.name), 21) + uint64(k.algo)
	if k.scope != "" {
		h ^= bits.RotateLeft64(maphash.String(m.seed, k.scope), 42)
	}
	return h
}

func (m *Limiter) shardOf(k *memKey) int { return int(m.hashOf(k) % memShards) }

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

// insert creates the budget of k (hash h), which must not exist, at the end of the
// queue. It does not enforce the shard's cap: see makeRoom. collides says, as find
// reported, whether any budget has hash h: when none does, the map is not read again
// (true is always correct). A non-nil spare (a budget just evicted, which nothing refers
// to) is reused rather than a new one allocated.
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

// lease numbers the next InFlight lease of the shard (0 for the other time rules); s.mu
// must be held. Numbers are never reused, so a ticket names at most one lease.
func (s *memShard) lease(r *ratebudget.Rule) int64 {
	if r.Algorithm != ratebudget.InFlight {
		return 0
	}
	s.leases++
	return s.leases
}

// locate appends each check's key, its hash and its shard to keys, hashes and shards.
func (m *Limiter) locate(checks []ratebudget.Check, keys []memKey, hashes []uint64, shards []int) ([]memKey, []uint64, []int) {
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

// lock locks each distinct shard of shards once, in ascending order, so that concurrent
// calls cannot deadlock, and sweeps it when due. It returns the set to unlock.
func (m *Limiter) lock(shards []int, now int64) (locked [memShards]bool) {
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

func (m *Limiter) unlock(locked *[memShards]bool) {
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
func (m *Limiter) maybeSweep(s *memShard, now int64) {
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
