package lua

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/ratebudget/ratebudget"
)

// MaxCoalescedGroup is the largest accepted [WithCoalescing] group.
const MaxCoalescedGroup = 4096

// WithCoalescing decides concurrent identical decisions for one budget together, in
// groups of up to maxGroup (2 to [MaxCoalescedGroup]): while a decision for a set of
// checks (same budgets, rules and costs) is in flight, further decisions for the same
// set wait, and are then sent as one script call that asks for all of their cost at
// once. A hot budget then costs Redis one call per group instead of one per request.
//
// It changes no outcome. A group admitted in full is, exactly, its members admitted one
// after another at the same server time: each member gets the remaining budget it would
// have seen in that order (the reset time reported is the budget's after the whole
// group). A group that does not fit entirely spends nothing, and its members are then
// decided one by one, so the budget's last units go to single requests as without
// coalescing. A group never asks for more than a rule's capacity.
//
// The price is latency for concurrent requests on one budget: a request that finds a
// decision in flight waits for it before its own group is sent (at most one extra round
// trip). Requests for different budgets never wait for each other. In a decision whose
// checks live in several hash slots, each slot's checks are coalesced on their own, so
// a service-wide budget decided next to per-client ones is grouped across clients.
// With [WithOneServer] such a decision is one call for all its checks, and only
// decisions with the same checks throughout are grouped.
//
// A member whose context ends while its group waits leaves it with nothing spent, and
// one whose context ends after the group was sent gets an uncertain error, as a caller
// of a single call would. If the member that sends a group has its context end (or its
// AllowWithin bound pass) during the call, the other members decide on their own: the
// group may have spent, so the budget may be over-counted, never under-counted.
func WithCoalescing(maxGroup int) Option {
	return func(l *Limiter) error {
		if maxGroup < 2 || maxGroup > MaxCoalescedGroup {
			return &ratebudget.ConfigError{Field: "WithCoalescing", Problem: fmt.Sprintf("must be 2 to %d decisions, got %d", MaxCoalescedGroup, maxGroup)}
		}
		l.coalesceMax = maxGroup
		return nil
	}
}

const coalesceShards = 32

// coalescer tracks, per decision signature, whether a call is in flight and which
// decisions wait for the next one. It holds an entry only while a call is in flight.
type coalescer struct {
	seed    maphash.Seed
	max     int
	shards  [coalesceShards]coalesceShard
	flights sync.Pool // *flight
	groups  sync.Pool // *group
	sealed  func()    // for tests: called by handoff, shard locked, as it wakes a group's sender
}

type coalesceShard struct {
	mu sync.Mutex
	m  map[uint64]*flight
	_  [48]byte
}

// flight is a signature with a call in flight. Decisions with the same signature that
// arrive meanwhile join next, which is sent when that call returns.
type flight struct {
	sig  []byte
	next *group
}

// group is decisions waiting to be sent as one call. Its members are the callers'
// scratches, in arrival order; members[0] sends the call.
type group struct {
	members []*scratch
}

// Roles a waiting member other than the group's sender is woken with.
const (
	roleNone  uint8 = iota
	roleDone        // the group was admitted: s.outs holds this member's outcomes
	roleErr         // the group's call failed: s.gerr
	roleAlone       // decide alone
)

func newCoalescer(max int) *coalescer {
	c := &coalescer{seed: maphash.MakeSeed(), max: max}
	for i := range c.shards {
		c.shards[i].m = make(map[uint64]*flight)
	}
	return c
}

// spendCoalesced is runAllow, deciding and spending the checks in s.idx (one slot's),
// with WithCoalescing: it stores their outcomes in s.outs and s.aux and reports whether
// all were admitted. The signature of a group is its checks' keys, rule parameters and
// costs, in s.idx order; members may hold them at other positions of their own checks.
func (l *Limiter) spendCoalesced(ctx context.Context, timeout time.Duration, s *scratch, checks []ratebudget.Check) (bool, error) {
	c := l.coal
	most := c.max
	s.sig = s.sig[:0]
	for _, j := range s.idx {
		ch := &checks[j]
		key := s.key(j)
		s.sig = binary.AppendUvarint(s.sig, uint64(len(key)))
		s.sig = append(s.sig, key...)
		s.sig = binary.AppendUvarint(s.sig, uint64(ch.Rule.Algorithm))
		s.sig = binary.AppendUvarint(s.sig, uint64(ch.Rule.Limit))
		s.sig = binary.AppendUvarint(s.sig, uint64(ch.Rule.Window))
		s.sig = binary.AppendUvarint(s.sig, uint64(ch.Rule.Burst))
		s.sig = binary.AppendUvarint(s.sig, uint64(ch.Cost))
		if n := ch.Rule.Capacity() / ch.Cost; n < int64(most) {
			most = int(n)
		}
	}
	if most < 2 {
		return l.runAllow(ctx, timeout, s, checks, true)
	}
	h := maphash.Bytes(c.seed, s.sig)
	sh := &c.shards[h%coalesceShards]
	sh.mu.Lock()
	f := sh.m[h]
	if f == nil {
		f, _ = c.flights.Get().(*flight)
		if f == nil {
			f = &flight{}
		}
		f.sig = append(f.sig[:0], s.sig...)
		sh.m[h] = f
		sh.mu.Unlock()
		ok, err := l.runAllow(ctx, timeout, s, checks, true)
		c.handoff(sh, h, f)
		return ok, err
	}
	g := f.next
	if !bytes.Equal(f.sig, s.sig) || g != nil && len(g.members) >= most {
		// Another signature with the same hash, or a full group: decide alone.
		sh.mu.Unlock()
		return l.runAllow(ctx, timeout, s, checks, true)
	}
	if g == nil {
		g, _ = c.groups.Get().(*group)
		if g == nil {
			g = &group{}
		}
		f.next = g
	}
	g.members = append(g.members, s)
	s.waiting, s.runner, s.role = true, false, roleNone
	sh.mu.Unlock()

	var start time.Time
	if timeout > 0 {
		start = time.Now()
	}
	if err := s.await(ctx, timeout); err != nil {
		sh.mu.Lock()
		if s.waiting {
			// The group was not sent: leave it, nothing spent.
			s.waiting = false
			g.remove(s)
			if len(g.members) == 0 {
				f.next = nil
				c.groups.Put(g)
			}
			sh.mu.Unlock()
			return false, certain(err)
		}
		runner := s.runner
		sh.mu.Unlock()
		if runner {
			// s was to send the group: the others decide alone; nothing was sent.
			<-s.wake // sent under the lock, before the role was read
			c.release(g, roleAlone, nil)
			c.handoff(sh, h, f)
			return false, certain(err)
		}
		// The group is on its way and its sender will write into s: never reuse it.
		s.lost = true
		return false, classify(err)
	}
	if timeout > 0 {
		if timeout -= time.Since(start); timeout <= 0 {
			timeout = 1 // spent while waiting: the call fails at once as a timeout
		}
	}
	switch {
	case s.runner:
	case s.role == roleDone:
		return true, nil
	case s.role == roleErr:
		err := s.gerr
		s.gerr = nil
		return false, err
	default: // roleAlone
		return l.runAllow(ctx, timeout, s, checks, true)
	}
	// s is the runner: send the group's call, asking for every member's cost at once.
	n := len(g.members)
	s.mult = int64(n)
	ok, err := l.runAllow(ctx, timeout, s, checks, true)
	s.mult = 1
	switch {
	case err == nil && ok:
		for i := n - 1; i >= 0; i-- { // the sender, members[0], last: the others copy its outs
			m := g.members[i]
			for k, j := range s.idx {
				mj := m.idx[k]
				m.outs[mj] = s.outs[j]
				m.outs[mj].Remaining += int64(n-1-i) * checks[j].Cost
				m.aux[mj] = s.aux[j] // a rolling window's event: a refund finds it (and may give back less)
			}
		}
		c.release(g, roleDone, nil)
		c.handoff(sh, h, f)
		return true, nil
	case err != nil && ctx.Err() == nil && !isTimeout(err):
		// A store failure concerns every member alike.
		c.release(g, roleErr, err)
		c.handoff(sh, h, f)
		return false, err
	default:
		// Not all fit (nothing was spent), or this caller's own time ran out (the others
		// still have theirs): decide one by one.
		c.release(g, roleAlone, nil)
		c.handoff(sh, h, f)
		if err != nil {
			return false, err
		}
		return l.runAllow(ctx, timeout, s, checks, true)
	}
}

// release wakes the members of a sent group other than its sender (members[0]) with
// role, and recycles the group.
func (c *coalescer) release(g *group, role uint8, err error) {
	for _, m := range g.members[1:] {
		m.role = role
		if err != nil {
			m.gerr = copyStoreError(err)
		}
		m.wake <- struct{}{}
	}
	clear(g.members)
	g.members = g.members[:0]
	c.groups.Put(g)
}

// handoff ends f's call in flight: the group that formed meanwhile, if any, is sent by
// its first member; otherwise the signature is forgotten.
func (c *coalescer) handoff(sh *coalesceShard, h uint64, f *flight) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := f.next
	if g == nil {
		delete(sh.m, h)
		c.flights.Put(f)
		return
	}
	f.next = nil
	for _, m := range g.members {
		m.waiting = false
	}
	r := g.members[0]
	r.runner = true
	if c.sealed != nil {
		c.sealed()
	}
	r.wake <- struct{}{} // buffered: never blocks
}

func (g *group) remove(s *scratch) {
	for i, m := range g.members {
		if m == s {
			g.members = append(g.members[:i], g.members[i+1:]...)
			g.members[len(g.members):cap(g.members)][0] = nil
			return
		}
	}
}

// await waits for s to be woken, for ctx, or for timeout when it is above zero.
func (s *scratch) await(ctx context.Context, timeout time.Duration) error {
	if timeout <= 0 {
		select {
		case <-s.wake:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.timer == nil {
		s.timer = time.NewTimer(timeout)
	} else {
		s.timer.Reset(timeout)
	}
	defer s.timer.Stop()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.timer.C:
		return context.DeadlineExceeded
	}
}

// certain is the store error for a decision that was never sent.
func certain(err error) error {
	se := classify(err).(*ratebudget.StoreError)
	se.Uncertain = false
	return se
}

func isTimeout(err error) bool {
	se, ok := err.(*ratebudget.StoreError)
	return ok && (se.Class == "timeout" || se.Class == "canceled")
}

// copyStoreError gives each member of a failed group an error of its own.
func copyStoreError(err error) error {
	if se, ok := err.(*ratebudget.StoreError); ok {
		cp := *se
		return &cp
	}
	return err
}
