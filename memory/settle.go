package memory

import (
	"context"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/argcheck"
)

// Settle adjusts the spend of a decision admitted by [Limiter.Reserve] to the actual
// costs, as "Settling a decision" in [ratebudget] describes, exactly and atomically for
// all checks: the shards of every check are locked at once. checks and tickets are those
// of Reserve; costs[i] (0 to 2^40) is check i's actual cost, and nil costs cancel every
// check. It clears the tickets it settles. It returns an error only for invalid arguments
// (a *[ratebudget.ConfigError]); the context is not consulted.
func (m *Limiter) Settle(_ context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error {
	m.ready()
	if err := argcheck.Settle(checks, tickets, costs); err != nil {
		return err
	}
	m.each(checks, tickets, func(s *memShard, i int, b *budget, now int64) *budget {
		c := &checks[i]
		actual := int64(0)
		if costs != nil {
			actual = costs[i]
		}
		switch {
		case c.Rule.Algorithm == ratebudget.InFlight:
			if b != nil {
				release(b, tickets[i], now)
			}
		case actual < c.Cost:
			if b != nil {
				refund(b, &c.Rule, tickets[i], c.Cost-actual, now)
			}
		case actual > c.Cost:
			if b == nil {
				return nil // created by each, and handed back
			}
			charge(b, &c.Rule, actual-c.Cost, now, &m.cal)
		}
		tickets[i] = ratebudget.Ticket{}
		return b
	}, func(i int) bool {
		// A charge on a budget that is gone (swept, evicted) creates it.
		return checks[i].Rule.Algorithm != ratebudget.InFlight && costs != nil && costs[i] > checks[i].Cost
	})
	return nil
}

// Renew extends every InFlight lease of a decision admitted by [Limiter.Reserve] to its
// rule's Window from now, as "Settling a decision" in [ratebudget] describes; it reports
// [ratebudget.ErrLeaseLost] when a lease had expired (the others are renewed). It returns
// no other error than for invalid arguments.
func (m *Limiter) Renew(_ context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	m.ready()
	if err := argcheck.Settle(checks, tickets, nil); err != nil {
		return err
	}
	lost := false
	m.each(checks, tickets, func(s *memShard, i int, b *budget, now int64) *budget {
		if checks[i].Rule.Algorithm == ratebudget.InFlight && !renew(b, &checks[i].Rule, tickets[i], now) {
			lost = true
		}
		return b
	}, nil)
	if lost {
		return ratebudget.ErrLeaseLost
	}
	return nil
}

// each calls fn, with the shards of all checks locked, for each check i whose ticket is
// not zero, with its budget (nil when it holds none). When b is nil and create(i)
// reports true, fn is first called with nil and, if it returns nil, called again with a
// budget just created for it, in the state of no state at all.
func (m *Limiter) each(checks []ratebudget.Check, tickets []ratebudget.Ticket, fn func(s *memShard, i int, b *budget, now int64) *budget, create func(i int) bool) {
	var kbuf [8]memKey
	var hbuf [8]uint64
	var sbuf [8]int
	var bbuf [8]*budget
	keys, hashes, shards := m.locate(checks, kbuf[:0], hbuf[:0], sbuf[:0])
	now := m.now()
	locked := m.lock(shards, now)
	// Every budget of the call is looked up before any is created, so that room is never
	// made at the expense of this call's other budgets, later checks' included.
	found := bbuf[:0]
	for i := range checks {
		var b *budget
		if tickets[i] != (ratebudget.Ticket{}) {
			b = m.shards[shards[i]].get(hashes[i], &keys[i])
		}
		found = append(found, b)
	}
	for i := range checks {
		if (tickets[i] == ratebudget.Ticket{}) {
			continue
		}
		s := &m.shards[shards[i]]
		if b := fn(s, i, found[i], now); b == nil && create != nil && create(i) {
			b = s.insert(hashes[i], &keys[i], true, s.makeRoom(now, found))
			freshState(b, &checks[i].Rule, now)
			found[i] = fn(s, i, b, now)
		}
	}
	m.unlock(&locked)
}
