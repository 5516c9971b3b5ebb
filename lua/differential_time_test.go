package lua_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
)

// phase is the step of TestSameSettlesOverTime's clock (see there).
const phase = time.Second

// TestSameSettlesOverTime is TestSameSettlesAsMemory with time moving: the walk goes
// in phases, and short fixed windows, rolling windows and in-flight leases close, age
// out and expire between them, so that spends are settled after their window closed or
// their event left the window, extras open new windows, rolling-window events are
// trimmed before give-backs, and leases are renewed after they expired. Settles are
// also repeated (the tickets are cleared: nothing more changes) and leases released by
// a settle are renewed from a copy of their tickets (lost on both).
//
// Phase j runs on the server's clock from I_j = I_0 + j×phase, when the walk has seen
// the server's clock pass it, for at most phase/4 (no new step starts later), while
// Memory's clock reads exactly I_0 + j×phase. Short windows and lease TTLs are an odd
// number of half phases, (m-1/2)×phase: a spend, window or lease of phase k then
// still counts in phase j on the server exactly when j-k < m, as in Memory, as long as
// no step stalls for a quarter of a phase. Long rules (hours) sit next to them, as in
// TestSameSettlesAsMemory.
func TestSameSettlesOverTime(t *testing.T) {
	srv := redistest.Start(t)
	for _, run := range []struct {
		name  string
		scale int64 // fixed and rolling windows' limits and costs are multiplied by it
		seed  uint64
	}{{"units", 1, 5}, {"near-MaxLimit", bound.MaxLimit / 8, 7}} {
		t.Run(run.name, func(t *testing.T) {
			t.Parallel() // each limiter has keys of its own; the walks mostly wait for phases
			settlesOverTime(t, srv.Client(t), run.scale, run.seed)
		})
	}
}

// settlesOverTime is one walk of TestSameSettlesOverTime.
func settlesOverTime(t *testing.T, c *redis.Client, scale int64, seed uint64) {
	opts := []lua.Option{lua.WithRefusalCache(0)}
	limiters := []namedLimiter{
		{"pool", newLimiter(t, c, opts...)},
		{"one-server-refusal-cache", newLimiter(t, c, lua.WithOneServer())},
		{"coalesced", newLimiter(t, c, append(opts, lua.WithCoalescing(64))...)},
	}
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	short := func(alg ratebudget.Algorithm, halves time.Duration, limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: fmt.Sprintf("%s-short%d", algname.Of(alg), halves), Algorithm: alg, Limit: limit, Window: halves * phase / 2}
	}
	long := func(alg ratebudget.Algorithm, hours time.Duration, limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: fmt.Sprintf("%s-%dh", algname.Of(alg), hours), Algorithm: alg, Limit: limit, Window: hours * time.Hour}
	}
	burst := long(ratebudget.TokenBucket, 17, 3)
	burst.Burst = 6
	rules := []ratebudget.Rule{
		short(ratebudget.FixedWindow, 1, 4), short(ratebudget.FixedWindow, 3, 3), short(ratebudget.FixedWindow, 5, 5),
		short(ratebudget.RollingWindow, 1, 5), short(ratebudget.RollingWindow, 3, 4), short(ratebudget.RollingWindow, 7, 6),
		short(ratebudget.InFlight, 1, 1), short(ratebudget.InFlight, 5, 2),
		long(ratebudget.FixedWindow, 1, 5), long(ratebudget.RollingWindow, 2, 6),
		long(ratebudget.TokenBucket, 7, 4), burst, long(ratebudget.InFlight, 9, 3),
		long(ratebudget.FixedWindow, 8, 2), // a cost of 3 exceeds it
	}
	scaled := func(a ratebudget.Algorithm) bool { return a == ratebudget.FixedWindow || a == ratebudget.RollingWindow }
	for i := range rules {
		if scaled(rules[i].Algorithm) {
			rules[i].Limit *= scale
		}
	}
	w := &diffWalk{t: t, o: walkOptions{each: true, settles: true, waits: phase / 2}, srv: c, clock: clock, mem: mem,
		limiters: limiters, rng: rand.New(rand.NewPCG(seed, 6))}
	rng := w.rng
	scopes := []string{"", "/reports"}
	var st struct{ phases, steps, cut, twice, stale, closed, aged int }
	start := w.serverNow()
	for j := range 28 {
		at := start.Add(time.Duration(j) * phase)
		// Poll the server's clock (TIME) until phase j has begun there.
		for now := w.serverNow(); now.Before(at); now = w.serverNow() {
			time.Sleep(phase / 50)
		}
		if j > 0 {
			clock.Advance(phase)
		}
		st.phases++
		for step := range 14 {
			if w.serverNow().Sub(at) > phase/4 {
				st.cut++
				break
			}
			st.steps++
			i := 14*j + step
			switch k := rng.IntN(10); {
			case k < 6 || len(w.pending) < 6: // reservations stay pending for a few phases
				n := 1 + rng.IntN(3)
				checks := make([]ratebudget.Check, 0, n)
				seen := map[[3]int]bool{}
				for len(checks) < n {
					r, id, sc := rng.IntN(len(rules)), rng.IntN(4), rng.IntN(len(scopes))
					if seen[[3]int{r, id, sc}] {
						continue
					}
					seen[[3]int{r, id, sc}] = true
					c := ratebudget.Check{Rule: rules[r], Identity: fmt.Sprintf("id-%d", id), Scope: scopes[sc], Cost: 1 + rng.Int64N(3)}
					switch {
					case c.Rule.Algorithm == ratebudget.InFlight:
						c.Cost = 1
					case scaled(c.Rule.Algorithm) && scale > 1:
						c.Cost = c.Cost*scale - rng.Int64N(scale)
					}
					checks = append(checks, c)
				}
				if res := w.decide(i, checks, rng.IntN(2) == 0); res != nil {
					w.pending = append(w.pending, res)
				}
			case k < 9:
				p := w.take(rng.IntN(len(w.pending)))
				now := clock.Now().UnixMilli()
				for j, c := range p.checks {
					switch tk := p.mem[j]; {
					case c.Rule.Algorithm == ratebudget.FixedWindow && now >= tk.At:
						st.closed++ // Memory's ticket holds the window's end
					case c.Rule.Algorithm == ratebudget.RollingWindow && tk.At <= now-c.Rule.Window.Milliseconds():
						st.aged++ // and the event's time
					}
				}
				stale := &reservation{checks: p.checks, mem: append([]ratebudget.Ticket(nil), p.mem...)}
				for _, tk := range p.lua {
					stale.lua = append(stale.lua, append([]ratebudget.Ticket(nil), tk...))
				}
				w.settle(i, p)
				if rng.IntN(3) == 0 {
					// Settling again changes nothing: the tickets were cleared.
					st.twice++
					w.settleAgain(i, p)
				}
				if hasAlgorithm(p.checks, ratebudget.InFlight) && rng.IntN(2) == 0 {
					// A released lease is lost to a renewal.
					st.stale++
					w.renew(i, stale)
				}
			default:
				// A reservation with leases; half the time the oldest, whose short leases
				// may have expired.
				var leased []*reservation
				for _, p := range w.pending {
					if hasAlgorithm(p.checks, ratebudget.InFlight) {
						leased = append(leased, p)
					}
				}
				if len(leased) > 0 {
					w.renew(i, leased[rng.IntN(len(leased))*rng.IntN(2)])
				}
			}
		}
	}
	for len(w.pending) > 0 {
		w.settle(-1, w.take(0))
	}
	s := &w.st
	t.Logf("%d phases, %d steps (%d phases cut short); %d admitted, %d refused, %d exceeded; %d reservations; checks settled: "+
		"%d at 0, %d below, %d at, %d above, %d leases released; rolling-window give-backs %d applied, %d skipped; "+
		"%d settled twice, %d renewals (%d of expired leases, %d of released leases); %d in-flight refusals; "+
		"%d checks settled after their fixed window closed, %d after their rolling-window event left the window",
		st.phases, st.steps, st.cut, w.admitted, w.refused, w.exceeded, s.reserved, s.cancels, s.below, s.equal, s.above,
		s.released, s.givenBack, s.skipped, st.twice, s.renewed, s.lost-st.stale, st.stale, s.leaseRefused, st.closed, st.aged)
	// The walk's choices are seeded, but where phases are cut short follows the server's
	// clock, so the counts move with the machine's load; the floors are about half the
	// lowest counts seen.
	if w.admitted < 100 || w.refused < 30 || w.exceeded < 5 || s.reserved < 40 || s.cancels < 15 || s.below < 3 ||
		s.above < 5 || s.givenBack < 5 || s.lost-st.stale < 3 || st.twice < 8 || st.stale < 5 || s.leaseRefused < 1 ||
		st.closed < 8 || st.aged < 8 {
		t.Fatal("want at least 100 admitted, 30 refused, 5 exceeded, 40 reservations; checks settled 15 at 0, 3 below, " +
			"5 above; 5 rolling-window give-backs; 3 renewals of expired leases; 8 settled twice; 5 renewals of released " +
			"leases; an in-flight refusal; 8 checks settled after their fixed window closed and 8 after their event left the window")
	}
}

func hasAlgorithm(checks []ratebudget.Check, alg ratebudget.Algorithm) bool {
	for _, c := range checks {
		if c.Rule.Algorithm == alg {
			return true
		}
	}
	return false
}

// settleAgain settles p, settled already, again at random costs on Memory and on every
// limiter: every call must succeed and leave the tickets zero, and the budgets are then
// compared by a decision at cost 1.
func (w *diffWalk) settleAgain(i int, p *reservation) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	costs := make([]int64, len(p.checks))
	for j := range costs {
		costs[j] = w.rng.Int64N(8)
	}
	if err := w.mem.Settle(ctx, p.checks, p.mem, costs); err != nil {
		t.Fatalf("before decision %d: Memory's second settle: %v", i, err)
	}
	for k, nl := range w.limiters {
		if err := nl.l.(limitertest.Settler).Settle(ctx, p.checks, p.lua[k], costs); err != nil {
			t.Fatalf("before decision %d, %s: second settle: %v", i, nl.name, err)
		}
		for j, tk := range p.lua[k] {
			if tk != (ratebudget.Ticket{}) {
				t.Fatalf("before decision %d, %s: ticket %d is %+v after a settle", i, nl.name, j, tk)
			}
		}
	}
	probe := make([]ratebudget.Check, 0, len(p.checks))
	for _, c := range p.checks {
		if c.Rule.Algorithm != ratebudget.InFlight {
			c.Cost = 1
			probe = append(probe, c)
		}
	}
	if len(probe) > 0 {
		w.decide(i, probe, false)
	}
}
