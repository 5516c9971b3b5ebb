package lua_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the walk's zones, whatever the machine has installed

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
)

// namedLimiter is a limiter under test and its name in failure messages.
type namedLimiter struct {
	name string
	l    ratebudget.Limiter
}

// TestSameDecisionsAsMemory: a sequence of random decisions (one to four checks, every
// time rule, a token bucket with a burst, a rule that some costs exceed, two scopes,
// several slots) gets the same answers from the in-process limiter, whose clock is
// stopped, and from the Redis limiter through the pool, with coalescing, with
// WithOneServer (with and without the refusal cache), and with
// the demo server's options. Windows are hours long, so time does not move any budget
// while the test runs. The in-process limiter decides every check at once; the Redis
// limiter decides slot by slot and refunds the earlier slots when a later one refuses
// (except with WithOneServer), so an inexact refund would make a later decision differ.
func TestSameDecisionsAsMemory(t *testing.T) {
	c := redistest.Start(t).Client(t)
	opts := []lua.Option{lua.WithRefusalCache(0)}
	sameDecisions(t, walkOptions{}, []*redis.Client{c}, []namedLimiter{
		{"pool", newLimiter(t, c, opts...)},
		{"coalesced", newLimiter(t, c, append(opts, lua.WithCoalescing(64))...)},
		{"one-server", newLimiter(t, c, append(opts, lua.WithOneServer())...)},
		// Without refunds the refusal cache is exact: it refuses only what Redis would.
		{"one-server-refusal-cache", newLimiter(t, c, lua.WithOneServer())},
		// The demo's options.
		{"demo", newLimiter(t, c, lua.WithOneServer(), lua.WithCoalescing(256))},
	})
}

// TestSameOutcomesAsMemory is TestSameDecisionsAsMemory through AllowEach: every
// check's outcome (admitted or not, exceeded or not, remaining units, a wait or none)
// is the in-process limiter's, with and without coalescing and the refusal cache. A
// third of the decisions repeat one of the last few, so that refusals are repeated
// from the cache: the limiter with a cache must make fewer script calls.
func TestSameOutcomesAsMemory(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	calls := map[string]*scriptCalls{}
	client := func(name string) *redis.Client {
		cl := srv.Client(t)
		calls[name] = &scriptCalls{}
		cl.AddHook(calls[name])
		return cl
	}
	opts := []lua.Option{lua.WithRefusalCache(0)}
	sameDecisions(t, walkOptions{each: true}, []*redis.Client{c}, []namedLimiter{
		{"pool", newLimiter(t, client("pool"), opts...)},
		{"coalesced", newLimiter(t, client("coalesced"), append(opts, lua.WithCoalescing(64))...)},
		{"one-server", newLimiter(t, client("one-server"), append(opts, lua.WithOneServer())...)},
		{"one-server-refusal-cache", newLimiter(t, client("one-server-refusal-cache"), lua.WithOneServer())},
		{"demo", newLimiter(t, client("demo"), lua.WithOneServer(), lua.WithCoalescing(256))},
	})
	for name, n := range calls {
		t.Logf("%s: %d script calls", name, n.n.Load())
	}
	if none, cached := calls["one-server"].n.Load(), calls["one-server-refusal-cache"].n.Load(); cached > none-100 {
		t.Errorf("with the refusal cache %d script calls, without %d: want at least 100 refusals repeated from the cache", cached, none)
	}
}

// scriptCalls counts the EVALSHA and EVAL commands a client sends.
type scriptCalls struct{ n atomic.Int64 }

func (*scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "evalsha" || name == "eval" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestSameSettlesAsMemory is the walk of TestSameDecisionsAsMemory (subtest decisions)
// and of TestSameOutcomesAsMemory (outcomes) with settles and leases between the
// decisions: a third of the decisions are reservations, which are then settled (every
// check at 0, below, at or above its reservation, or all cancelled) or renewed in random
// order, and two in-flight rules join the time rules: one whose leases outlive the walk
// and one whose leases expire while it runs (see shortLease). Every settle and renewal
// result is Memory's, and so is every decision after them, but for the differences
// sameDecisions documents.
func TestSameSettlesAsMemory(t *testing.T) {
	srv := redistest.Start(t)
	for _, each := range []bool{false, true} {
		t.Run(map[bool]string{false: "decisions", true: "outcomes"}[each], func(t *testing.T) {
			t.Parallel() // each limiter has keys of its own; the walks mostly wait for leases to expire
			c := srv.Client(t)
			opts := []lua.Option{lua.WithRefusalCache(0)}
			sameDecisions(t, walkOptions{each: each, settles: true}, []*redis.Client{c}, []namedLimiter{
				{"pool", newLimiter(t, c, opts...)},
				{"coalesced", newLimiter(t, c, append(opts, lua.WithCoalescing(64))...)},
				{"one-server", newLimiter(t, c, append(opts, lua.WithOneServer())...)},
				{"one-server-refusal-cache", newLimiter(t, c, lua.WithOneServer())},
				{"demo", newLimiter(t, c, lua.WithOneServer(), lua.WithCoalescing(256))},
			})
		})
	}
}

// TestSameDecisionsAsMemoryOnCalendars is the walk of TestSameDecisionsAsMemory
// (subtest decisions) and of TestSameOutcomesAsMemory (outcomes) with Calendar rules
// among its rules: hours and days of UTC, America/New_York and Asia/Kathmandu (whose
// hours begin at UTC :15), at costs up to their limits, in decisions with the fixed
// windows, rolling windows and token buckets. A calendar period is anchored to absolute
// time, and Redis's is the server's clock: Memory's clock is set to the server's before
// each decision, so that both decide in the same periods (see walkOptions.calendar), and
// every ResetAfter and RetryAfter is compared to within calendarWaits.
func TestSameDecisionsAsMemoryOnCalendars(t *testing.T) {
	for _, each := range []bool{false, true} {
		t.Run(map[bool]string{false: "decisions", true: "outcomes"}[each], func(t *testing.T) {
			t.Parallel() // a server each, so that each walk counts its own refunds
			c := redistest.Start(t).Client(t)
			opts := []lua.Option{lua.WithRefusalCache(0)}
			sameDecisions(t, walkOptions{each: each, calendar: true, waits: calendarWaits}, []*redis.Client{c}, []namedLimiter{
				{"pool", newLimiter(t, c, opts...)},
				{"coalesced", newLimiter(t, c, append(opts, lua.WithCoalescing(64))...)},
				{"one-server", newLimiter(t, c, append(opts, lua.WithOneServer())...)},
				// The refusal cache keeps a calendar refusal until the period's end.
				{"one-server-refusal-cache", newLimiter(t, c, lua.WithOneServer())},
				{"demo", newLimiter(t, c, lua.WithOneServer(), lua.WithCoalescing(256))},
			})
		})
	}
}

// calendarMargin is how near the start or end of a Calendar check's period, on the
// server's clock, a decision of the calendar walk is skipped: near the end, the server
// might decide it in the next period, after Memory decided in this one; near the start,
// a refusal of the last period might still be in the refusal cache, which keeps it
// until its RetryAfter has passed since the reply arrived.
const calendarMargin = 2 * time.Second

// calendarWaits is how far a ResetAfter or RetryAfter of the calendar walk may be from
// Memory's: the time between reading the server's clock and the last limiter's script
// call, twice (a fixed window's end is set by the first spend, a token bucket's level by
// the last), on a loaded machine. A day of another zone ends hours away, and an hour of
// Asia/Kathmandu 15 minutes away from the others'.
const calendarWaits = time.Second

// calendarRules are the calendar walk's Calendar rules: an hour and a day of UTC (the
// zero Location), America/New_York and Asia/Kathmandu, each with a limit of its own.
func calendarRules(t *testing.T) []ratebudget.Rule {
	t.Helper()
	var rules []ratebudget.Rule
	limit := int64(4)
	for _, zone := range []string{"UTC", "America/New_York", "Asia/Kathmandu"} {
		var loc *time.Location
		if zone != "UTC" {
			var err error
			if loc, err = time.LoadLocation(zone); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []ratebudget.Period{ratebudget.Hour, ratebudget.Day} {
			name := fmt.Sprintf("calendar-%s-%s", p, strings.ReplaceAll(zone, "/", ".")) // names take no '/'
			rules = append(rules, ratebudget.Rule{Name: name, Algorithm: ratebudget.Calendar, Limit: limit, Period: p, Location: loc})
			limit++
		}
	}
	return rules
}

// walkOptions selects what sameDecisions does besides deciding.
type walkOptions struct {
	// each decides through AllowEach (and Reserve with outcomes) and compares every
	// check's outcome, not only the decision; a third of the decisions repeat one of the
	// last eight.
	each bool
	// settles reserves, settles and renews between the decisions, with in-flight rules;
	// the limiters must implement limitertest.Settler and live on servers[0].
	settles bool
	// waits, when not zero, is how far each check's ResetAfter and RetryAfter (with
	// each), and the reported rule's, may be from Memory's: how far Memory's clock may
	// be from the server's.
	waits time.Duration
	// calendar adds the Calendar rules of calendarRules to the walk's rules, at costs
	// from 1 to their limits, and sets Memory's clock to the server's (TIME) before each
	// decision; a decision with a Calendar check whose period began or ends within
	// calendarMargin of the server's clock is skipped. Not with settles, whose clock is
	// the walk's.
	calendar bool
}

// shortLease is the TTL of the walk's short in-flight rule. Its leases are taken only in
// hot phases of at most 40 decisions and shortLease/4 of the server's time; after each,
// the walk waits until the server's clock has passed the phase's end by shortLease, so
// that every lease of the phase has expired on the server, then advances Memory's clock
// by as much as the server's moved since the phase began, so that they have expired in
// Memory too. Within a phase, a lease would expire on the server first only if one
// decision stalled for 3/4 of shortLease.
const shortLease = time.Second

// sameDecisions runs 1,500 random decisions on a memory.Limiter whose clock is driven
// by the walk (stopped, but for the steps of walkOptions.settles; the server's with
// walkOptions.calendar) and on each of limiters, whose keys live on servers, and fails
// on the first answer that differs: admitted or not, exceeded or not, and the remaining
// units whenever both report the same rule. (Which rule is reported may differ: among equal candidates it depends on
// waits, which move with Redis's clock and not with the stopped one.) Windows are hours
// long, so the seconds the walk takes on the server's clock move no budget: a token
// bucket refills less than one unit in that time. With walkOptions.settles, the walk also
// reserves, settles and renews (see TestSameSettlesAsMemory). Where the two limiters
// legitimately differ, the walk compares what must agree:
//   - A token bucket in debt (settled above its reservation) reports its level in whole
//     units, truncated toward zero, and the server's bucket has refilled by the
//     milliseconds the walk took on its clock (less than a unit), Memory's by the steps
//     of its own: a negative Remaining may differ by one unit.
//   - The lua limiter gives a rolling-window event back only while it is the budget's
//     newest (an overcount, docs/SETTLING.md, "How exact it is"); Memory gives back any event still in
//     the window. Before each settle below the reservation the walk reads each limiter's
//     newest event: all must agree, and where the event is no longer the newest, Memory
//     is settled at the reserved cost for that check.
func sameDecisions(t *testing.T, o walkOptions, servers []*redis.Client, limiters []namedLimiter) {
	t.Helper()
	refunds := countRefunds(t, servers)
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	if o.calendar {
		if o.settles {
			t.Fatal("a calendar walk does not settle: its clock is the server's")
		}
		clock = limitertest.NewFakeClock(serverNow(t, servers[0]))
	}
	mem, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	// Windows are distinct whole hours (and token buckets refill one unit every 94 to 156
	// minutes), so that waits of different rules are minutes apart.
	rule := func(alg ratebudget.Algorithm, hours time.Duration, limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: fmt.Sprintf("%s-%dh", algname.Of(alg), hours), Algorithm: alg, Limit: limit, Window: hours * time.Hour}
	}
	burst := rule(ratebudget.TokenBucket, 17, 3) // refills 1 unit per 340 minutes, holds 6
	burst.Burst = 6
	rules := []ratebudget.Rule{
		rule(ratebudget.FixedWindow, 1, 5), rule(ratebudget.FixedWindow, 3, 8), rule(ratebudget.FixedWindow, 5, 3),
		rule(ratebudget.RollingWindow, 2, 6), rule(ratebudget.RollingWindow, 4, 4), rule(ratebudget.RollingWindow, 6, 9),
		rule(ratebudget.TokenBucket, 7, 4), rule(ratebudget.TokenBucket, 11, 7), rule(ratebudget.TokenBucket, 13, 5),
		burst,
		rule(ratebudget.FixedWindow, 8, 2), // a cost of 3 exceeds it: Exceeded
	}
	if o.calendar {
		rules = append(rules, calendarRules(t)...)
	}
	hotRules := rules
	if o.settles {
		rules = append(rules, rule(ratebudget.InFlight, 9, 3)) // leases outlive the walk
		short := ratebudget.Rule{Name: "inflight-short", Algorithm: ratebudget.InFlight, Limit: 2, Window: shortLease}
		hotRules = append(rules[:len(rules):len(rules)], short)
	}
	w := &diffWalk{t: t, o: o, srv: servers[0], clock: clock, mem: mem, limiters: limiters,
		rng: rand.New(rand.NewPCG(3, 4)), cold: 260, began: time.Now()}
	scopes := []string{"", "/reports"}
	rng := w.rng
	var recent [][]ratebudget.Check
	for i := 0; i < 1500; i++ {
		n := 1 + rng.IntN(4)
		checks := make([]ratebudget.Check, 0, n)
		seen := map[[3]int]bool{}
		if o.each && len(recent) > 0 && rng.IntN(3) == 0 {
			checks = recent[rng.IntN(len(recent))] // a repeat: not extended below
			if !w.hot && hasRule(checks, "inflight-short") {
				checks = checks[:0:0] // its leases are taken in hot phases only
			}
			n = max(len(checks), 1)
		}
		pool := rules
		if w.hot {
			pool = hotRules
		}
		for len(checks) < n {
			r, id, sc := rng.IntN(len(pool)), rng.IntN(30), rng.IntN(len(scopes))
			if w.hot && rng.IntN(4) == 0 {
				r = len(pool) - 1 // the short in-flight rule, a quarter of the checks
			}
			if seen[[3]int{r, id, sc}] {
				continue
			}
			seen[[3]int{r, id, sc}] = true
			c := ratebudget.Check{Rule: pool[r], Identity: fmt.Sprintf("id-%d", id), Scope: scopes[sc], Cost: 1 + rng.Int64N(3)}
			switch c.Rule.Algorithm {
			case ratebudget.InFlight:
				c.Cost = 1
			case ratebudget.Calendar:
				c.Cost = 1 + rng.Int64N(c.Rule.Limit)
			}
			checks = append(checks, c)
		}
		if o.each {
			recent = append(recent, checks)
			if len(recent) > 8 {
				recent = recent[1:]
			}
		}
		if !o.settles {
			if o.calendar && !w.serverClock(checks) {
				i-- // skipped: another is drawn in its place
				continue
			}
			w.decide(i, checks, false)
			continue
		}
		if res := w.decide(i, checks, rng.IntN(3) == 0); res != nil {
			w.pending = append(w.pending, res)
		}
		if len(w.pending) > 24 || len(w.pending) > 0 && rng.IntN(3) == 0 {
			// A short lease is kept through the hot phase, to be lost after it.
			if k := rng.IntN(len(w.pending)); !w.hot || !hasRule(w.pending[k].checks, "inflight-short") || len(w.pending) > 24 {
				w.settle(i, w.take(k))
			}
		}
		if len(w.pending) > 0 && rng.IntN(6) == 0 {
			w.renew(i, w.pending[rng.IntN(len(w.pending))])
		}
		w.tick()
	}
	for len(w.pending) > 0 {
		w.settle(1500, w.take(0))
	}
	fixed, rolling := refunds.since(t)
	t.Logf("%d admitted, %d refused, %d exceeded; remaining compared %d times; %d outcomes of checks that fit in refused decisions; "+
		"refunds: %d to fixed windows, %d to rolling windows",
		w.admitted, w.refused, w.exceeded, w.compared, w.unspent, fixed, rolling)
	if w.admitted < 300 || w.refused < 300 || w.exceeded < 50 || w.compared < 900*len(limiters) {
		t.Fatalf("want at least 300 admitted, 300 refused, 50 exceeded and remaining compared %d times", 900*len(limiters))
	}
	if o.each && w.unspent < 200 {
		t.Fatal("want at least 200 outcomes compared of checks that fit in refused decisions")
	}
	if o.calendar {
		cal := &w.cal
		t.Logf("calendar: %d decisions skipped near a period's start or end; %d decisions with a Calendar check, %d of them with "+
			"a fixed window or token bucket; %d refused by a Calendar rule; its remaining compared %d times; "+
			"%d Calendar outcomes compared", cal.skipped, cal.decisions, cal.mixed, cal.refused, cal.compared, cal.outcomes)
		// About half the counts of a walk that skips nothing (900-930 decisions, 580-640
		// mixed, 370-400 refused, 580-590 and 1,330 per limiter compared).
		if cal.decisions < 450 || cal.mixed < 290 || cal.refused < 180 || cal.compared < 280*len(limiters) ||
			o.each && cal.outcomes < 650*len(limiters) {
			t.Fatalf("want at least 450 decisions with a Calendar check, 290 with a fixed window or token bucket too; "+
				"180 refused by a Calendar rule; its remaining compared %d times; with outcomes, %d Calendar outcomes compared",
				280*len(limiters), 650*len(limiters))
		}
	}
	if !o.settles {
		// (With settles, give-backs send the same commands: the count says nothing.)
		if fixed < 20 || rolling < 20 {
			t.Fatal("want at least 20 refunds of each kind")
		}
		return
	}
	st := &w.st
	t.Logf("%d reservations admitted; checks settled: %d at 0, %d below, %d at, %d above the reservation, %d leases released; "+
		"rolling-window give-backs: %d applied, %d skipped (not the newest); %d renewals, %d with a lease lost; "+
		"%d in-flight refusals; %d hot phases (longest %v); %d remaining within one unit of a bucket in debt",
		st.reserved, st.cancels, st.below, st.equal, st.above, st.released, st.givenBack, st.skipped,
		st.renewed, st.lost, st.leaseRefused, st.phases, st.longest, st.debtSlack)
	// The walk's choices are seeded, but where hot phases end follows the server's clock,
	// so the counts move with the machine's load: on a quiet machine 215-236
	// reservations, 57-72 settled at the reservation; 180 and 41 on a loaded one. The
	// floors are about half the quiet counts.
	if st.reserved < 100 || st.cancels < 50 || st.below < 25 || st.equal < 25 || st.above < 30 || st.released < 30 ||
		st.givenBack < 10 || st.renewed < 50 || st.lost < 3 || st.leaseRefused < 20 || st.phases < 3 {
		t.Fatal("want at least 100 reservations; 50 checks settled at 0, 25 below, 25 at and 30 above the reservation; " +
			"30 leases released; 10 rolling-window give-backs; 50 renewals, 3 with a lease lost; 20 in-flight refusals; 3 hot phases")
	}
}

func hasRule(checks []ratebudget.Check, name string) bool {
	for _, c := range checks {
		if c.Rule.Name == name {
			return true
		}
	}
	return false
}

// diffWalk is the state of sameDecisions: the limiters, the reservations not settled
// yet, the hot phase and what the walk covered.
type diffWalk struct {
	t        *testing.T
	o        walkOptions
	srv      *redis.Client // holds every limiter's keys (with settles): its clock, its events
	clock    *limitertest.FakeClock
	mem      *memory.Limiter
	limiters []namedLimiter
	rng      *rand.Rand
	pending  []*reservation
	// hot is set in a hot phase (see shortLease), which began at hotStart on the
	// server's clock and has hotLeft decisions to go; else cold decisions are left
	// before the next.
	hot           bool
	hotStart      time.Time
	hotLeft, cold int
	admitted      int
	refused       int
	exceeded      int
	compared      int
	// unspent counts the outcomes compared of checks that fit in refused decisions (per
	// limiter), whose budgets no refusal spent from.
	unspent int
	// began is when the walk began: how far the server's clock may have moved from
	// Memory's since.
	began time.Time
	st    settleStats
	cal   calendarStats
}

// calendarStats is what a calendar walk covered.
type calendarStats struct {
	// skipped counts the decisions skipped near a period's start or end; decisions those with a
	// Calendar check (not skipped), mixed those with a fixed window or token bucket
	// check too.
	skipped, decisions, mixed int
	// refused counts the decisions refused by a Calendar rule, compared the reported
	// Calendar rules' remaining units compared, outcomes the Calendar checks' outcomes
	// compared (per limiter).
	refused, compared, outcomes int
}

// serverClock sets Memory's clock to the server's before decision checks of a calendar
// walk and reports whether to make it: not when a Calendar check's period began or ends
// within calendarMargin of the server's clock.
func (w *diffWalk) serverClock(checks []ratebudget.Check) bool {
	now := w.serverNow()
	for _, c := range checks {
		if c.Rule.Algorithm != ratebudget.Calendar {
			continue
		}
		start, end := timerule.PeriodOf(now, c.Rule.Period, c.Rule.Location, c.Rule.WeekStart)
		if now.Sub(start) < calendarMargin || end.Sub(now) < calendarMargin {
			w.cal.skipped++
			return false
		}
	}
	if d := now.Sub(w.clock.Now()); d > 0 {
		w.clock.Advance(d)
	}
	if hasAlgorithm(checks, ratebudget.Calendar) {
		w.cal.decisions++
		if hasAlgorithm(checks, ratebudget.FixedWindow) || hasAlgorithm(checks, ratebudget.TokenBucket) {
			w.cal.mixed++
		}
	}
	return true
}

// settleStats is what the settles of a walk covered.
type settleStats struct {
	reserved, cancels, below, equal, above, released int
	givenBack, skipped, renewed, lost, leaseRefused  int
	phases, debtSlack                                int
	longest                                          time.Duration
}

// reservation is a decision reserved on Memory and on every limiter, with each one's
// tickets.
type reservation struct {
	checks []ratebudget.Check
	mem    []ratebudget.Ticket
	lua    [][]ratebudget.Ticket // per limiter
}

// take removes the pending reservation k and returns it.
func (w *diffWalk) take(k int) *reservation {
	p := w.pending[k]
	w.pending = append(w.pending[:k], w.pending[k+1:]...)
	return p
}

// decide makes decision i of checks on Memory and on every limiter, reserving it when
// reserve is set, and fails on the first answer that differs. It returns the
// reservation, if admitted.
func (w *diffWalk) decide(i int, checks []ratebudget.Check, reserve bool) *reservation {
	t := w.t
	t.Helper()
	ctx := context.Background()
	var res *reservation
	wantOuts := make([]ratebudget.Outcome, len(checks))
	var want ratebudget.Decision
	var err error
	switch {
	case reserve:
		res = &reservation{checks: checks, mem: make([]ratebudget.Ticket, len(checks)), lua: make([][]ratebudget.Ticket, len(w.limiters))}
		want, err = w.mem.Reserve(ctx, checks, res.mem, w.outs(wantOuts))
	case w.o.each:
		want, err = w.mem.AllowEach(ctx, checks, wantOuts)
	default:
		want, err = w.mem.Allow(ctx, checks)
	}
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case want.Allowed:
		w.admitted++
		if reserve {
			w.st.reserved++
		}
	case want.Exceeded:
		w.exceeded++
	default:
		w.refused++
		if want.Index < len(checks) && checks[want.Index].Rule.Algorithm == ratebudget.InFlight {
			w.st.leaseRefused++
		}
		if want.Index < len(checks) && checks[want.Index].Rule.Algorithm == ratebudget.Calendar {
			w.cal.refused++
		}
	}
	for k, nl := range w.limiters {
		var got ratebudget.Decision
		outs := make([]ratebudget.Outcome, len(checks))
		switch {
		case reserve:
			res.lua[k] = make([]ratebudget.Ticket, len(checks))
			got, err = nl.l.(limitertest.Settler).Reserve(ctx, checks, res.lua[k], w.outs(outs))
		case w.o.each:
			got, err = nl.l.(limitertest.Reporter).AllowEach(ctx, checks, outs)
		default:
			got, err = nl.l.Allow(ctx, checks)
		}
		if err != nil {
			t.Fatalf("decision %d, %s: %v", i, nl.name, err)
		}
		for j := range outs {
			if !w.o.each {
				break
			}
			g, m := outs[j], wantOuts[j]
			// Without waits given, resets are compared as far as the server's clock may
			// have moved from Memory's since the walk began: zero (an untouched budget,
			// which a refused decision, too, must report for a check that fits) exactly.
			resets := w.o.waits
			if resets == 0 {
				resets = time.Since(w.began) + time.Second
			}
			if g.Allowed != m.Allowed || g.Exceeded != m.Exceeded || !w.sameRemaining(g.Remaining, m.Remaining, checks[j].Rule) ||
				(g.RetryAfter > 0) != (m.RetryAfter > 0) || (g.ResetAfter > 0) != (m.ResetAfter > 0) || !near(g.ResetAfter, m.ResetAfter, resets) ||
				w.o.waits > 0 && !near(g.RetryAfter, m.RetryAfter, w.o.waits) {
				t.Fatalf("decision %d (reserve %v) of %+v, check %d:\n%s: %+v\nmemory: %+v", i, reserve, checks, j, nl.name, g, m)
			}
			if !want.Allowed && m.Allowed {
				w.unspent++
			}
			if checks[j].Rule.Algorithm == ratebudget.Calendar {
				w.cal.outcomes++
			}
		}
		if got.Allowed != want.Allowed || got.Exceeded != want.Exceeded ||
			got.Index == want.Index && !w.sameRemaining(got.Remaining, want.Remaining, checks[want.Index].Rule) ||
			w.o.waits > 0 && got.Index == want.Index && (!near(got.ResetAfter, want.ResetAfter, w.o.waits) ||
				!near(got.RetryAfter, want.RetryAfter, w.o.waits) || (got.RetryAfter > 0) != (want.RetryAfter > 0)) {
			t.Fatalf("decision %d (reserve %v) of %+v:\n%s: %+v\nmemory: %+v", i, reserve, checks, nl.name, got, want)
		}
		if got.Index == want.Index {
			w.compared++
			if checks[want.Index].Rule.Algorithm == ratebudget.Calendar {
				w.cal.compared++
			}
		}
		if reserve {
			for j, tk := range res.lua[k] {
				if tk == (ratebudget.Ticket{}) == got.Allowed {
					t.Fatalf("decision %d, %s: reserved %+v with ticket %d %+v: want tickets set exactly on admission", i, nl.name, got, j, tk)
				}
			}
		}
	}
	if res != nil && want.Allowed {
		return res
	}
	return nil
}

// near reports whether a and b are at most d apart.
func near(a, b, d time.Duration) bool { return a-b <= d && b-a <= d }

// outs is outs when the walk compares every check's outcome, else nil.
func (w *diffWalk) outs(outs []ratebudget.Outcome) []ratebudget.Outcome {
	if w.o.each {
		return outs
	}
	return nil
}

// sameRemaining reports whether got and want, the Remaining of a check of r, agree: equal,
// or within one unit for a token bucket in debt (see sameDecisions).
func (w *diffWalk) sameRemaining(got, want int64, r ratebudget.Rule) bool {
	if got == want {
		return true
	}
	if r.Algorithm == ratebudget.TokenBucket && (got < 0 || want < 0) && got-want <= 1 && want-got <= 1 {
		w.st.debtSlack++
		return true
	}
	return false
}

// settle settles reservation p (taken before decision i) on Memory and on every limiter,
// at random costs, and fails unless every settle succeeds. Half the time the checks that
// are not in-flight are then decided again at cost 1, so that their budgets are
// compared at once.
func (w *diffWalk) settle(i int, p *reservation) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	rng := w.rng
	var costs []int64
	if rng.IntN(8) > 0 { // else cancelled
		costs = make([]int64, len(p.checks))
		for j, c := range p.checks {
			switch rng.IntN(5) {
			case 0:
			case 1, 2:
				costs[j] = rng.Int64N(c.Cost) // below (0 for a cost of 1)
			case 3:
				costs[j] = c.Cost
			default:
				costs[j] = c.Cost + 1 + rng.Int64N(5)
				if rng.IntN(10) == 0 {
					costs[j] += 1000 // past every debt bound
				}
			}
		}
	}
	memCosts, copied := costs, false
	for j, c := range p.checks {
		actual := int64(0)
		if costs != nil {
			actual = costs[j]
		}
		switch {
		case c.Rule.Algorithm == ratebudget.InFlight:
			w.st.released++
			continue
		case actual == 0:
			w.st.cancels++
		case actual < c.Cost:
			w.st.below++
		case actual == c.Cost:
			w.st.equal++
		default:
			w.st.above++
		}
		if c.Rule.Algorithm != ratebudget.RollingWindow || actual >= c.Cost {
			continue
		}
		if w.rollingNewest(i, p, j) {
			w.st.givenBack++
			continue
		}
		// The lua limiters skip this give-back: so does Memory, for the comparison.
		w.st.skipped++
		if !copied {
			memCosts, copied = make([]int64, len(p.checks)), true
			copy(memCosts, costs)
		}
		memCosts[j] = c.Cost
	}
	if err := w.mem.Settle(ctx, p.checks, p.mem, memCosts); err != nil {
		t.Fatalf("before decision %d: Memory's settle of %+v at %v: %v", i, p.checks, memCosts, err)
	}
	for k, nl := range w.limiters {
		if err := nl.l.(limitertest.Settler).Settle(ctx, p.checks, p.lua[k], costs); err != nil {
			t.Fatalf("before decision %d, %s: settle of %+v at %v: %v", i, nl.name, p.checks, costs, err)
		}
	}
	if rng.IntN(2) == 0 {
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
}

// rollingNewest reports whether the rolling-window event that check j of p spent is its
// budget's newest for every limiter (the lua limiter gives it back only then), and fails
// if the limiters disagree.
func (w *diffWalk) rollingNewest(i int, p *reservation, j int) bool {
	t := w.t
	t.Helper()
	var newest []bool
	for k, nl := range w.limiters {
		key := nl.l.(*lua.Limiter).Key(p.checks[j])
		zs, err := w.srv.ZRangeWithScores(context.Background(), key, -1, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		tk := p.lua[k][j]
		ok := len(zs) == 1 && int64(zs[0].Score) == tk.At &&
			strings.HasPrefix(zs[0].Member.(string), strconv.FormatInt(tk.ID, 10)+":")
		newest = append(newest, ok)
		if newest[0] != ok {
			t.Fatalf("before decision %d: the event of %+v is the newest for %s but not for %s (%v, ticket %+v)",
				i, p.checks[j], map[bool]string{true: nl.name, false: w.limiters[0].name}[ok],
				map[bool]string{false: nl.name, true: w.limiters[0].name}[ok], zs, tk)
		}
	}
	return newest[0]
}

// renew renews reservation p's leases on Memory and on every limiter and fails unless
// all report the same: nil, or ratebudget.ErrLeaseLost.
func (w *diffWalk) renew(i int, p *reservation) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	want := w.mem.Renew(ctx, p.checks, p.mem)
	if want != nil && !errors.Is(want, ratebudget.ErrLeaseLost) {
		t.Fatalf("before decision %d: Memory's renewal of %+v: %v", i, p.checks, want)
	}
	w.st.renewed++
	if want != nil {
		w.st.lost++
	}
	for k, nl := range w.limiters {
		got := nl.l.(limitertest.Settler).Renew(ctx, p.checks, p.lua[k])
		if errors.Is(got, ratebudget.ErrLeaseLost) != errors.Is(want, ratebudget.ErrLeaseLost) || got != nil && !errors.Is(got, ratebudget.ErrLeaseLost) {
			t.Fatalf("before decision %d, %s: renewal of %+v: %v; Memory's: %v", i, nl.name, p.checks, got, want)
		}
	}
}

// serverNow is the server's clock.
func (w *diffWalk) serverNow() time.Time {
	w.t.Helper()
	now, err := w.srv.Time(context.Background()).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	return now
}

// tick counts one decision of the walk's phases and ends a hot phase (see shortLease).
func (w *diffWalk) tick() {
	t := w.t
	t.Helper()
	if !w.hot {
		if w.cold--; w.cold == 0 {
			w.hot, w.hotStart, w.hotLeft = true, w.serverNow(), 40
		}
		return
	}
	w.hotLeft--
	end := w.serverNow()
	if w.hotLeft > 0 && end.Sub(w.hotStart) < shortLease/4 {
		return
	}
	w.st.phases++
	w.st.longest = max(w.st.longest, end.Sub(w.hotStart))
	// Poll the server's clock (TIME), with a deadline, until every lease the phase took
	// or renewed has expired there.
	deadline := time.Now().Add(10 * shortLease)
	now := w.serverNow()
	for ; !now.After(end.Add(shortLease + time.Millisecond)); now = w.serverNow() {
		if time.Now().After(deadline) {
			t.Fatalf("the server's clock did not pass %v within %v", end.Add(shortLease), 10*shortLease)
		}
		time.Sleep(shortLease / 50)
	}
	w.clock.Advance(now.Sub(w.hotStart))
	w.hot, w.cold = false, 260
	// Every short lease is lost now, on both sides.
	for _, p := range w.pending {
		if hasRule(p.checks, "inflight-short") {
			w.renew(-1, p)
		}
	}
}
