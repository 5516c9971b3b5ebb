package lua

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"

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
// refunded and their tickets are zero.
func (l *Limiter) Reserve(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	if len(tickets) < len(checks) {
		if err := ratebudget.ValidateSettle(checks, tickets, nil); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	if outcomes != nil && len(outcomes) != len(checks) {
		return ratebudget.Decision{}, &ratebudget.ConfigError{Field: "outcomes", Problem: "must have one element per check"}
	}
	d, err := l.core.decide(ctx, checks, tickets[:len(checks)], outcomes)
	if err == nil && d.Allowed && l.refusals != nil {
		// The spend makes refusals and outcomes cached for these budgets stale reports,
		// as an admission through Allow does.
		l.refusals.ForgetChecks(checks)
	}
	return d, err
}

// Settle adjusts a reserved decision's spend to the actual costs (see
// [ratebudget.Settler]): per slot group one settle.lua call for what is given back and
// the leases released, and one allow.lua call (mode '3') for what is spent above the
// reservation. Each call is atomic; across slot groups and between the two calls of a
// group it is not. A failure leaves the reservation in place (an overcount) and the
// leases to expire; it is a *[ratebudget.StoreError]. The tickets are cleared whatever
// the outcome: a settle is never retried.
func (l *Limiter) Settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64) error {
	if err := ratebudget.ValidateSettle(checks, tickets, costs); err != nil {
		return err
	}
	err := l.core.settle(ctx, checks, tickets, costs, false)
	if l.refusals != nil {
		// Budget given back may admit sooner than a cached refusal's wait. Other
		// processes' caches still refuse for at most their cached wait.
		l.refusals.ForgetChecks(checks)
	}
	return err
}

// Renew extends the decision's leases to their rule's Window from the server's now (see
// [ratebudget.Settler]); one settle.lua call per slot group.
func (l *Limiter) Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	if err := ratebudget.ValidateSettle(checks, tickets, nil); err != nil {
		return err
	}
	return l.core.settle(ctx, checks, tickets, nil, true)
}

func (c *core) settle(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, costs []int64, renewing bool) error {
	n := len(checks)
	keys := make([]string, n)
	slots := make([]uint16, n)
	for i := range checks {
		k, s, _ := c.keys.appendKey(nil, nil, &checks[i])
		keys[i], slots[i] = string(k), s
		if c.oneServer {
			slots[i] = 0
		}
	}
	var firstErr error
	lost := false
	seen := make([]bool, n)
	for first := range checks {
		if seen[first] {
			continue
		}
		var skeys, fkeys []string
		sargs := []any{"settle"}
		if renewing {
			sargs[0] = "renew"
		}
		fargs := []any{"3"}
		for i := first; i < n; i++ {
			if seen[i] || slots[i] != slots[first] {
				continue
			}
			seen[i] = true
			t, ch := tickets[i], &checks[i]
			if t.IsZero() {
				continue
			}
			r := &ch.Rule
			lease := r.Algorithm == ratebudget.InFlight
			member := "-"
			if lease {
				member = leaseMember(t.ID)
			}
			var give int64
			switch {
			case renewing:
				if !lease {
					continue
				}
			case lease:
			case costs != nil && costs[i] > ch.Cost:
				fkeys = append(fkeys, keys[i])
				fargs = append(fargs, int64(r.Algorithm), r.Limit, r.Window.Milliseconds(), r.Capacity(), costs[i]-ch.Cost)
				continue
			case costs != nil && costs[i] == ch.Cost:
				continue
			default:
				give = ch.Cost
				if costs != nil {
					give -= costs[i]
				}
			}
			aux := int64(0)
			if r.Algorithm == ratebudget.RollingWindow {
				aux = t.ID
			}
			skeys = append(skeys, keys[i])
			sargs = append(sargs, int64(r.Algorithm), r.Limit, r.Window.Milliseconds(), r.Capacity(), give, aux, t.At, member)
		}
		if len(skeys) > 0 {
			v, err := c.run(ctx, settleScript, settleSource, skeys, sargs)
			if err != nil {
				firstErr = firstOf(firstErr, classify(err))
			} else if vals, ok := v.([]any); !ok || len(vals) != len(skeys) {
				firstErr = firstOf(firstErr, badReply(fmt.Sprintf("settle: %v", v)))
			} else if renewing {
				for _, x := range vals {
					if x != int64(1) {
						lost = true
					}
				}
			}
		}
		if len(fkeys) > 0 {
			if _, err := c.run(ctx, allowScript, allowSource, fkeys, fargs); err != nil {
				firstErr = firstOf(firstErr, classify(err))
			}
		}
	}
	if !renewing {
		clear(tickets[:n])
	}
	if firstErr != nil {
		return firstErr
	}
	if lost {
		return ratebudget.ErrLeaseLost
	}
	return nil
}

func firstOf(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
