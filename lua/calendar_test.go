package lua_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// serverNow reads the server's clock.
func serverNow(t *testing.T, c *redis.Client) time.Time {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// midZone is a fixed zone in which at reads half way through its hour or day (period),
// so that a test of a few seconds stays in one period.
func midZone(at time.Time, p ratebudget.Period) *time.Location {
	unit := time.Hour
	if p == ratebudget.Day {
		unit = 24 * time.Hour
	}
	into := at.Sub(at.Truncate(unit)) // into UTC's period
	off := (unit/2 - into) / time.Second
	return time.FixedZone("mid", int(off))
}

// calendarRun decides one check on l and returns the decision and the bounds of the
// server's clock around the call.
func calendarRun(t *testing.T, l *lua.Limiter, c *redis.Client, ch ratebudget.Check) (d ratebudget.Decision, before, after time.Time) {
	t.Helper()
	before = serverNow(t, c)
	d, err := l.Allow(context.Background(), []ratebudget.Check{ch})
	if err != nil {
		t.Fatal(err)
	}
	after = serverNow(t, c)
	return d, before, after
}

// within asserts that wait, measured on the server between before and after, is the
// time to end: end-after <= wait <= end-before, in whole ms.
func within(t *testing.T, what string, wait time.Duration, end, before, after time.Time) {
	t.Helper()
	lo, hi := end.Sub(after).Truncate(time.Millisecond)-time.Millisecond, end.Sub(before)+time.Millisecond
	if wait < lo || wait > hi {
		t.Fatalf("%s = %v, want the time to the period's end %v: in [%v, %v]", what, wait, end.UTC(), lo, hi)
	}
}

// TestCalendarRedis: a Calendar rule on Redis counts in the period of the server's clock:
// admitted up to Limit with Reset at the period's end, then refused with Retry-After to
// the period's end; a refusal writes nothing; the key expires exactly at the period's
// end; and each decision is one script call.
func TestCalendarRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	control := srv.Client(t)
	hook := countCommands(c)
	l := newLimiter(t, c)
	start := serverNow(t, control)
	loc := midZone(start, ratebudget.Day)
	y, m, dd := start.In(loc).Date()
	end := time.Date(y, m, dd+1, 0, 0, 0, 0, loc)
	r := ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: 3, Period: ratebudget.Day, Location: loc}
	ch := ratebudget.Check{Rule: r, Identity: "acct", Cost: 1}
	key := l.Key(ch)
	calendarRun(t, l, control, ratebudget.Check{Rule: r, Identity: "warm-up", Cost: 1}) // loads the script
	hook.take()
	for i := int64(1); i <= 3; i++ {
		d, before, after := calendarRun(t, l, control, ch)
		if !d.Allowed || d.Remaining != 3-i || d.Rule != "daily" {
			t.Fatalf("admission %d: %+v", i, d)
		}
		within(t, "ResetAfter", d.ResetAfter, end, before, after)
	}
	exp, err := control.PExpireTime(context.Background(), key).Result()
	if err != nil || exp != time.Duration(end.UnixMilli())*time.Millisecond {
		t.Fatalf("PEXPIRETIME = %v (%v), want the period's end %d ms", exp, err, end.UnixMilli())
	}
	val := control.Get(context.Background(), key).Val()
	d, before, after := calendarRun(t, l, control, ch)
	if d.Allowed || d.Remaining != 0 {
		t.Fatalf("refusal: %+v", d)
	}
	within(t, "RetryAfter", d.RetryAfter, end, before, after)
	within(t, "ResetAfter", d.ResetAfter, end, before, after)
	if v := control.Get(context.Background(), key).Val(); v != val {
		t.Fatalf("a refusal wrote the key: %q, was %q", v, val)
	}
	if exp := control.PExpireTime(context.Background(), key).Val(); exp != time.Duration(end.UnixMilli())*time.Millisecond {
		t.Fatalf("PEXPIRETIME after a refusal = %v, want the period's end %d ms", exp, end.UnixMilli())
	}
	if n := hook.take(); n["evalsha"] != 4 || len(n) != 1 {
		t.Fatalf("commands: %v, want 4 EVALSHA", n)
	}
}

// TestCalendarCallerClockOff: the period is the server's, whatever the caller's clock
// says. A clock minutes off (within a period of the server's) costs nothing: one call.
// A clock off by more than a period is answered by the script with the server's time,
// and the decision is made, in the server's period, by a second call.
func TestCalendarCallerClockOff(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	control := srv.Client(t)
	hook := countCommands(c)
	calendarRun(t, newLimiter(t, c), control, ratebudget.Check{Rule: ratebudget.Rule{Name: "warm-up", Limit: 1, Window: time.Second}, Cost: 1})
	start := serverNow(t, control)
	loc := midZone(start, ratebudget.Hour)
	ls := start.In(loc)
	hourEnd := time.Date(ls.Year(), ls.Month(), ls.Day(), ls.Hour()+1, 0, 0, 0, loc)
	if start.In(loc).Minute() < 10 || start.In(loc).Minute() > 50 {
		t.Fatalf("the zone puts %v at minute %d, want about 30", start, start.In(loc).Minute())
	}
	for _, tc := range callerClockOffsets {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, c)
			lua.SetClock(l, func() time.Time { return time.Now().Add(tc.off) })
			r := ratebudget.Rule{Name: "hourly", Algorithm: ratebudget.Calendar, Limit: 2, Period: ratebudget.Hour, Location: loc}
			ch := ratebudget.Check{Rule: r, Identity: "acct", Cost: 1}
			for i := int64(1); i <= 3; i++ {
				hook.take()
				d, before, after := calendarRun(t, l, control, ch)
				if d.Allowed != (i <= 2) || d.Remaining != max(2-i, 0) {
					t.Fatalf("decision %d: %+v", i, d)
				}
				within(t, "ResetAfter", d.ResetAfter, hourEnd, before, after)
				if n := hook.take(); n["evalsha"] != tc.calls {
					t.Fatalf("decision %d: %v, want %d EVALSHA", i, n, tc.calls)
				}
			}
			exp := control.PExpireTime(context.Background(), l.Key(ch)).Val()
			if exp != time.Duration(hourEnd.UnixMilli())*time.Millisecond {
				t.Fatalf("PEXPIRETIME = %v, want the server's period's end %d ms", exp, hourEnd.UnixMilli())
			}
		})
	}
}

// TestCalendarSettleRedis: a Calendar reservation settled lower gives back within its
// period (the key keeping its expiry), settled higher charges into the period, and a
// cancel gives the rest back.
func TestCalendarSettleRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := newLimiter(t, c)
	ctx := context.Background()
	start := serverNow(t, c)
	loc := midZone(start, ratebudget.Day)
	y, m, dd := start.In(loc).Date()
	end := time.Date(y, m, dd+1, 0, 0, 0, 0, loc)
	r := ratebudget.Rule{Name: "daily", Algorithm: ratebudget.Calendar, Limit: 10, Period: ratebudget.Day, Location: loc}
	checks := []ratebudget.Check{{Rule: r, Identity: "acct", Cost: 4}}
	key := l.Key(checks[0])
	tickets := make([]ratebudget.Ticket, 1)
	remaining := func() int64 {
		t.Helper()
		d, err := l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "acct", Cost: 11}}) // exceeds: spends nothing
		if err != nil || !d.Exceeded {
			t.Fatalf("probe: %+v, %v", d, err)
		}
		return d.Remaining
	}
	for _, step := range []struct {
		cost, want int64
	}{{1, 9}, {7, 2}} { // 3 given back; then 3 more charged
		if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
		if tickets[0].At != end.UnixMilli()-24*3600_000 {
			t.Fatalf("ticket %+v, want At the period's start %d", tickets[0], end.UnixMilli()-24*3600_000)
		}
		if err := l.Settle(ctx, checks, tickets, []int64{step.cost}); err != nil {
			t.Fatal(err)
		}
		if got := remaining(); got != step.want {
			t.Fatalf("settled at %d: Remaining %d, want %d", step.cost, got, step.want)
		}
		if exp := c.PExpireTime(ctx, key).Val(); exp != time.Duration(end.UnixMilli())*time.Millisecond {
			t.Fatalf("PEXPIRETIME %v after the settle, want %d ms", exp, end.UnixMilli())
		}
	}
	if d, err := l.Reserve(ctx, []ratebudget.Check{{Rule: r, Identity: "acct", Cost: 2}}, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	if err := l.Settle(ctx, []ratebudget.Check{{Rule: r, Identity: "acct", Cost: 2}}, tickets, nil); err != nil {
		t.Fatal(err)
	}
	if got := remaining(); got != 2 {
		t.Fatalf("after a cancel: Remaining %d, want 2", got)
	}
}

// TestCalendarSettleCallerClockOff: a settle of a Calendar reservation whose caller's
// clock is off by more than a period is made in the server's period, as a decision is.
// A give-back works from the ticket's period start and never misses: one call. A charge
// above the reservation is decided by allow.lua's code in the periods around the
// caller's clock: one call within a period, two when the clock is off by more (the
// script names the server's time, and the charge is sent again around it), by each of
// the three routes a charge takes (settle.lua with the reservation's marker, settle.lua
// without one, allow.lua alone), and by the repairs for a settle whose call failed.
// A Renew sends nothing for a Calendar check: the lease's renewal next to it is one
// call whatever the caller's clock.
func TestCalendarSettleCallerClockOff(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	control := srv.Client(t)
	hook := countCommands(c)
	fail := &failNextSettle{sha: sha1hex(lua.SettleSource)}
	c.AddHook(fail)
	ctx := context.Background()
	warm := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "warm-up", Limit: 1, Window: time.Second}, Cost: 1}}
	wl := newLimiter(t, c)
	if _, err := wl.Reserve(ctx, warm, make([]ratebudget.Ticket, 1), nil); err != nil { // loads allow.lua
		t.Fatal(err)
	}
	if err := wl.Settle(ctx, warm, []ratebudget.Ticket{{At: 1, ID: 1}}, nil); err != nil { // and settle.lua
		t.Fatal(err)
	}
	start := serverNow(t, control)
	loc := midZone(start, ratebudget.Hour)
	ls := start.In(loc)
	hourStart := time.Date(ls.Year(), ls.Month(), ls.Day(), ls.Hour(), 0, 0, 0, loc)
	hourEnd := hourStart.Add(time.Hour)
	if ls.Minute() < 10 || ls.Minute() > 50 {
		t.Fatalf("the zone puts %v at minute %d, want about 30", start, ls.Minute())
	}
	for _, tc := range callerClockOffsets {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, c, lua.WithOneServer())
			lua.SetClock(l, func() time.Time { return time.Now().Add(tc.off) })
			r := ratebudget.Rule{Name: "hourly", Algorithm: ratebudget.Calendar, Limit: 40, Period: ratebudget.Hour, Location: loc}
			a := ratebudget.Check{Rule: r, Identity: "a", Cost: 4}
			b := ratebudget.Check{Rule: r, Identity: "b", Cost: 4}
			lease := ratebudget.Check{Rule: ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Minute}, Identity: "a", Cost: 1}
			remaining := func(ch ratebudget.Check) int64 {
				t.Helper()
				ch.Cost = r.Limit + 1 // exceeds: spends nothing
				d, err := l.Allow(ctx, []ratebudget.Check{ch})
				if err != nil || !d.Exceeded {
					t.Fatalf("probe: %+v, %v", d, err)
				}
				return d.Remaining
			}
			step := func(what string, calls int, f func() error) {
				t.Helper()
				hook.take()
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if n := hook.take(); n["evalsha"] != calls || n["eval"] != 0 {
					t.Fatalf("%s: %v, want %d EVALSHA", what, n, calls)
				}
			}
			tickets := make([]ratebudget.Ticket, 2)
			reserve := func(checks ...ratebudget.Check) {
				t.Helper()
				step("Reserve", tc.calls, func() error {
					d, err := l.Reserve(ctx, checks, tickets, nil)
					if err == nil && !d.Allowed {
						t.Fatalf("Reserve: %+v", d)
					}
					return err
				})
				if tickets[0].At != hourStart.UnixMilli() {
					t.Fatalf("ticket %+v, want At the server's period's start %d", tickets[0], hourStart.UnixMilli())
				}
			}
			settle := func(what string, calls int, checks []ratebudget.Check, costs ...int64) {
				t.Helper()
				step(what, calls, func() error { return l.Settle(ctx, checks, tickets, costs) })
			}

			// Through settle.lua with the reservation's marker: given back, then charged.
			reserve(a)
			settle("settle lower", 1, []ratebudget.Check{a}, 1)
			if got := remaining(a); got != 39 {
				t.Fatalf("settled at 1: Remaining %d, want 39", got)
			}
			reserve(a)
			settle("settle higher", tc.calls, []ratebudget.Check{a}, 7)
			if got := remaining(a); got != 32 {
				t.Fatalf("settled at 7: Remaining %d, want 32", got)
			}
			// A reservation's renewal: the lease's alone.
			reserve(a, lease)
			step("Renew", 1, func() error { return l.Renew(ctx, []ratebudget.Check{a, lease}, tickets) })
			settle("settle with the lease", 1, []ratebudget.Check{a, lease}, 4, 0)
			if got := remaining(a); got != 28 {
				t.Fatalf("after the settle with the lease: Remaining %d, want 28", got)
			}
			// Without a marker (tickets of no reservation): settle.lua, then allow.lua
			// alone for a charge only.
			reserve(a, b)
			tickets[0].Reservation, tickets[1].Reservation = 0, 0
			settle("settle of two, unmarked", tc.calls, []ratebudget.Check{a, b}, 5, 2)
			reserve(a)
			tickets[0].Reservation = 0
			settle("charge only, unmarked", tc.calls, []ratebudget.Check{a}, 6)
			if ra, rb := remaining(a), remaining(b); ra != 40-8-4-5-6 || rb != 40-2 {
				t.Fatalf("after the unmarked settles: Remaining %d and %d, want %d and %d", ra, rb, 40-8-4-5-6, 40-2)
			}
			if rs := lua.RepairCounts(l); rs != (lua.RepairStats{}) {
				t.Fatalf("repairs %+v, want none: every settle landed", rs)
			}
			// A reservation's settle whose call fails unsent is re-sent by the repairs
			// with the periods around the caller's clock: a miss, on which the marker is
			// put back, then around the server's time, applied once.
			reserve(a)
			fail.calls.Store(0)
			fail.next.Store(1)
			if err := l.Settle(ctx, []ratebudget.Check{a}, tickets, []int64{6}); err == nil {
				t.Fatal("Settle: no error, want the failed call's")
			}
			if rs := awaitRepairs(t, l); rs != (lua.RepairStats{Queued: 1, Landed: 1}) {
				t.Fatalf("repairs %+v, want one queued and landed", rs)
			}
			if n := fail.calls.Load(); n != int64(1+tc.calls) {
				t.Fatalf("%d settle.lua calls, want %d: the failed one and the repair's", n, 1+tc.calls)
			}
			if got := remaining(a); got != 40-8-4-5-6-6 {
				t.Fatalf("after the repaired settle: Remaining %d, want %d", got, 40-8-4-5-6-6)
			}
			for _, ch := range []ratebudget.Check{a, b} {
				exp := control.PExpireTime(ctx, l.Key(ch)).Val()
				if exp != time.Duration(hourEnd.UnixMilli())*time.Millisecond {
					t.Fatalf("PEXPIRETIME of %s = %v, want the server's period's end %d ms", ch.Identity, exp, hourEnd.UnixMilli())
				}
			}
		})
	}
}

// failNextSettle is a go-redis hook that fails the next settle.lua calls, as many as
// next says, without sending them, and counts every settle.lua call.
type failNextSettle struct {
	sha         string
	next, calls atomic.Int64
}

func (h *failNextSettle) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failNextSettle) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failNextSettle) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && fmt.Sprint(args[1]) == h.sha {
			h.calls.Add(1)
			if h.next.Add(-1) >= 0 {
				err := errors.New("injected: settle not sent")
				cmd.SetErr(err)
				return err
			}
			h.next.Store(0)
		}
		return next(ctx, cmd)
	}
}

// callerClockOffsets are the caller clocks of the calendar tests, off the server's by
// off: within the current hour (one script call) or beyond it (calls: the call answered
// with the server's time, then the one around it).
var callerClockOffsets = []struct {
	name  string
	off   time.Duration
	calls int
}{
	{"minutes_ahead", 7 * time.Minute, 1},
	{"minutes_behind", -7 * time.Minute, 1},
	{"hours_ahead", 3 * time.Hour, 2},
	{"hours_behind", -5 * time.Hour, 2},
	{"a_day_ahead", 25 * time.Hour, 2},
}
