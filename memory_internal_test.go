package ratebudget

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
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

func newTestMemory(t *testing.T, opts ...MemoryOption) (*Memory, *manualClock) {
	t.Helper()
	clk := &manualClock{t: time.UnixMilli(1_767_225_600_250)}
	m, err := NewMemory(append([]MemoryOption{WithClock(clk.now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m, clk
}

// identityPerShard returns, for every shard, an identity whose budget under r (scope
// empty) lives in that shard.
func identityPerShard(t *testing.T, m *Memory, r Rule) [memShards]string {
	t.Helper()
	var out [memShards]string
	found := 0
	for i := 0; found < memShards; i++ {
		if i > 1_000_000 {
			t.Fatalf("only %d of %d shards reached", found, memShards)
		}
		id := fmt.Sprint("id-", i)
		s := m.shardOf(&memKey{r.Name, r.Algorithm, id, ""})
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
	rules := []Rule{
		{Name: "fixed", Algorithm: FixedWindow, Limit: 5, Window: time.Second},
		{Name: "token", Algorithm: TokenBucket, Limit: 5, Window: time.Second},
		{Name: "rolling", Algorithm: RollingWindow, Limit: 5, Window: time.Second},
	}
	ids := identityPerShard(t, m, rules[0])
	for _, r := range rules {
		for _, id := range ids {
			// The whole capacity: each budget is whole again exactly 1s later.
			if d, err := m.Allow(context.Background(), []Check{{Rule: r, Identity: id, Cost: 5}}); err != nil || !d.Allowed {
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
		probe := Rule{Name: "probe", Limit: 1, Window: time.Second}
		for _, id := range identityPerShard(t, m, probe) {
			d, err := m.Allow(context.Background(), []Check{{Rule: probe, Identity: id, Cost: 2}})
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
	a := Rule{Name: "a", Algorithm: FixedWindow, Limit: 5, Window: time.Minute}
	b := Rule{Name: "b", Algorithm: TokenBucket, Limit: 1000, Window: time.Minute}
	c := Rule{Name: "c", Algorithm: RollingWindow, Limit: 1000, Window: time.Minute}
	ka, kb := memKey{a.Name, a.Algorithm, "", ""}, memKey{b.Name, b.Algorithm, "x", ""}
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
				checks := []Check{
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
	d, _ := m.Allow(context.Background(), []Check{{Rule: b, Identity: kb.identity, Cost: 1001}})
	if d.Remaining != 1000-5 {
		t.Fatalf("b spent %d, want 5", 1000-d.Remaining)
	}
}

// TestHashCollisionsChain: budgets whose keys hash alike are told apart by their keys,
// and sweeping drops only the expired ones of a chain.
func TestHashCollisionsChain(t *testing.T) {
	s := memShard{m: make(map[uint64]*budget)}
	const h = 42
	keys := []memKey{{"a", FixedWindow, "x", ""}, {"a", FixedWindow, "y", ""}, {"a", TokenBucket, "x", ""}, {"b", FixedWindow, "x", "s"}}
	for i := range keys {
		if s.get(h, &keys[i]) != nil {
			t.Fatalf("key %d found before it was added", i)
		}
		b := s.add(h, &keys[i])
		b.expires = int64(i % 2) // keys 0 and 2 expire at 0, keys 1 and 3 at 1
	}
	for i := range keys {
		if b := s.get(h, &keys[i]); b == nil || b.key != keys[i] {
			t.Fatalf("key %d: got %+v", i, b)
		}
	}
	m := &Memory{sweep: 1}
	m.maybeSweep(&s, 1) // every budget expiring at or before 1ms
	if s.n != 0 || len(s.m) != 0 {
		t.Fatalf("after sweeping at 1: %d budgets, map %d", s.n, len(s.m))
	}
	for i := range keys {
		s.add(h, &keys[i]).expires = int64(10 + i%2)
	}
	s.nextSweep = 0
	m.maybeSweep(&s, 10) // keys 0 and 2 expire at 10
	if s.n != 2 {
		t.Fatalf("after sweeping at 10: %d budgets, want 2", s.n)
	}
	for i := range keys {
		if got := s.get(h, &keys[i]) != nil; got != (i%2 == 1) {
			t.Errorf("key %d present %v after the sweep", i, got)
		}
	}
}
