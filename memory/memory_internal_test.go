package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ratebudget/ratebudget"
)

type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestMemory(t *testing.T, opts ...Option) (*Limiter, *manualClock) {
	t.Helper()
	clk := &manualClock{t: time.UnixMilli(1_767_225_600_250)}
	m, err := New(append([]Option{WithClock(clk.now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m, clk
}

// identityPerShard returns, for every shard, an identity whose budget under r (scope
// empty) lives in that shard.
func identityPerShard(t *testing.T, m *Limiter, r ratebudget.Rule) [memShards]string {
	t.Helper()
	var out [memShards]string
	found := 0
	for i := 0; found < memShards; i++ {
		if i > 1_000_000 {
			t.Fatalf("only %d of %d shards reached", found, memShards)
		}
		id := fmt.Sprint("id-", i)
		s := m.shardOf(&memKey{name: r.Name, identity: id, algo: r.Algorithm})
		if out[s] == "" {
			out[s] = id
			found++
		}
	}
	return out
}

// TestSweepEveryShard: once every window has passed plus the sweep interval, any call on
// a shard drops that shard's expired budgets, whichever key it names, so that Len falls to
// zero; nothing is dropped earlier.
func TestSweepEveryShard(t *testing.T) {
	const sweep = 100 * time.Millisecond
	m, clk := newTestMemory(t, WithSweepInterval(sweep))
	rules := []ratebudget.Rule{
		{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 5, Window: time.Second},
		{Name: "token", Algorithm: ratebudget.TokenBucket, Limit: 5, Window: time.Second},
		{Name: "rolling", Algorithm: ratebudget.RollingWindow, Limit: 5, Window: time.Second},
	}
	ids := identityPerShard(t, m, rules[0])
	for _, r := range rules {
		for _, id := range ids {
			// The whole capacity: each budget is whole again exactly 1s later.
			if d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: r, Identity: id, Cost: 5}}); err != nil || !d.Allowed {
				t.Fatalf("%s/%s: %+v %v", r.Name, id, d, err)
			}
		}
	}
	want := len(rules) * memShards
	if n := m.Len(); n != want {
		t.Fatalf("Len %d, want %d", n, want)
	}

	// A request on every shard that creates nothing: an Exceeded check of an unused key.
	touchAll := func() {
		probe := ratebudget.Rule{Name: "probe", Limit: 1, Window: time.Second}
		for _, id := range identityPerShard(t, m, probe) {
			d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: probe, Identity: id, Cost: 2}})
			if err != nil || !d.Exceeded {
				t.Fatalf("probe: %+v %v", d, err)
			}
		}
	}
	clk.advance(time.Second - time.Millisecond)
	touchAll()
	if n := m.Len(); n != want {
		t.Fatalf("1ms before the windows end: Len %d, want %d", n, want)
	}
	clk.advance(time.Millisecond + sweep)
	touchAll()
	if n := m.Len(); n != 0 {
		t.Fatalf("after the windows and a sweep interval: Len %d, want 0", n)
	}
}

// TestMultiShardLockOrder: requests naming two budgets in two different shards, half of
// them in one order and half in the other, neither deadlock nor overspend.
func TestMultiShardLockOrder(t *testing.T) {
	m, _ := newTestMemory(t)
	a := ratebudget.Rule{Name: "a", Algorithm: ratebudget.FixedWindow, Limit: 5, Window: time.Minute}
	b := ratebudget.Rule{Name: "b", Algorithm: ratebudget.TokenBucket, Limit: 1000, Window: time.Minute}
	c := ratebudget.Rule{Name: "c", Algorithm: ratebudget.RollingWindow, Limit: 1000, Window: time.Minute}
	ka, kb := memKey{name: a.Name, algo: a.Algorithm}, memKey{name: b.Name, identity: "x", algo: b.Algorithm}
	for i := 0; m.shardOf(&ka) == m.shardOf(&kb); i++ {
		kb.identity = fmt.Sprint("x", i) // b's budget must live in another shard than a's
	}
	ids := identityPerShard(t, m, c)
	const workers, perWorker = 32, 200
	start := make(chan struct{})
	done := make(chan struct{})
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for j := range perWorker {
				checks := []ratebudget.Check{
					{Rule: a, Cost: 1},
					{Rule: b, Identity: kb.identity, Cost: 1},
					{Rule: c, Identity: ids[(w+j)%memShards], Cost: 1},
				}
				if (w+j)%2 == 1 {
					checks[0], checks[2] = checks[2], checks[0]
				}
				d, err := m.Allow(context.Background(), checks)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	close(start)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("requests spanning shards did not finish: deadlock")
	}
	if admitted != 5 {
		t.Fatalf("admitted %d, want 5", admitted)
	}
	d, _ := m.Allow(context.Background(), []ratebudget.Check{{Rule: b, Identity: kb.identity, Cost: 1001}})
	if d.Remaining != 1000-5 {
		t.Fatalf("b spent %d, want 5", 1000-d.Remaining)
	}
}

// TestHashCollisionsChain: budgets whose keys hash alike are told apart by their keys (a
// digest key from a key held as it is with the same bytes included),
// and sweeping drops only the expired ones of a chain.
func TestHashCollisionsChain(t *testing.T) {
	s := memShard{m: make(map[uint64]*budget)}
	const h = 42
	keys := []memKey{{"a", "x", "", ratebudget.FixedWindow, false}, {"a", "y", "", ratebudget.FixedWindow, false}, {"a", "x", "", ratebudget.TokenBucket, false}, {"b", "x", "s", ratebudget.FixedWindow, false}, {"a", "x", "", ratebudget.FixedWindow, true}}
	for i := range keys {
		if s.get(h, &keys[i]) != nil {
			t.Fatalf("key %d found before it was added", i)
		}
		b := s.insert(h, &keys[i], true, nil)
		b.expires = int64(i % 2) // keys 0, 2 and 4 expire at 0, keys 1 and 3 at 1
	}
	for i := range keys {
		if b := s.get(h, &keys[i]); b == nil || !b.is(&keys[i]) {
			t.Fatalf("key %d: got %+v", i, b)
		}
	}
	m := &Limiter{sweep: 1}
	m.maybeSweep(&s, 1) // every budget expiring at or before 1ms
	if s.n != 0 || len(s.m) != 0 {
		t.Fatalf("after sweeping at 1: %d budgets, map %d", s.n, len(s.m))
	}
	for i := range keys {
		s.insert(h, &keys[i], true, nil).expires = int64(10 + i%2)
	}
	s.nextSweep = 0
	m.maybeSweep(&s, 10) // keys 0, 2 and 4 expire at 10
	if s.n != 2 {
		t.Fatalf("after sweeping at 10: %d budgets, want 2", s.n)
	}
	for i := range keys {
		if got := s.get(h, &keys[i]) != nil; got != (i%2 == 1) {
			t.Errorf("key %d present %v after the sweep", i, got)
		}
	}
}

// TestBudgetSize: a budget stays within the 112-byte allocation class on 64-bit
// platforms, which docs/MEMORY.md's figures assume, and shards fill whole cache lines.
func TestBudgetSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are pinned for 64-bit platforms")
	}
	if unsafe.Sizeof(budget{}) > 112 {
		t.Errorf("budget is %d bytes, want at most 112", unsafe.Sizeof(budget{}))
	}
	if n := unsafe.Sizeof(memShard{}); n%64 != 0 {
		t.Errorf("memShard is %d bytes, want a multiple of 64", n)
	}
}

// holds reports whether m holds the budget of k, without marking it used.
func (m *Limiter) holds(k *memKey) bool {
	h := m.hashOf(k)
	s := &m.shards[h%memShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	for b := s.chain(h); b != nil; b = b.next {
		if b.is(k) {
			return true
		}
	}
	return false
}

// TestCapTrackedBudgetsExact: at the cap, a tracked budget answers exactly as the rules
// do, and an evicted one exactly as a fresh one. A limiter capped at 128 budgets and an
// uncapped reference on one clock get the same 30,000 random requests (one to three
// checks, every time rule, 600 identities of which 10 get three requests in four).
// Before each request, every budget it names that the capped limiter no longer holds is
// replaced in the reference by a fresh one (a new generation of the identity: an evicted
// budget, or an expired one, which is the same as none). Every decision must then be
// identical, waits included; the walk must evict budgets that had not expired and refuse
// requests of tracked identities.
func TestCapTrackedBudgetsExact(t *testing.T) {
	const maxBudgets = 128
	capped, clk := newTestMemory(t, WithMaxBudgets(maxBudgets))
	ref, err := New(WithClock(clk.now), WithMaxBudgets(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	var rules []ratebudget.Rule
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for i, w := range []time.Duration{200 * time.Millisecond, 2 * time.Second} {
			rules = append(rules, ratebudget.Rule{Name: fmt.Sprintf("%v-%d", alg, i), Algorithm: alg, Limit: int64(3 + 3*i), Window: w})
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	generation := map[memKey]int{}
	identity := func() string {
		if rng.IntN(4) != 0 {
			return fmt.Sprint("hot-", rng.IntN(10))
		}
		return fmt.Sprint("cold-", rng.IntN(590))
	}
	var admitted, refusedTracked int
	for i := range 30_000 {
		clk.advance(time.Duration(rng.IntN(3)) * time.Millisecond)
		n := 1 + rng.IntN(3)
		checks := make([]ratebudget.Check, 0, n)
		for len(checks) < n {
			c := ratebudget.Check{Rule: rules[rng.IntN(len(rules))], Identity: identity(), Cost: 1 + rng.Int64N(2)}
			dup := false
			for _, o := range checks {
				dup = dup || o.Rule.Name == c.Rule.Name && o.Identity == c.Identity
			}
			if !dup {
				checks = append(checks, c)
			}
		}
		refChecks := make([]ratebudget.Check, len(checks))
		tracked := true
		for j, c := range checks {
			k := keyOf(&c)
			if !capped.holds(&k) {
				generation[k]++
				tracked = false
			}
			refChecks[j] = c
			refChecks[j].Identity = fmt.Sprint(c.Identity, "#", generation[k])
		}
		got, err := capped.Allow(context.Background(), checks)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Allow(context.Background(), refChecks)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("request %d %+v (tracked %v): capped %+v, reference %+v", i, checks, tracked, got, want)
		}
		for j := range capped.shards {
			// A shard exceeds its share only to hold the budgets of one request (3 at most).
			if s := &capped.shards[j]; s.n > max(s.max, 3) {
				t.Fatalf("request %d: shard %d holds %d budgets, its share %d", i, j, s.n, s.max)
			}
		}
		if got.Allowed {
			admitted++
		} else if tracked {
			refusedTracked++
		}
	}
	t.Logf("%d admitted, %d refusals of tracked budgets, %d evictions, %d budgets held", admitted, refusedTracked, capped.Evictions(), capped.Len())
	if admitted < 3000 || refusedTracked < 3000 || capped.Evictions() < 3000 {
		t.Fatalf("%d admitted, %d refusals of tracked budgets, %d evictions: the walk did not exercise the cap",
			admitted, refusedTracked, capped.Evictions())
	}
}

// TestCapKeepsRequestBudgets: with one budget per shard, a request naming three budgets
// of one shard holds all three (the cap gives way to the request's own budgets rather than
// evict one whose outcome is decided), spends each once, and the next request on the
// shard brings it back to its share.
func TestCapKeepsRequestBudgets(t *testing.T) {
	m, _ := newTestMemory(t, WithMaxBudgets(memShards))
	r := ratebudget.Rule{Name: "r", Algorithm: ratebudget.FixedWindow, Limit: 1, Window: time.Hour}
	var ids []string
	var shard int
	for i := 0; len(ids) < 4; i++ {
		id := fmt.Sprint("id-", i)
		s := m.shardOf(&memKey{name: r.Name, identity: id, algo: r.Algorithm})
		if len(ids) == 0 {
			shard = s
		}
		if s == shard {
			ids = append(ids, id)
		}
	}
	checks := []ratebudget.Check{{Rule: r, Identity: ids[0], Cost: 1}, {Rule: r, Identity: ids[1], Cost: 1}, {Rule: r, Identity: ids[2], Cost: 1}}
	ctx := context.Background()
	if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
		t.Fatalf("first request: %+v %v", d, err)
	}
	if n := m.Len(); n != 3 {
		t.Fatalf("Len %d, want the request's 3 budgets", n)
	}
	if d, err := m.Allow(ctx, checks); err != nil || d.Allowed {
		t.Fatalf("second request of spent budgets: %+v %v", d, err)
	}
	if d, err := m.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: ids[3], Cost: 1}}); err != nil || !d.Allowed {
		t.Fatalf("a new identity: %+v %v", d, err)
	}
	if n := m.Len(); n != 1 {
		t.Fatalf("Len %d after a new identity on the shard, want its share, 1", n)
	}
}

// TestSweepShrinksMap: a shard whose budgets mostly expired after a flood gets a map
// sized for what it still holds, once calls have reached it enough times to sweep it
// (sweepBatch budgets each) and to move what it holds.
func TestSweepShrinksMap(t *testing.T) {
	const sweep = 100 * time.Millisecond
	m, clk := newTestMemory(t, WithSweepInterval(sweep))
	short := ratebudget.Rule{Name: "short", Limit: 1, Window: time.Second}
	long := ratebudget.Rule{Name: "long", Limit: 1, Window: time.Hour}
	ctx := context.Background()
	for i := range 2000 * memShards {
		r := short
		if i%100 == 0 {
			r = long
		}
		if d, err := m.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: fmt.Sprint("id-", i), Cost: 1}}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	most := 0
	for i := range m.shards {
		most = max(most, m.shards[i].n)
	}
	clk.advance(time.Second + sweep)
	// A sweep of the expired budgets, then one that moves the rest to the new map.
	rounds := (most+sweepBatch-1)/sweepBatch + 2
	ids := identityPerShard(t, m, short)
	for range rounds {
		for _, id := range ids { // a call on every shard goes on with its sweep
			if _, err := m.Allow(ctx, []ratebudget.Check{{Rule: short, Identity: id, Cost: 2}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range m.shards {
		s := &m.shards[i]
		if s.n == 0 || s.n > 60 || s.big != s.n || len(s.m) != s.n || s.old != nil {
			t.Fatalf("shard %d after %d calls: %d held, %d most since the map was made, map %d, old map %v",
				i, rounds, s.n, s.big, len(s.m), s.old != nil)
		}
	}
}

// TestCapEvictedLeases: an InFlight budget evicted at the cap loses its leases, as
// docs/MEMORY.md says: its identity may then hold up to Limit more leases at once, a
// renewal of a lost lease reports ErrLeaseLost, and settling one is harmless.
func TestCapEvictedLeases(t *testing.T) {
	m, _ := newTestMemory(t, WithMaxBudgets(memShards))
	r := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Hour}
	var ids []string
	var shard int
	for i := 0; len(ids) < 2; i++ {
		id := fmt.Sprint("id-", i)
		s := m.shardOf(&memKey{name: r.Name, identity: id, algo: r.Algorithm})
		if len(ids) == 0 {
			shard = s
		}
		if s == shard {
			ids = append(ids, id)
		}
	}
	ctx := context.Background()
	holder := []ratebudget.Check{{Rule: r, Identity: ids[0], Cost: 1}}
	var held [][]ratebudget.Ticket
	for range r.Limit {
		tk := make([]ratebudget.Ticket, 1)
		if d, err := m.Reserve(ctx, holder, tk, nil); err != nil || !d.Allowed {
			t.Fatalf("lease: %+v %v", d, err)
		}
		held = append(held, tk)
	}
	if d, _ := m.Allow(ctx, holder); d.Allowed {
		t.Fatalf("a lease beyond the limit: %+v", d)
	}
	// A new identity on the shard, whose share is one budget, evicts the holder's.
	if d, _ := m.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: ids[1], Cost: 1}}); !d.Allowed {
		t.Fatalf("a new identity: %+v", d)
	}
	if m.holds(&memKey{name: r.Name, identity: ids[0], algo: r.Algorithm}) {
		t.Fatal("the holder's budget was not evicted")
	}
	if m.Evictions() == 0 {
		t.Fatal("the holder's budget was dropped without an eviction")
	}
	if err := m.Renew(ctx, holder, held[0]); err != ratebudget.ErrLeaseLost {
		t.Fatalf("Renew of an evicted lease: %v, want ErrLeaseLost", err)
	}
	if d, _ := m.Allow(ctx, holder); !d.Allowed || d.Remaining != r.Limit-1 {
		t.Fatalf("after the eviction: %+v, want a fresh budget", d)
	}
	if err := m.Settle(ctx, holder, held[1], nil); err != nil {
		t.Fatal(err)
	}
}

// TestSweepAfterClockWentBack: a clock (WithClock) that jumped forward and came back does
// not stop the sweep until it reaches the far time again: state that expires after the
// clock came back is dropped a sweep interval later, as docs/MEMORY.md says.
func TestSweepAfterClockWentBack(t *testing.T) {
	const sweep = 100 * time.Millisecond
	m, clk := newTestMemory(t, WithSweepInterval(sweep))
	r := ratebudget.Rule{Name: "short", Limit: 1, Window: time.Second}
	ids := identityPerShard(t, m, r)
	ctx := context.Background()
	call := func(cost int64) {
		for _, id := range ids { // a call on every shard
			if _, err := m.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: id, Cost: cost}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	clk.advance(24 * time.Hour)
	call(2) // refused: creates nothing, plans every shard's next sweep a day ahead
	clk.advance(-24 * time.Hour)
	call(1) // one budget per shard, expiring in a second
	if n := m.Len(); n != memShards {
		t.Fatalf("Len %d, want %d", n, memShards)
	}
	clk.advance(time.Second + sweep)
	call(2)
	if n := m.Len(); n != 0 {
		t.Fatalf("Len %d a sweep interval after every budget expired, want 0", n)
	}
}

// TestSweepBoundedPerCall: a call sweeps a bounded number of budgets, whatever the shard
// holds, and steady traffic still reclaims every expired budget within a bounded number
// of calls. About 1,000 expired budgets per shard (a past flood) are reclaimed by traffic
// that reaches every shard in turn and creates a new budget of one hour with each call:
// no call may drop more than 32 budgets (as the Limiter's documentation says), and within
// ceil(share/32)+2 rounds only the traffic's budgets are left.
func TestSweepBoundedPerCall(t *testing.T) {
	const (
		perShard = 1000
		perCall  = 32 // the most budgets a call sweeps in a shard it reaches
	)
	m, clk := newTestMemory(t, WithMaxBudgets(1<<20), WithSweepInterval(time.Second))
	flood := ratebudget.Rule{Name: "flood", Limit: 1, Window: time.Second}
	for i := range perShard * memShards {
		if d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: flood, Identity: fmt.Sprint("f-", i), Cost: 1}}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	most := 0
	for i := range m.shards {
		most = max(most, m.shards[i].n)
	}
	clk.advance(2 * time.Second) // every window ended, every shard's sweep due

	// rounds new identities per shard, under a rule whose budgets outlive the test.
	traffic := ratebudget.Rule{Name: "traffic", Limit: 1, Window: time.Hour}
	rounds := (most+perCall-1)/perCall + 2
	ids := make([][]string, memShards)
	for i, full := 0, 0; full < memShards; i++ {
		id := fmt.Sprint("t-", i)
		s := m.shardOf(&memKey{name: traffic.Name, identity: id, algo: traffic.Algorithm})
		if len(ids[s]) < rounds {
			if ids[s] = append(ids[s], id); len(ids[s]) == rounds {
				full++
			}
		}
	}
	created := 0
	for r := range rounds {
		for s := range memShards {
			before := m.Len()
			if d, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: traffic, Identity: ids[s][r], Cost: 1}}); err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
			created++
			if dropped := before + 1 - m.Len(); dropped > perCall {
				t.Fatalf("round %d, shard %d: one call dropped %d budgets, want at most %d", r, s, dropped, perCall)
			}
		}
	}
	if n := m.Len(); n != created {
		t.Fatalf("after %d rounds of traffic on every shard (a shard held %d expired budgets at most): Len %d, want the traffic's %d",
			rounds, most, n, created)
	}
}

// checkShard fails t unless s is consistent: its queue runs from oldest to newest and
// holds s.n budgets, each found under its hash in exactly one of the maps (the one being
// replaced included), which hold nothing else; the sweep's place is a budget of the
// queue, or none. queued is scratch space.
func checkShard(t *testing.T, s *memShard, step int, queued map[*budget]bool) {
	t.Helper()
	clear(queued)
	var last *budget
	for b := s.oldest; b != nil; b = b.newer {
		if queued[b] {
			t.Fatalf("step %d: the queue loops", step)
		}
		queued[b] = true
		last = b
	}
	if last != s.newest || len(queued) != s.n {
		t.Fatalf("step %d: queue of %d ending at %p, want %d ending at %p", step, len(queued), last, s.n, s.newest)
	}
	if s.kept != nil && !queued[s.kept] {
		t.Fatalf("step %d: the sweep goes on after a budget that left the queue", step)
	}
	chained := 0
	for _, mm := range []map[uint64]*budget{s.m, s.old} {
		for h, head := range mm {
			if _, dup := s.m[h]; dup && s.old != nil && s.old[h] != nil {
				t.Fatalf("step %d: hash %d in both maps", step, h)
			}
			for b := head; b != nil; b = b.next {
				if b.h != h || !queued[b] {
					t.Fatalf("step %d: chain %d holds %+v, not a queued budget of that hash", step, h, b)
				}
				chained++
			}
		}
	}
	if chained != s.n {
		t.Fatalf("step %d: %d budgets chained, %d held", step, chained, s.n)
	}
}

// TestSweepResumesConsistently: a sweep spread over calls, evictions at the cap that move
// and drop budgets around the sweep's place, budgets sharing a hash, and a map replaced
// while all of this goes on leave the shard consistent, and every budget still held is
// found by its key; once every budget expired, calls over two sweep intervals drop them
// all.
func TestSweepResumesConsistently(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := memShard{m: make(map[uint64]*budget), max: 600}
	m := &Limiter{sweep: 5}
	type key struct {
		k memKey
		h uint64
	}
	var keys []key
	queued := map[*budget]bool{}
	now := int64(1)
	var resumed, replaced int
	for step := range 15_000 {
		m.maybeSweep(&s, now)
		if s.kept != nil {
			resumed++
		}
		switch op := rng.IntN(100); {
		case op < 60: // a new budget, at the cap evicting, hashes often shared
			k := key{memKey{name: "r", identity: strconv.Itoa(step)}, uint64(rng.IntN(2048))}
			b, collides := s.find(k.h, &k.k)
			if b != nil {
				t.Fatalf("step %d: a new key found", step)
			}
			b = s.insert(k.h, &k.k, collides, s.makeRoom(now, nil))
			b.expires = now + 1 + rng.Int64N(100)
			keys = append(keys, k)
		case op < 95 && len(keys) > 0: // a lookup of a recent key, which marks its budget used
			k := keys[max(0, len(keys)-1-rng.IntN(2*s.max))]
			s.get(k.h, &k.k)
		case op < 96: // every budget looked up: the eviction hand passes them all over
			for b := s.oldest; b != nil; b = b.newer {
				b.marks |= marked
			}
		case op < 99:
			now += rng.Int64N(3)
		default: // as after a flood: the map is made again when this sweep ends
			s.big = max(s.big, 4*s.n+1024)
		}
		if s.old != nil {
			replaced++
		}
		checkShard(t, &s, step, queued)
	}
	// Every budget still held is found.
	for b := s.oldest; b != nil; b = b.newer {
		k := memKey{name: b.name, identity: b.identity}
		if s.get(b.h, &k) != b {
			t.Fatalf("budget %q held but not found", b.identity)
		}
	}
	t.Logf("%d calls within a sweep under way, %d while the map was replaced, %d evictions", resumed, replaced, s.evictions)
	if resumed < 800 || replaced < 100 || s.evictions < 1000 {
		t.Fatal("the walk did not exercise resumed sweeps, replaced maps and evictions")
	}
	now += 200
	for range 2 * (s.n/sweepBatch + 2) {
		m.maybeSweep(&s, now)
		now += m.sweep
	}
	checkShard(t, &s, -1, queued)
	if s.n != 0 || s.old != nil {
		t.Fatalf("%d budgets held after every one expired and two sweeps, old map %v", s.n, s.old != nil)
	}
}
