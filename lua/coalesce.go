package lua

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/deadline"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// coalescer is a layer in front of a limiter that groups concurrent identical
// decisions: a decision that finds one for the same checks in flight waits, and the
// decisions that gathered meanwhile are then sent as one decision asking for all of
// their cost (see the package documentation). Each waiting decision has a group of its
// own; the only state shared between callers is the flights map and the groups.
type coalescer struct {
	inner  layer
	max    int    // largest group
	sealed func() // run as a group is sealed, with its shard locked (tests)
	seed   maphash.Seed
	mu     [coalesceShards]struct {
		sync.Mutex
		m map[uint64]*flight
	}
}

const coalesceShards = 32

// flight is a decision for one signature in flight, and the group that waits for it.
type flight struct {
	checks []ratebudget.Check // the decision's checks, compared in full by joiners
	next   *group             // the decisions waiting for this flight to end; nil: none
}

// group is decisions gathered behind a flight. When the flight lands the group is
// sealed: the members whose context is still live at that moment are its members, and
// the first of them sends the group's decision for all.
type group struct {
	waiting []*waiter     // in order of arrival; guarded by the shard's lock until sealed
	send    chan struct{} // closed when the group is sealed
	// Set when sealed, before send is closed:
	sealed bool
	live   []*waiter
	// Set by the sender before done is closed:
	done   chan struct{}
	d      ratebudget.Decision
	outs   []ratebudget.Outcome // each check's outcome for the group's cost
	err    error
	alone  bool     // the group was refused or its sender gave up: decide one by one
	places chan int // member places 0 to len(live)-1, for their Remaining
}

// waiter is one decision waiting in a group.
type waiter struct{ ctx context.Context }

func newCoalescer(inner layer, max int) *coalescer {
	c := &coalescer{inner: inner, max: max, seed: maphash.MakeSeed()}
	for i := range c.mu {
		c.mu[i].m = make(map[uint64]*flight)
	}
	return c
}

// signature hashes the checks; flights compare checks in full, so a collision only
// costs a missed group.
func (c *coalescer) signature(checks []ratebudget.Check) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	var b [8]byte
	for i := range checks {
		ch := &checks[i]
		h.WriteString(ch.Rule.Name)
		h.Write(binary.LittleEndian.AppendUint64(b[:0], uint64(ch.Rule.Limit)^uint64(ch.Rule.Window)<<2^uint64(ch.Rule.Algorithm)))
		h.Write(binary.LittleEndian.AppendUint64(b[:0], uint64(len(ch.Identity))))
		h.WriteString(ch.Identity)
		h.Write(binary.LittleEndian.AppendUint64(b[:0], uint64(len(ch.Scope))))
		h.WriteString(ch.Scope)
	}
	return h.Sum64()
}

// groupable reports how many decisions for checks one group may hold: all costs
// equal (so that a member's place tells how many units more it sees remaining) and
// the group's cost within every rule's capacity (so that a group is never Exceeded
// when its members are not). Below 2 the decision is not coalesced.
func (c *coalescer) groupable(checks []ratebudget.Check) int {
	n := int64(c.max)
	cost := checks[0].Cost
	for i := range checks {
		if checks[i].Cost != cost || cost <= 0 {
			return 0
		}
		n = min(n, timerule.Capacity(&checks[i].Rule)/cost)
	}
	return int(n)
}

// Allow decides checks, in a group when an identical decision is in flight.
func (c *coalescer) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	return c.allow(ctx, checks, nil)
}

// AllowEach is Allow, reporting every check's outcome: a member of a group gets the
// outcomes it would have seen admitted one after another (see member).
func (c *coalescer) AllowEach(ctx context.Context, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	return c.allow(ctx, checks, outs)
}

// alone decides checks without coalescing: outs is nil or receives each outcome.
func (c *coalescer) alone(ctx context.Context, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	if outs == nil {
		return c.inner.Allow(ctx, checks)
	}
	return c.inner.AllowEach(ctx, checks, outs)
}

// allow is Allow, and with outs not nil AllowEach.
func (c *coalescer) allow(ctx context.Context, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	if len(checks) == 0 || ratebudget.ValidateChecks(checks) != nil {
		return c.alone(ctx, checks, outs)
	}
	limit := c.groupable(checks)
	if limit < 2 {
		return c.alone(ctx, checks, outs)
	}
	sig := c.signature(checks)
	sh := &c.mu[sig%coalesceShards]
	sh.Lock()
	f := sh.m[sig]
	if f == nil {
		// Nothing in flight: decide now, then hand the flight to whoever waits.
		f = &flight{checks: slices.Clone(checks)}
		sh.m[sig] = f
		sh.Unlock()
		// Landed also when the call panics (a client hook's bug): the decisions waiting
		// behind it would otherwise wait for a flight that never lands.
		defer c.land(sig, f)
		return c.alone(ctx, checks, outs)
	}
	if !slices.Equal(f.checks, checks) || f.next != nil && len(f.next.waiting) >= limit {
		sh.Unlock()
		return c.alone(ctx, checks, outs) // another decision, or a full group
	}
	g := f.next
	if g == nil {
		g = &group{send: make(chan struct{}), done: make(chan struct{})}
		f.next = g
	}
	w := &waiter{ctx: ctx}
	g.waiting = append(g.waiting, w)
	sh.Unlock()

	select {
	case <-g.send:
	case <-ctx.Done():
		sh.Lock()
		sealed := g.sealed
		if !sealed {
			g.waiting = slices.DeleteFunc(g.waiting, func(x *waiter) bool { return x == w })
		}
		sh.Unlock()
		if !sealed {
			return ratebudget.Decision{}, certain(ctx.Err())
		}
		<-g.send
	}
	if !slices.Contains(g.live, w) {
		return ratebudget.Decision{}, certain(ctx.Err()) // gone when the group was sealed
	}
	if g.live[0] == w {
		return c.sendGroup(ctx, sig, f, g, checks, outs)
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		// The group's call may spend for this decision: uncertain.
		return ratebudget.Decision{}, classify(ctx.Err())
	}
	return c.member(ctx, g, checks, outs)
}

// land ends flight f: its waiting group, if any, is sealed with the members whose
// context is live, and its first member told to send (the group's decision is then
// the flight); with none waiting the flight is removed.
func (c *coalescer) land(sig uint64, f *flight) {
	sh := &c.mu[sig%coalesceShards]
	sh.Lock()
	defer sh.Unlock()
	g := f.next
	if g == nil || len(g.waiting) == 0 {
		delete(sh.m, sig)
		return
	}
	f.next = nil
	if c.sealed != nil {
		c.sealed()
	}
	for _, w := range g.waiting {
		if w.ctx.Err() == nil {
			g.live = append(g.live, w)
		}
	}
	g.sealed = true
	g.places = make(chan int, len(g.live))
	for i := range len(g.live) {
		g.places <- i
	}
	if len(g.live) == 0 {
		delete(sh.m, sig) // nobody left to send
	}
	close(g.send)
}

// sendGroup decides the group's checks for all of its members' cost, publishes the
// result to the members and returns the sender's own.
func (c *coalescer) sendGroup(ctx context.Context, sig uint64, f *flight, g *group, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	n := len(g.live)
	sent := false
	defer func() {
		if !sent {
			// The call panicked (a client hook's bug): the flight lands, and the other
			// members decide for themselves, as when the sender gives up.
			g.alone = true
			c.land(sig, f)
			close(g.done)
		}
	}()
	var d ratebudget.Decision
	var err error
	if n == 1 {
		d, err = c.alone(ctx, checks, outs)
	} else {
		many := slices.Clone(checks)
		for i := range many {
			many[i].Cost *= int64(n)
		}
		// The group's outcomes, from which each member's decision is made (see member).
		g.outs = make([]ratebudget.Outcome, len(checks))
		d, err = c.inner.AllowEach(ctx, many, g.outs)
	}
	sent = true
	c.land(sig, f)
	g.d, g.err = d, err
	switch {
	case n == 1:
	case err != nil && deadline.Ended(ctx):
		g.alone = true // the sender gave up; the others decide for themselves
	case err == nil && !d.Allowed:
		g.alone = true // the group does not fit: share the last units out one by one
	}
	close(g.done)
	if n > 1 && g.alone {
		if err != nil {
			return ratebudget.Decision{}, err
		}
		return c.alone(ctx, checks, outs)
	}
	if n == 1 {
		return d, err
	}
	return c.member(ctx, g, checks, outs)
}

// member returns a member's part of its group's result; outs is nil or receives each
// check's outcome.
func (c *coalescer) member(ctx context.Context, g *group, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	if g.alone {
		return c.alone(ctx, checks, outs)
	}
	if g.err != nil {
		return ratebudget.Decision{}, copyErr(g.err)
	}
	// Members are told what they would have seen admitted one after another at one
	// server time: place i of n sees (n-1-i) × cost more remaining. Their decision is
	// combined from their own outcomes, as a decision alone is: the rule it reports may
	// differ from the group's (a token bucket is full again sooner for a member).
	i := <-g.places
	more := int64(len(g.live)-1-i) * checks[0].Cost // all costs are equal (groupable)
	var ob [4]ratebudget.Outcome
	if outs == nil && len(checks) <= len(ob) {
		outs = ob[:len(checks)]
	} else if outs == nil {
		outs = make([]ratebudget.Outcome, len(checks))
	}
	for j := range outs {
		outs[j] = timerule.SpentFewer(&checks[j].Rule, g.outs[j], more)
	}
	return ratebudget.Combine(checks, outs), nil
}

// certain is the error of a decision that gave up before anything was sent for it.
func certain(err error) error {
	se := classify(err).(*ratebudget.StoreError)
	se.Uncertain = false
	return se
}

// copyErr gives each member a store error of its own.
func copyErr(err error) error {
	if se, ok := err.(*ratebudget.StoreError); ok {
		cp := *se
		return &cp
	}
	return err
}
