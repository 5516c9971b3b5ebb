// Package refusal remembers refusals so that a limiter can repeat them without asking its
// store: once a budget refused cost units with a known wait, a request for the same
// budget with that cost (with at least that cost under a fixed window) is refused
// locally until the wait is over, for at most [MaxRepeat].
//
// # Why this is exact
//
// Without refunds, a budget's available units never grow faster than the time rule
// restores them when nobody spends:
//
//   - fixed window: the count only grows until the window ends, and RetryAfter is the end;
//   - token bucket: the level grows only by refill, and RetryAfter is the refill time to
//     cost tokens assuming no spending; spending by others only lowers the level;
//   - rolling window: the sum shrinks only as events age out, and RetryAfter is when
//     enough of them have; new admissions only add events.
//
// So until RetryAfter has passed, every request with a cost at least the refused one
// would be refused by the store too. Its wait is the refused request's only under a
// fixed window, whose wait is the window's end whatever the cost: under a token bucket
// or a rolling window a larger cost waits longer (more refill, more events to leave),
// by an amount the refusal does not tell, so there a refusal answers requests of its
// own cost only (see [Cache.Lookup]), so that the wait it reports is the store's. The
// wait is measured from the moment the request
// was sent, which is no later than the store's decision, so the local copy never
// outlives the store's refusal. A refund (the Redis limiter refunds a group that a later
// group refused) or a settle can make budget available earlier: a limiter tells its
// cache of its own with [Limiter.GaveBack]; after another process's, a cached refusal
// may refuse work the store would admit, for at most the cached wait and MaxRepeat.
//
// A refusal is repeated for at most [MaxRepeat] after its request was sent, however long
// its wait: a budget whose store state changed in a way no time rule does (another
// process's settle, a raised limit, a budget reset or lost on the server) is decided by
// the store again within MaxRepeat, and a flood costs the store at most one call per
// budget per MaxRepeat. The wait a repeated refusal reports is still the store's.
//
// A spend keeps a refusal exact but makes its report stale (fewer units remain than it
// says), so a limiter calls Forget when the store admits a request for the budget.
//
// A refusal may carry a [Snapshot]: every check's outcome as the store reported it for
// the refused decision, so that a limiter reporting every check's outcome can repeat
// them. The snapshot is dropped with its refusal.
package refusal

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

const shards = 32

// MaxRepeat is how long after its request was sent a refusal is repeated at most,
// whatever its wait.
const MaxRepeat = time.Second

// budgetLen is how much of a key names its budget. A key's bytes after it, at most 8,
// name the rule's parameters (a rule of one name keeps its budget in the store whatever
// its Limit): a lookup of other parameters misses, a store replaces the budget's
// refusal of other parameters, and Forget drops the budget's refusal whatever its
// parameters.
const budgetLen = 16

// split returns the part of key that names its budget and its parameters' tag.
func split(key []byte) ([]byte, uint64) {
	if len(key) <= budgetLen {
		return key, 0
	}
	var b [8]byte
	copy(b[:], key[budgetLen:])
	return key[:budgetLen], binary.LittleEndian.Uint64(b[:])
}

// Cache is a bounded, concurrency-safe memory of refusals. The zero value is not usable;
// call New.
type Cache struct {
	seed   maphash.Seed
	base   time.Time
	clock  func() time.Duration // nil: the monotonic time since base
	max    int                  // entries per shard
	n      atomic.Int64         // entries in all shards, readable without a lock: an empty cache costs nothing
	shards [shards]shard
}

// sweepEvery is the least time between two sweeps of a full shard.
const sweepEvery = int64(100 * time.Millisecond)

type shard struct {
	mu        sync.Mutex
	m         map[string]entry
	nextSweep int64
	_         [40]byte
}

// set and drop change s.m and keep c.n; s.mu is held.
func (c *Cache) set(s *shard, k string, e entry) {
	before := len(s.m)
	s.m[k] = e
	c.n.Add(int64(len(s.m) - before))
}

func (c *Cache) drop(s *shard, k string) {
	delete(s.m, k)
	c.n.Add(-1)
}

// Empty reports whether the cache holds no refusal. A caller may skip building keys for
// Lookup and Forget then: both would find nothing.
func (c *Cache) Empty() bool { return c.n.Load() == 0 }

type entry struct {
	until   int64 // the wait's end, in readings of Now: the RetryAfter it reports
	stop    int64 // repeat until then: until, or at most MaxRepeat after the request was sent
	resetAt int64
	cost    int64
	tag     uint64 // the rule's parameters (see budgetLen)
	d       ratebudget.Decision
	snap    *Snapshot // nil: stored without the other checks' outcomes
}

// Snapshot is a refused decision's outcome for each of its checks, stored with the
// refusal of its reported check ([Cache.StoreIf]). A cache holds it, and never
// changes it, until the refusal is dropped.
type Snapshot struct {
	// Checks names the decision's checks (budgets and costs, in order) so that a
	// lookup can tell whether the snapshot is of the same checks.
	Checks string
	// Outs are the checks' outcomes as the store reported them for a request sent at
	// Sent (a reading of [Cache.Now]).
	Outs []ratebudget.Outcome
	Sent int64
	// Gens is the limiter's own record of each check's budget when the request was
	// sent (see Limiter), to tell whether the outcomes still hold.
	Gens []uint64
}

// New returns a cache holding at most maxEntries refusals (at least shards).
func New(maxEntries int) *Cache {
	c := &Cache{seed: maphash.MakeSeed(), base: time.Now(), max: max(maxEntries/shards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]entry)
	}
	return c
}

// Now returns the cache's clock reading (ns), to pass to Store for a request about to
// be sent.
func (c *Cache) Now() int64 {
	if c.clock != nil {
		return int64(c.clock())
	}
	return int64(time.Since(c.base))
}

func (c *Cache) shard(key []byte) *shard {
	return &c.shards[maphash.Bytes(c.seed, key)%shards]
}

// Lookup reports whether key refused a cost no greater than cost (exactly cost when
// sameCost is set) less than the wait ago, and less than MaxRepeat ago; if so it returns
// the refusal to repeat, with its waits shortened by the time elapsed. Set sameCost for a rule whose wait grows with
// the cost (a token bucket, a rolling window): a refusal of a lower cost would report a
// wait shorter than the request's.
func (c *Cache) Lookup(key []byte, cost int64, sameCost bool, now int64) (ratebudget.Decision, bool) {
	d, _, ok := c.LookupEach(key, cost, sameCost, now)
	return d, ok
}

// LookupEach is Lookup, also returning the refusal's snapshot (nil when it has none).
func (c *Cache) LookupEach(key []byte, cost int64, sameCost bool, now int64) (ratebudget.Decision, *Snapshot, bool) {
	if c.Empty() {
		return ratebudget.Decision{}, nil, false // a miss is always correct: the store decides
	}
	key, tag := split(key)
	s := c.shard(key)
	s.mu.Lock()
	e, ok := s.m[string(key)]
	if ok && now >= e.stop {
		c.drop(s, string(key))
		ok = false
	}
	s.mu.Unlock()
	if !ok || cost < e.cost || sameCost && cost != e.cost || e.tag != tag {
		return ratebudget.Decision{}, nil, false
	}
	d := e.d
	d.RetryAfter = timerule.RoundUp(e.until - now)
	d.ResetAfter = max(timerule.RoundUp(e.resetAt-now), d.RetryAfter)
	return d, e.snap, true
}

// Store records refusal d of cost units for key, decided for a request sent at sent (a
// reading of Now taken before sending). Admissions, Exceeded refusals and refusals with no
// wait are not stored.
func (c *Cache) Store(key []byte, cost int64, sent int64, d ratebudget.Decision) {
	c.StoreIf(key, cost, sent, d, nil, nil)
}

// StoreIf is Store, keeping snap (which may be nil) with the refusal, to be returned by
// LookupEach while the refusal is held, when fresh is nil or reports true, called with
// key's shard locked (the lock Forget takes): a caller that forgets key after making
// fresh report false knows that the refusal is either dropped or never stored.
func (c *Cache) StoreIf(key []byte, cost int64, sent int64, d ratebudget.Decision, snap *Snapshot, fresh func() bool) {
	if d.Allowed || d.Exceeded || d.RetryAfter <= 0 {
		return
	}
	key, tag := split(key)
	until := sent + int64(d.RetryAfter)
	e := entry{until: until, stop: min(until, sent+int64(MaxRepeat)), resetAt: sent + int64(d.ResetAfter), cost: cost, tag: tag, d: d, snap: snap}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if fresh != nil && !fresh() {
		return
	}
	if old, ok := s.m[string(key)]; ok {
		// Keep the entry that refuses more requests: a live one of lower cost stays (it
		// ends a little earlier at worst, and the next refusal renews it), and of equal
		// costs the one that ends later. Both are exact; this keeps the hit rate up when
		// requests of several costs are refused together.
		// Of equal costs, one with a snapshot replaces one without.
		// A refusal of other parameters is replaced.
		if old.stop > sent && old.tag == tag && (old.cost < e.cost || old.cost == e.cost && old.until >= e.until && (old.snap != nil || snap == nil)) {
			return
		}
		c.set(s, string(key), e)
		return
	}
	if len(s.m) >= c.max {
		if sent < s.nextSweep {
			return // full, and swept recently: not caching is always correct
		}
		// Sweep at most once per sweepEvery, so that a flood of distinct refused keys
		// cannot make every refusal scan a full shard.
		s.nextSweep = sent + sweepEvery
		for k, v := range s.m {
			if v.stop <= sent {
				c.drop(s, k)
			}
		}
		if len(s.m) >= c.max {
			return // full of live refusals: not caching is always correct
		}
	}
	c.set(s, string(key), e)
}

// Forget drops key's refusal, if any. A limiter calls it when the store admitted a
// request for key's budget: the spend leaves a stored refusal still exact (it only
// lowered what is available), but no longer a true report of the budget (fewer units
// remaining, and a wait that may have grown), so the next request asks the store.
func (c *Cache) Forget(key []byte) {
	if c.Empty() {
		return
	}
	c.forget(key)
}

// forget is Forget without its check that the cache is empty, which a concurrent
// StoreIf may be about to change.
func (c *Cache) forget(key []byte) {
	key, _ = split(key)
	s := c.shard(key)
	s.mu.Lock()
	if _, ok := s.m[string(key)]; ok {
		c.drop(s, string(key))
	}
	s.mu.Unlock()
}

// Len returns the number of refusals held, expired ones not yet dropped included.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
