package memory

import (
	"context"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/argcheck"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

const memShards = 64

// defaultMaxBudgets is the number of budgets a [Limiter] holds at most unless
// [WithMaxBudgets] says otherwise.
const defaultMaxBudgets = 100_000

// sweepInterval is how often, in ms, each shard of a [Limiter] starts dropping expired
// state: a sweep is spread over the calls that reach the shard, a few budgets per call
// (docs/MEMORY.md).
const sweepInterval = 10_000

// Limiter is the in-process [ratebudget.Limiter]: the same time rules as the Redis
// limiter (package lua), kept in this process's memory. It is exact for one process.
//
// Limiter reports every check's outcome and settles decisions, as package ratebudget's
// documentation says ("Reporting every check", "Settling a decision"): settling is
// exact, and a decision's checks are settled atomically, as they are decided.
//
// The zero Limiter is ready to use with the defaults; [New] applies options. A Limiter
// must not be copied after first use. It is safe for concurrent use and starts no
// goroutine: expired state is reclaimed during calls (each shard starts a sweep at most
// every 10s), and no call pays for reclaiming a whole shard.
//
// The number of budgets held is capped ([WithMaxBudgets], default 100,000), so that
// identities rotating faster than their windows end cannot grow the process without
// bound. At the cap a new budget evicts a budget that has expired or has not been looked
// up for the longest while (an approximation of least recently used), never one of the
// request being decided. Budgets still held are exact; an evicted identity's next request
// starts from a fresh budget, so it may be admitted up to one rule capacity more than
// its rule allows within that window, and an evicted InFlight budget's leases are lost
// (renewing one reports [ratebudget.ErrLeaseLost]). A refusal of an identity that holds
// no budget creates none. The shards, the sweep, the choice of the evicted budget and
// how to size the cap: docs/MEMORY.md.
type Limiter struct {
	once   sync.Once    // sets the fields below: in New, or at the first use of a zero Limiter
	now    func() int64 // Unix milliseconds
	seed   maphash.Seed
	sweep  int64                // ms between sweeps of one shard
	max    int                  // budgets held at most, over all shards
	cal    timerule.PeriodCache // the current periods of the Calendar rules decided
	shards [memShards]memShard
}

// Option configures a [Limiter].
type Option func(*Limiter) error

// WithClock makes the limiter read time from now, for tests and simulations. now must
// not be nil. The default reads the wall clock once and then follows the monotonic
// clock, so setting the system clock does not move budgets.
func WithClock(now func() time.Time) Option {
	return func(m *Limiter) error {
		if now == nil {
			return &ratebudget.ConfigError{Field: "WithClock", Problem: "clock must not be nil"}
		}
		m.now = func() int64 { return now().UnixMilli() }
		return nil
	}
}

// WithMaxBudgets caps the number of budgets the limiter holds at n (default 100,000). A
// budget is one rule, identity and scope whose state has not expired; a request of three
// rules holds up to three per identity. The cap bounds the limiter's memory, whatever the
// length of identities and scopes: about 17 MB at the default cap when identities are as
// short as IP addresses, and at most about 40 MB (docs/MEMORY.md has the measurements and
// how to size the cap). n must be at least 64, or New returns a *[ratebudget.ConfigError]
// naming "WithMaxBudgets"; small caps protect less (see docs/MEMORY.md). What happens at
// the cap: [Limiter].
func WithMaxBudgets(n int) Option {
	return func(m *Limiter) error {
		if n < memShards {
			return &ratebudget.ConfigError{Field: "WithMaxBudgets", Problem: "must be at least " + strconv.Itoa(memShards) + ", got " + strconv.Itoa(n)}
		}
		m.max = n
		return nil
	}
}

// New returns an empty in-process limiter, or a *[ratebudget.ConfigError] naming the first
// invalid option (a nil option included).
func New(opts ...Option) (*Limiter, error) {
	m := new(Limiter)
	var err error
	m.once.Do(func() { err = m.setup(opts) })
	if err != nil {
		return nil, err
	}
	return m, nil
}

// ready makes a zero Limiter ready with the defaults, once; it does nothing to a
// Limiter made by New.
func (m *Limiter) ready() { m.once.Do(m.defaults) }

func (m *Limiter) defaults() { _ = m.setup(nil) } // no option: no error

// setup gives m the defaults, then applies opts, then makes its shards.
func (m *Limiter) setup(opts []Option) error {
	m.now, m.seed, m.sweep, m.max = monotonicClock(), maphash.MakeSeed(), sweepInterval, defaultMaxBudgets
	for _, o := range opts {
		if o == nil {
			return &ratebudget.ConfigError{Field: "Option", Problem: "must not be nil"}
		}
		if err := o(m); err != nil {
			return err
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
	return nil
}

var _ ratebudget.Limiter = (*Limiter)(nil)

// InProcess reports true: the limiter decides in this process's memory, without I/O, so
// its decisions never wait on a store. Package middleware gives such a limiter no
// per-decision deadline and no circuit breaker.
func (m *Limiter) InProcess() bool { return true }

// monotonicClock returns a clock (Unix milliseconds) that reads wall time once and then
// advances with the monotonic clock, so that setting the system clock moves no budget.
func monotonicClock() func() int64 {
	start := time.Now()
	ms := start.UnixMilli()
	return func() int64 { return ms + time.Since(start).Milliseconds() }
}

// Allow decides all checks at once, all-or-nothing. It returns an error only for invalid
// checks; the context is not consulted (a decision takes no I/O): a context already
// canceled is decided, and spent, as any other, where the Redis limiter sends nothing
// and spends nothing. A caller that must not spend for canceled work checks
// ctx.Err() first, as package middleware does.
func (m *Limiter) Allow(_ context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	return m.allow(checks, nil, nil)
}

// AllowEach decides as Allow does and sets outcomes[i] to checks[i]'s outcome, as
// "Reporting every check" in [ratebudget] says: an outcome describes its budget right
// after the decision (before the cost, in a refused decision). outcomes must have
// len(checks) elements.
func (m *Limiter) AllowEach(_ context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	if err := argcheck.Outcomes(len(checks), len(outcomes)); err != nil {
		return ratebudget.Decision{}, err
	}
	return m.allow(checks, outcomes, nil)
}

// Reserve decides as Allow does and, when it admits, records each check's spend in
// tickets for [Limiter.Settle] and [Limiter.Renew]; on a refusal or an error it zeroes
// them. tickets must hold at least len(checks) entries. outcomes is nil, or receives
// each check's outcome as AllowEach's does.
func (m *Limiter) Reserve(_ context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	// Zero first, so that an invalid call, too, leaves nothing to settle.
	clear(tickets[:min(len(tickets), len(checks))])
	if len(tickets) < len(checks) {
		if err := argcheck.Settle(checks, tickets, nil); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	if outcomes != nil {
		if err := argcheck.Outcomes(len(checks), len(outcomes)); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	return m.allow(checks, outcomes, tickets[:len(checks)])
}

// allow decides checks; out is nil or receives each check's outcome, tickets is nil or
// receives each check's ticket.
func (m *Limiter) allow(checks []ratebudget.Check, out []ratebudget.Outcome, tickets []ratebudget.Ticket) (ratebudget.Decision, error) {
	m.ready()
	if err := ratebudget.ValidateChecks(checks); err != nil {
		return ratebudget.Decision{}, err
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
		var o [1]ratebudget.Outcome
		b, collides := s.find(h, &k)
		if b != nil {
			o[0] = decide(b, &c.Rule, c.Cost, now, true, lease, &m.cal) // writes only if it admits
		} else if o[0] = decide(nil, &c.Rule, c.Cost, now, false, lease, &m.cal); o[0].Allowed {
			// State is created only for an admission: refusals leave nothing behind.
			spare := s.makeRoom(now, nil)
			b = s.insert(h, &k, collides, spare)
			freshState(b, &c.Rule, now)
			o[0] = decide(b, &c.Rule, c.Cost, now, true, lease, &m.cal)
		}
		if tickets != nil {
			tickets[0] = ratebudget.Ticket{}
			if o[0].Allowed {
				tickets[0] = ticketOf(b, &c.Rule, now, lease)
			}
		}
		s.mu.Unlock()
		if out != nil {
			out[0] = o[0]
		}
		return ratebudget.Combine(checks, o[:]), nil
	}
	return m.allowMany(checks, now, out, tickets), nil
}

func (m *Limiter) allowMany(checks []ratebudget.Check, now int64, out []ratebudget.Outcome, tickets []ratebudget.Ticket) ratebudget.Decision {
	var kbuf [8]memKey
	var hbuf [8]uint64
	var sbuf [8]int
	var obuf [8]ratebudget.Outcome
	var bbuf [8]*budget
	keys, hashes, shards := m.locate(checks, kbuf[:0], hbuf[:0], sbuf[:0])
	outs, found := obuf[:0], bbuf[:0]
	for range checks {
		outs = append(outs, ratebudget.Outcome{})
		found = append(found, nil)
	}
	locked := m.lock(shards, now)
	allowed := true
	for i := range checks {
		found[i] = m.shards[shards[i]].get(hashes[i], &keys[i])
		outs[i] = decide(found[i], &checks[i].Rule, checks[i].Cost, now, false, 0, &m.cal)
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
			outs[i] = decide(b, &checks[i].Rule, checks[i].Cost, now, true, lease, &m.cal)
			if tickets != nil {
				tickets[i] = ticketOf(b, &checks[i].Rule, now, lease)
			}
		}
	} else {
		// Nothing was spent: the checks that fit are reported with their budgets as
		// they are.
		for i := range checks {
			if outs[i].Allowed {
				outs[i] = unspent(found[i], &checks[i].Rule, now, &m.cal)
			}
		}
		if tickets != nil {
			clear(tickets)
		}
	}
	m.unlock(&locked)
	copy(out, outs)
	return ratebudget.Combine(checks, outs)
}
