package lua

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/argcheck"
)

// resetSource deletes the budget keys it is given: a budget is one key (see allow.lua's
// State), so its state, of whatever time rule, is gone with it.
const resetSource = "return redis.call('DEL', unpack(KEYS))"

var resetScript = redis.NewScript(resetSource)

// Reset forgets the state of each check's budget in Redis, as "Resetting a budget" in
// the [ratebudget] package documentation describes: one script call deletes the budget keys of each hash slot (of all checks
// with [WithOneServer]), so the budgets of one slot are reset together, atomically, and
// those of several slots one slot after another. Cost is ignored. Then this limiter's
// refusal cache drops its refusals of those budgets, also those decided before the
// reset and still on their way back: the next request through this limiter is decided
// by Redis. Other replicas' caches may repeat a refusal cached before the reset for at
// most 1s ([WithRefusalCache]). Reset needs DEL in the Redis user's ACL, as the
// scripts' refunds do. It returns by ctx's deadline: a *[ratebudget.ConfigError] for no
// checks or an invalid rule (nothing is sent), else the first failure of a slot's call
// (a *[ratebudget.StoreError]: when Uncertain, that slot's budgets may have been reset);
// the other slots are still tried. It is safe for concurrent use.
func (l *Limiter) Reset(ctx context.Context, checks ...ratebudget.Check) error {
	if err := argcheck.Reset(checks); err != nil {
		return err
	}
	c := l.core
	keys := make([]string, len(checks))
	slots := make([]uint16, len(checks))
	var buf, scratch []byte
	for i := range checks {
		buf, slots[i], scratch = c.keys.Append(buf[:0], scratch, &checks[i])
		keys[i] = string(buf)
	}
	var first error
	for i := range checks {
		g := resetGroup(slots, i, c.oneServer)
		if g == nil {
			continue
		}
		group := make([]string, 0, len(g))
		for _, j := range g {
			group = append(group, keys[j])
		}
		if _, err := c.run(ctx, resetScript, resetSource, group, nil); err != nil && first == nil {
			first = classify(err)
		}
	}
	if l.refusals != nil {
		// After the calls, also after a failure (the keys may be gone): a refusal
		// decided before the reset is dropped, or never cached.
		l.refusals.GaveBack(checks)
	}
	return first
}

// resetGroup returns the indexes of the checks whose keys one call deletes with check
// first's, if first is the first of them, else nil: the checks of first's slot, or with
// oneServer all checks.
func resetGroup(slots []uint16, first int, oneServer bool) []int {
	if oneServer {
		if first > 0 {
			return nil
		}
		all := make([]int, len(slots))
		for i := range all {
			all[i] = i
		}
		return all
	}
	return slotGroup(slots, first)
}
