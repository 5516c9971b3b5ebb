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
	"github.com/ratebudget/ratebudget/internal/argcheck"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

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
	case ratebudget.FixedWindow, ratebudget.Calendar:
		return ratebudget.Ticket{At: tk, ID: 1} // the window's PEXPIRETIME, the period's start
	case ratebudget.RollingWindow:
		return ratebudget.Ticket{At: tk, ID: aux}
	case ratebudget.InFlight:
		return ratebudget.Ticket{At: tk} // ID: the lease number, set by the caller
	}
	return ratebudget.Ticket{At: 1, ID: 1}
}

// Reserve decides as Allow does and records each check's spend in tickets (see "Settling
// a decision" in [ratebudget]). It never goes through the refusal cache or coalescing:
// each reserved decision is its own script call. Checks of several slots are decided as
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
		if err := argcheck.Settle(checks, tickets, nil); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	if outcomes != nil {
		if err := argcheck.Outcomes(len(checks), len(outcomes)); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	d, err := l.core.decide(ctx, checks, tickets[:len(checks)], outcomes)
	l.admitted(checks, d, err)
	return d, err
}

// Settle adjusts a reserved decision's spend to the actual costs (see "Settling a
// decision" in [ratebudget]): one settle.lua call per slot group (one in all with
// [WithOneServer]) gives back what was reserved above the actual cost, charges what was
// used above the reservation and releases the leases; a group whose checks are all
// charged above is one allow.lua call in mode '3', the code settle.lua runs for them.
// Each call is atomic; across slot groups it is not. The calls of several slot groups are
// sent at once, each within ctx: a group whose server stalls does not keep the others
// from being settled. A failure is a *[ratebudget.StoreError]: when certain, that group's
// reservation stays in place (an overcount), its extras uncharged and its leases left to
// expire; when uncertain (StoreError.Uncertain: the reply was lost, or a command failed
// after the group's first write, which Redis keeps) the call may also have run, or run in
// part. Either way a group of a reservation (tickets with a Reservation) is then re-sent
// off the request path until it lands, and applies at most once (see the package
// documentation and [Limiter.Repairs]). The tickets are cleared whatever the outcome. A
// ctx that has already ended sends nothing (a certain error, as Renew's, and not
// re-sent): give a settle a context that outlives the caller's (context.WithoutCancel,
// with a timeout of its own), as package middleware does, so that work ending at shutdown
// is settled.
func (l *Limiter) Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error {
	if err := argcheck.Settle(checks, tickets, costs); err != nil {
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
		// processes' caches still refuse for at most their cached wait, and 1s.
		l.refusals.GaveBack(checks)
	}
	return err
}

// Renew extends the decision's leases to their rule's Window from the server's now (see
// "Settling a decision" in [ratebudget]); one settle.lua call per slot group.
func (l *Limiter) Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	if err := argcheck.Settle(checks, tickets, nil); err != nil {
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
			k, s, _ := c.keys.Append(nil, nil, &checks[i])
			keys[i], slots[i] = string(k), s
		}
	}
	// One call per slot group, built first and then sent: the groups of several slots
	// at once, so that a group whose master stalls does not use up ctx's time for the
	// others (their leases would stay held until their TTL).
	var calls []*settleCall
	seen := make([]bool, n)
	for first := range checks {
		if seen[first] {
			continue
		}
		if k := c.settleGroup(checks, tickets, costs, keys, slots, seen, first, renewing); k != nil {
			calls = append(calls, k)
		}
	}
	sendAll(calls, func(k *settleCall) { c.sendSettle(ctx, k, renewing) })
	if !renewing {
		clear(tickets[:n])
	}
	for _, k := range calls {
		if k.marked && k.err != nil {
			c.resend(ctx, k)
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

// settleCall is one script call of a settle: a slot group's.
type settleCall struct {
	args   []any
	gkeys  []string
	checks []ratebudget.Check // the group's checks settled, in the order of their arguments
	marked bool               // a reservation's settle: gkeys ends with its marker
	charge bool               // only extras: allow.lua's mode '3'
	err    error
	lost   bool
	// panicked is set when the call panicked (a client hook's bug) on a goroutine of
	// its own, with p its value: the panic goes on on the caller's goroutine.
	panicked bool
	p        any
}

// settleGroup builds the call of the slot group of checks[first] (every check of the
// call with WithOneServer), marking its checks seen; nil when none of them has
// anything to settle.
func (c *core) settleGroup(checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64, keys []string, slots []uint16, seen []bool, first int, renewing bool) *settleCall {
	mode := "settle"
	if renewing {
		mode = "renew"
	}
	var gkeys []string
	var gchecks []ratebudget.Check
	var rid int64 // the reservation's id, if it has one
	args := []any{mode}
	extras := []any{"3"} // allow.lua's arguments, while every check is charged above
	var now int64        // Unix ms, read for a Calendar check (see core.window)
	for i := first; i < len(checks); i++ {
		if seen[i] || !c.oneServer && slots[i] != slots[first] {
			continue
		}
		seen[i] = true
		t, ch := tickets[i], &checks[i]
		if t == (ratebudget.Ticket{}) {
			continue
		}
		member, give, extra, ok := settleOf(ch, t, costs, i, renewing)
		if !ok {
			continue
		}
		r := &ch.Rule
		var aux int64
		if r.Algorithm == ratebudget.RollingWindow {
			aux = t.ID
		}
		if rid == 0 {
			rid = t.Reservation
		}
		gchecks = append(gchecks, *ch)
		gkeys = append(gkeys, keys[i])
		w := c.window(r, &now)
		args = append(args, int64(r.Algorithm), r.Limit, w, timerule.Capacity(r), give, extra, aux, t.At, member)
		if extras != nil && extra > 0 {
			extras = append(extras, int64(r.Algorithm), r.Limit, w, timerule.Capacity(r), extra)
		} else {
			extras = nil
		}
	}
	switch {
	case len(gkeys) == 0:
		return nil
	case rid != 0 && !renewing:
		// A reservation's settle deletes its marker, and is re-sent after a failure:
		// through settle.lua, whose marker makes it apply at most once.
		args[0] = "first"
		return &settleCall{
			gkeys:  append(gkeys, markerKey(keys[first], rid)),
			args:   append(args, markerTTLArg),
			checks: gchecks,
			marked: true,
		}
	case extras != nil:
		// Only extras: allow.lua's mode '3' itself, the code settle.lua would run for
		// them, without settle.lua's own work.
		return &settleCall{gkeys: gkeys, args: extras, checks: gchecks, charge: true}
	}
	return &settleCall{gkeys: gkeys, args: args, checks: gchecks}
}

// settleOf is what settling check ch of ticket t (checks[i]) at costs asks of
// settle.lua: the lease member ('-' but for an in-flight check, whose lease is released
// or renewed), the units to give back and the units to charge above the reservation.
// It reports false when there is nothing to do: renewing a check without a lease, or a
// settle at the reserved cost.
func settleOf(ch *ratebudget.Check, t ratebudget.Ticket, costs []int64, i int, renewing bool) (member string, give, extra int64, ok bool) {
	switch {
	case ch.Rule.Algorithm == ratebudget.InFlight:
		return leaseMember(t.ID), 0, 0, true
	case renewing:
		return "", 0, 0, false
	case costs == nil:
		return "-", ch.Cost, 0, true
	case costs[i] < ch.Cost:
		return "-", ch.Cost - costs[i], 0, true
	case costs[i] > ch.Cost:
		return "-", 0, costs[i] - ch.Cost, true
	}
	return "", 0, 0, false // settled at the reserved cost: nothing to change
}

// sendSettle sends call k and records its failure, and with renewing whether a lease
// was lost, in k. A charge above a reservation is allow.lua's code, which answers a
// Calendar check whose periods, computed around the caller's clock, miss the server's
// time: the call is then sent once more around the server's time, as a decision is (see
// core.runAround). A give-back never misses: it works from the ticket's period start.
func (c *core) sendSettle(ctx context.Context, k *settleCall, renewing bool) {
	rule := func(i int) *ratebudget.Rule { return &k.checks[i].Rule }
	if k.charge {
		v, err := c.runAround(ctx, allowScript, allowSource, k.gkeys, k.args, len(k.checks), 5, rule)
		if err != nil {
			k.err = classify(err)
		} else if vals, ok := v.([]any); !ok || len(vals) != 6*len(k.gkeys) {
			k.err = badReply(fmt.Sprintf("charge: %v", v))
		}
		return
	}
	v, err := c.runAround(ctx, settleScript, settleSource, k.gkeys, k.args, len(k.checks), 9, rule)
	if err != nil {
		k.err = classify(err)
		if se, ok := k.err.(*ratebudget.StoreError); ok && partlyWritten(err) {
			se.Uncertain = true // Redis keeps the writes before the failure
		}
		return
	}
	vals, ok := v.([]any)
	if !ok || len(vals) != len(k.gkeys) && !(k.marked && len(vals) == len(k.gkeys)-1) {
		k.err = badReply(fmt.Sprintf("settle: %v", v))
		return
	}
	if renewing {
		for _, x := range vals {
			if x != int64(1) {
				k.lost = true
			}
		}
	}
}

// sendAll runs send for each call: on the caller's goroutine for one call, else each
// on a goroutine of its own, waiting for all. A panic of a call's send goes on on the
// caller's goroutine, once every call is done.
func sendAll(calls []*settleCall, send func(*settleCall)) {
	if len(calls) == 1 {
		send(calls[0])
		return
	}
	var wg sync.WaitGroup
	for _, k := range calls {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					k.panicked, k.p = true, p
				}
			}()
			send(k)
		})
	}
	wg.Wait()
	for _, k := range calls {
		if k.panicked {
			panic(k.p) // on the caller's goroutine, as with a single call
		}
	}
}

// resend hands the failed call k of a reservation's settle to the repairs, which re-send
// it until it lands; the refusal cache, if any, is told of the checks given back then.
func (c *core) resend(ctx context.Context, k *settleCall) {
	args := append([]any{"retry"}, k.args[1:]...)
	var done func()
	if c.gaveBack != nil {
		done = func() { c.gaveBack(k.checks) }
	}
	c.repair.add(ctx, k.gkeys, args, k.checks, done)
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
