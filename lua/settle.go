package lua

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
)

var _ ratebudget.Settler = (*Limiter)(nil)

// newLease draws a lease number and its member: 64 random bits, in 16 hex digits, so that
// leases of every replica sharing the budget differ (two collide with probability about
// n²/2^65 for n leases).
func newLease() (int64, string) {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		if id := int64(binary.LittleEndian.Uint64(b[:])); id != 0 {
			return id, leaseMember(id)
		}
	}
}

func leaseMember(id int64) string { return fmt.Sprintf("%016x", uint64(id)) }

// ticketOf builds check c's ticket from allow.lua's mode-2 ticket value tk and its sixth
// value aux (see settle.lua).
func ticketOf(c *ratebudget.Check, tk, aux int64) ratebudget.Ticket {
	switch c.Rule.Algorithm {
	case ratebudget.FixedWindow:
		return ratebudget.Ticket{At: tk, ID: 1}
	case ratebudget.RollingWindow:
		return ratebudget.Ticket{At: tk, ID: aux}
	case ratebudget.InFlight:
		return ratebudget.Ticket{At: tk} // ID: the lease number, set by the caller
	}
	return ratebudget.Ticket{At: 1, ID: 1}
}

// Reserve decides as Allow does and records each check's spend in tickets (see
// [ratebudget.Settler]). It never goes through the refusal cache or coalescing: each
// reserved decision is its own script call. Checks of several slots are decided as
// Allow decides them; when a later slot group refuses, the earlier groups' spend is
// refunded and their tickets are zero. Each reservation has an id, in every ticket's
// Reservation; when the call fails with an uncertain error (it may have spent) the
// limiter voids it, off the request path, so that nothing stays spent for a caller who
// was not admitted (see the package documentation).
func (l *Limiter) Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	// Zero first, so that a call that fails, before anything is sent too, leaves nothing
	// to settle.
	clear(tickets[:min(len(tickets), len(checks))])
	if len(tickets) < len(checks) {
		if err := ratebudget.ValidateSettle(checks, tickets, nil); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	if outcomes != nil && len(outcomes) != len(checks) {
		return ratebudget.Decision{}, &ratebudget.ConfigError{Field: "outcomes", Problem: "must have one element per check"}
	}
	d, err := l.core.decide(ctx, checks, tickets[:len(checks)], outcomes)
	l.admitted(checks, d, err)
	return d, err
}

// Settle adjusts a reserved decision's spend to the actual costs (see
// [ratebudget.Settler]): one settle.lua call per slot group (one in all with
// [WithOneServer]) gives back what was reserved above the actual cost, charges what was
// used above the reservation and releases the leases; a group whose checks are all
// charged above is one allow.lua call in mode '3', the code settle.lua runs for them.
// Each call is atomic; across slot groups it is not. The calls of several slot groups
// are sent at once, each within ctx: a group whose server stalls does not keep the
// others from being settled. A failure is a
// *[ratebudget.StoreError]: when certain, that group's reservation stays in place (an
// overcount), its extras uncharged and its leases left to expire; when uncertain
// (StoreError.Uncertain: the reply was lost, or a command failed after the group's
// first write, which Redis keeps) the call may also have run, or run in part. Either
// way a group of a reservation (tickets with a Reservation) is then re-sent off the
// request path until it lands, and applies at most once (see the package documentation
// and [Limiter.Repairs]). The tickets are cleared whatever the outcome. A ctx that has
// already ended sends nothing (a certain error, as Renew's, and not re-sent): give a
// settle a context that outlives the caller's (context.WithoutCancel, with a timeout of
// its own), as package middleware does, so that work ending at shutdown is settled.
func (l *Limiter) Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error {
	if err := ratebudget.ValidateSettle(checks, tickets, costs); err != nil {
		return err
	}
	var err error
	if cerr := ctx.Err(); cerr != nil {
		// Nothing is sent: certain, as for a decision. The tickets are cleared all the same.
		err = certain(cerr)
		clear(tickets[:len(checks)])
	} else {
		err = l.core.settle(ctx, checks, tickets, costs, nil, nil, false)
	}
	if l.refusals != nil {
		// Budget given back may admit sooner than a cached refusal's wait. Other
		// processes' caches still refuse for at most their cached wait.
		l.refusals.GaveBack(checks)
	}
	return err
}

// Renew extends the decision's leases to their rule's Window from the server's now (see
// [ratebudget.Settler]); one settle.lua call per slot group.
func (l *Limiter) Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	if err := ratebudget.ValidateSettle(checks, tickets, nil); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return certain(err) // nothing is sent
	}
	return l.core.settle(ctx, checks, tickets, nil, nil, nil, true)
}

// settle settles, or with renewing renews the leases of, the checks whose tickets are
// not zero, at costs (nil: 0 for every check): one settle.lua call per slot group. keys
// and slots are the checks' keys and hash slots, or nil to compute them. Unless renewing,
// it clears the tickets.
func (c *core) settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64, keys []string, slots []uint16, renewing bool) error {
	n := len(checks)
	if keys == nil {
		keys, slots = make([]string, n), make([]uint16, n)
		for i := range checks {
			k, s, _ := c.keys.appendKey(nil, nil, &checks[i])
			keys[i], slots[i] = string(k), s
		}
	}
	mode := "settle"
	if renewing {
		mode = "renew"
	}
	// One call per slot group, built first and then sent: the groups of several slots
	// at once, so that a group whose master stalls does not use up ctx's time for the
	// others (their leases would stay held until their TTL).
	type call struct {
		args   []any
		gkeys  []string
		checks []ratebudget.Check // the group's checks settled, when marked
		marked bool               // a reservation's settle: gkeys ends with its marker
		charge bool               // only extras: allow.lua's mode '3'
		err    error
		lost   bool
		// panicked is set when the call panicked (a client hook's bug) on a goroutine
		// of its own, with p its value: the panic goes on on the caller's goroutine.
		panicked bool
		p        any
	}
	var calls []*call
	seen := make([]bool, n)
	for first := range checks {
		if seen[first] {
			continue
		}
		var gkeys []string
		var gchecks []ratebudget.Check
		var rid int64 // the reservation's id, if it has one
		args := []any{mode}
		extras := []any{"3"} // allow.lua's arguments, while every check is charged above
		for i := first; i < n; i++ {
			if seen[i] || !c.oneServer && slots[i] != slots[first] {
				continue
			}
			seen[i] = true
			t, ch := tickets[i], &checks[i]
			if t == (ratebudget.Ticket{}) {
				continue
			}
			r := &ch.Rule
			member := "-"
			var give, extra, aux int64
			switch {
			case r.Algorithm == ratebudget.InFlight:
				member = leaseMember(t.ID) // released, or renewed
			case renewing:
				continue
			case costs == nil:
				give = ch.Cost
			case costs[i] < ch.Cost:
				give = ch.Cost - costs[i]
			case costs[i] > ch.Cost:
				extra = costs[i] - ch.Cost
			default:
				continue // settled at the reserved cost: nothing to change
			}
			if r.Algorithm == ratebudget.RollingWindow {
				aux = t.ID
			}
			if rid == 0 {
				rid = t.Reservation
			}
			gchecks = append(gchecks, *ch)
			gkeys = append(gkeys, keys[i])
			args = append(args, int64(r.Algorithm), r.Limit, r.Window.Milliseconds(), r.Capacity(), give, extra, aux, t.At, member)
			if extras != nil && extra > 0 {
				extras = append(extras, int64(r.Algorithm), r.Limit, r.Window.Milliseconds(), r.Capacity(), extra)
			} else {
				extras = nil
			}
		}
		if len(gkeys) == 0 {
			continue
		}
		if rid != 0 && !renewing {
			// A reservation's settle deletes its marker, and is re-sent after a failure:
			// through settle.lua, whose marker makes it apply at most once.
			args[0] = "first"
			calls = append(calls, &call{
				gkeys:  append(gkeys, markerKey(keys[first], rid)),
				args:   append(args, markerTTLArg),
				checks: gchecks,
				marked: true,
			})
			continue
		}
		if extras != nil {
			// Only extras: allow.lua's mode '3' itself, the code settle.lua would run for
			// them, without settle.lua's own work.
			calls = append(calls, &call{gkeys: gkeys, args: extras, charge: true})
		} else {
			calls = append(calls, &call{gkeys: gkeys, args: args})
		}
	}
	do := func(k *call) {
		if k.charge {
			v, err := c.run(ctx, allowScript, allowSource, k.gkeys, k.args)
			if err != nil {
				k.err = classify(err)
			} else if vals, ok := v.([]any); !ok || len(vals) != 6*len(k.gkeys) {
				k.err = badReply(fmt.Sprintf("charge: %v", v))
			}
			return
		}
		v, err := c.run(ctx, settleScript, settleSource, k.gkeys, k.args)
		if err != nil {
			k.err = classify(err)
			if se, ok := k.err.(*ratebudget.StoreError); ok && partlyWritten(err) {
				se.Uncertain = true // Redis keeps the writes before the failure
			}
		} else if vals, ok := v.([]any); !ok || len(vals) != len(k.gkeys) && !(k.marked && len(vals) == len(k.gkeys)-1) {
			k.err = badReply(fmt.Sprintf("settle: %v", v))
		} else if renewing {
			for _, x := range vals {
				if x != int64(1) {
					k.lost = true
				}
			}
		}
	}
	if len(calls) == 1 {
		do(calls[0])
	} else {
		var wg sync.WaitGroup
		for _, k := range calls {
			wg.Go(func() {
				defer func() {
					if p := recover(); p != nil {
						k.panicked, k.p = true, p
					}
				}()
				do(k)
			})
		}
		wg.Wait()
		for _, k := range calls {
			if k.panicked {
				panic(k.p) // on the caller's goroutine, as with a single call
			}
		}
	}
	if !renewing {
		clear(tickets[:n])
	}
	for _, k := range calls {
		if k.marked && k.err != nil {
			args := append([]any{"retry"}, k.args[1:]...)
			var done func()
			if c.gaveBack != nil {
				done = func() { c.gaveBack(k.checks) }
			}
			c.repair.add(ctx, k.gkeys, args, done)
		}
	}
	var firstErr error
	lost := false
	for _, k := range calls {
		firstErr = firstOf(firstErr, k.err)
		lost = lost || k.lost
	}
	if firstErr != nil {
		return firstErr
	}
	if lost {
		return ratebudget.ErrLeaseLost
	}
	return nil
}

// partlyWritten reports whether err is settle.lua's reply for a command that failed
// after the call's first write (see settle.lua).
func partlyWritten(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), "ratebudget: settle partly written")
}

func firstOf(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
