package lua_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// settleGroup is a decision of one identity (one slot) under every time rule: a fixed
// window reserved at 4, a token bucket at 2, a rolling window at 3 and a lease, to be
// settled at 0, 5, 8 and 1: a give-back, two extras and a release in one group.
func settleGroup(id string) ([]ratebudget.Check, []int64) {
	rule := func(name string, alg ratebudget.Algorithm, limit int64) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: limit, Window: time.Hour}
	}
	return []ratebudget.Check{
		{Rule: rule("f", ratebudget.FixedWindow, 10), Identity: id, Cost: 4},
		{Rule: rule("t", ratebudget.TokenBucket, 10), Identity: id, Cost: 2},
		{Rule: rule("r", ratebudget.RollingWindow, 10), Identity: id, Cost: 3},
		{Rule: rule("l", ratebudget.InFlight, 1), Identity: id, Cost: 1},
	}, []int64{0, 5, 8, 1}
}

// expectSettled fails unless checks (of settleGroup) hold what their settle left: the
// fixed window nothing, the token bucket 5 tokens spent, the rolling window 8 and the
// lease released.
func expectSettled(t *testing.T, l *lua.Limiter, checks []ratebudget.Check) {
	t.Helper()
	for i, cost := range []int64{10, 5, 2, 1} {
		c := checks[i]
		c.Cost = cost
		if d, err := l.Allow(context.Background(), []ratebudget.Check{c}); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s after the settle, cost %d: %+v, %v; want admitted with 0 remaining", c.Rule.Name, cost, d, err)
		}
	}
}

// TestSettleOneCallPerGroup: a settle that gives back, charges above the reservation and
// releases a lease in one slot group is one script call, with every effect applied;
// with two identities it is one call per slot, and one in all with WithOneServer.
func TestSettleOneCallPerGroup(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		ids   []string
		opts  []lua.Option
		calls int
	}{
		{"one-slot", []string{"ann"}, nil, 1},
		{"two-slots", []string{"ann", "bob"}, nil, 2},
		{"two-slots-one-server", []string{"ann", "bob"}, []lua.Option{lua.WithOneServer()}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := srv.Client(t)
			hook := countCommands(c)
			l := newLimiter(t, c, append([]lua.Option{lua.WithRefusalCache(0)}, tc.opts...)...)
			if err := l.Load(ctx); err != nil {
				t.Fatal(err)
			}
			var checks []ratebudget.Check
			var costs []int64
			for _, id := range tc.ids {
				ch, co := settleGroup(id)
				checks, costs = append(checks, ch...), append(costs, co...)
			}
			tickets := make([]ratebudget.Ticket, len(checks))
			if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
				t.Fatalf("Reserve: %+v, %v", d, err)
			}
			hook.take()
			if err := l.Settle(ctx, checks, tickets, costs); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			if got := hook.take(); got["evalsha"] != tc.calls || len(got) != 1 {
				t.Fatalf("Settle sent %v, want %d evalsha and nothing else", got, tc.calls)
			}
			for i := range tc.ids {
				expectSettled(t, l, checks[4*i:4*i+4])
			}
		})
	}
	// A group whose checks are all charged above their reservation is one call too.
	c := srv.Client(t)
	hook := countCommands(c)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	all, _ := settleGroup("cy")
	checks := all[:2] // the fixed window and the token bucket, reserved at 4 and 2
	tickets := make([]ratebudget.Ticket, len(checks))
	if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	hook.take()
	if err := l.Settle(ctx, checks, tickets, []int64{10, 5}); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if got := hook.take(); got["evalsha"]+got["eval"] != 1 || len(got) != 1 {
		t.Fatalf("Settle of extras alone sent %v, want one script call and nothing else", got)
	}
	// 10 of the fixed window's 10 spent, 5 of the bucket's 10.
	for i, want := range []struct {
		cost    int64
		allowed bool
	}{{1, false}, {5, true}} {
		c := checks[i]
		c.Cost = want.cost
		if d, err := l.Allow(ctx, []ratebudget.Check{c}); err != nil || d.Allowed != want.allowed || d.Remaining != 0 {
			t.Fatalf("%s after the settle, cost %d: %+v, %v; want allowed %v, 0 remaining", c.Rule.Name, want.cost, d, err, want.allowed)
		}
	}
}

// TestSettleErrorWritesNothing: when a check charged above its reservation finds a
// corrupt counter, the settle fails with a server error and gives nothing back to the
// other checks of its group: the extras are charged, and the state checked, before any
// give-back is written.
func TestSettleErrorWritesNothing(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	w := ratebudget.Rule{Name: "w", Limit: 10, Window: time.Hour}
	checks := []ratebudget.Check{
		{Rule: w, Identity: "ann", Cost: 4},
		{Rule: ratebudget.Rule{Name: "x", Limit: 10, Window: time.Hour}, Identity: "ann", Cost: 1},
		{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Hour}, Identity: "ann", Cost: 1},
	}
	tickets := make([]ratebudget.Ticket, len(checks))
	if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	if err := c.Set(ctx, l.Key(checks[1]), "corrupt", redis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
	err := l.Settle(ctx, checks, tickets, []int64{0, 3, 1})
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || !strings.Contains(err.Error(), "corrupt counter") {
		t.Fatalf("Settle: %v, want a server error naming the corrupt counter", err)
	}
	for i, tk := range tickets {
		if tk != (ratebudget.Ticket{}) {
			t.Fatalf("ticket %d left as %+v, want it cleared", i, tk)
		}
	}
	if v := c.Get(ctx, l.Key(checks[0])).Val(); v != "4" {
		t.Fatalf("counter %q after the failed settle, want \"4\": nothing given back", v)
	}
	if n := c.ZCard(ctx, l.Key(checks[2])).Val(); n != 1 {
		t.Fatalf("%d leases after the failed settle, want 1: none released", n)
	}
}

// TestSettleScriptArguments: settle.lua refuses, before writing anything, a check both
// given back and charged, an in-flight check charged, and a charged check whose
// arguments allow.lua would refuse (a capacity other than the limit of a fixed window).
func TestSettleScriptArguments(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	key := "{k}:f:fixed"
	if err := c.Set(ctx, key, "4", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	exp := c.PExpireTime(ctx, key).Val().Milliseconds()
	giveBack := []any{0, 10, 3600000, 10, 4, 0, 0, exp, "-"} // would delete the counter
	for _, tc := range []struct {
		name string
		keys []string
		args []any
		want string
	}{
		{"given back and charged", []string{key}, []any{0, 10, 3600000, 10, 1, 1, 0, exp, "-"}, "bad argument for check 1"},
		{"lease charged", []string{key, "{k}:l:inflight"}, append(giveBack[:9:9], 3, 1, 3600000, 1, 0, 1, 0, 1, "00ff"), "bad argument for check 2"},
		{"charged with a capacity", []string{key, "{k}:g:fixed"}, append(giveBack[:9:9], 0, 10, 3600000, 11, 0, 1, 0, 0, "-"), "capacity differs from limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Eval(ctx, lua.SettleSource, tc.keys, append([]any{"settle"}, tc.args...)...).Err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("settle.lua: %v, want an error reply naming %q", err, tc.want)
			}
			if v := c.Get(ctx, key).Val(); v != "4" {
				t.Fatalf("counter %q, want \"4\": nothing written", v)
			}
			if n := c.Exists(ctx, "{k}:g:fixed", "{k}:l:inflight").Val(); n != 0 {
				t.Fatalf("%d keys created, want none", n)
			}
		})
	}
	// The same give-back alone is applied, and replied 1.
	v, err := c.Eval(ctx, lua.SettleSource, []string{key}, append([]any{"settle"}, giveBack...)...).Result()
	if err != nil || len(v.([]any)) != 1 || v.([]any)[0] != int64(1) {
		t.Fatalf("settle.lua: %v, %v; want [1]", v, err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("the counter given back to 0 was not deleted")
	}
}

// TestRollingExtraCutToNothingWritesNoEvent: a rolling window already counting twice its
// limit takes no more debt, and a settle whose extra is cut to nothing leaves the log as
// it was: no zero-cost event moves the window's end or the key's TTL.
func TestRollingExtraCutToNothingWritesNoEvent(t *testing.T) {
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	ctx := context.Background()
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 2, Window: time.Hour}, Identity: "debtor", Cost: 1}}
	key := l.Key(chk[0])
	var tickets [2][]ratebudget.Ticket
	for i := range tickets {
		tickets[i] = make([]ratebudget.Ticket, 1)
		if d, err := l.Reserve(ctx, chk, tickets[i], nil); err != nil || !d.Allowed {
			t.Fatalf("reservation %d: %+v, %v", i, d, err)
		}
	}
	// The first settle's extra is cut to 2 (the window then counts 4, twice its limit).
	if err := l.Settle(ctx, chk, tickets[0], []int64{100}); err != nil {
		t.Fatal(err)
	}
	before, err := c.ZRange(ctx, key, 0, -1).Result()
	if err != nil || len(before) == 0 {
		t.Fatalf("log after the first settle: %v, %v", before, err)
	}
	// The second's extra is cut to nothing.
	if err := l.Settle(ctx, chk, tickets[1], []int64{100}); err != nil {
		t.Fatal(err)
	}
	after, err := c.ZRange(ctx, key, 0, -1).Result()
	if err != nil || strings.Join(after, " ") != strings.Join(before, " ") {
		t.Fatalf("log after a settle whose extra was cut to nothing: %v, %v; want it unchanged: %v", after, err, before)
	}
	if d, err := l.Allow(ctx, chk); err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the settles: %+v, %v; want refused with nothing remaining", d, err)
	}
}

// TestReserveFailureZeroesTickets: a reservation that fails, before anything is sent (a
// context already done) or on the server (an error reply), leaves zero tickets, as a
// refusal does, so that tickets reused from an earlier decision are never settled again.
func TestReserveFailureZeroesTickets(t *testing.T) {
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c, lua.WithOneServer())
	checks, _ := settleGroup("xena")
	stale := func() []ratebudget.Ticket {
		tk := make([]ratebudget.Ticket, len(checks))
		for i := range tk {
			tk[i] = ratebudget.Ticket{At: 7, ID: 7}
		}
		return tk
	}
	expectZero := func(what string, tickets []ratebudget.Ticket, err error) {
		t.Helper()
		var se *ratebudget.StoreError
		if !errors.As(err, &se) {
			t.Fatalf("%s: Reserve = %v, want a store error", what, err)
		}
		for i, tk := range tickets {
			if tk != (ratebudget.Ticket{}) {
				t.Fatalf("%s: Reserve failed (%v) and left ticket %d as %+v, want it zero", what, err, i, tk)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tickets := stale()
	_, err := l.Reserve(ctx, checks, tickets, nil)
	expectZero("canceled context", tickets, err)

	// A corrupt counter: allow.lua's error reply, before any write.
	if err := c.Set(context.Background(), l.Key(checks[0]), "x", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	tickets = stale()
	_, err = l.Reserve(context.Background(), checks, tickets, nil)
	expectZero("error reply", tickets, err)
}

// TestSettleEndedContextIsCertain: a worker that settles or renews with a context that
// has already ended (canceled at shutdown, or past its deadline) sends nothing, and is
// told so: a certain store error, as Allow and Reserve report it, not an uncertain one
// that says the settle may have run. The reservation and the lease stay as they were.
func TestSettleEndedContextIsCertain(t *testing.T) {
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for name, ctx := range map[string]context.Context{"canceled": canceled, "expired": expired} {
		t.Run(name, func(t *testing.T) {
			checks, costs := settleGroup("yuri-" + name)
			tickets := make([]ratebudget.Ticket, len(checks))
			if d, err := l.Reserve(context.Background(), checks, tickets, nil); err != nil || !d.Allowed {
				t.Fatalf("Reserve: %+v, %v", d, err)
			}
			certainErr := func(what string, err error) {
				t.Helper()
				var se *ratebudget.StoreError
				if !errors.As(err, &se) || se.Uncertain {
					t.Fatalf("%s with an ended context: %v, want a certain *StoreError", what, err)
				}
			}
			certainErr("Renew", l.Renew(ctx, checks, tickets))
			certainErr("Settle", l.Settle(ctx, checks, tickets, costs))
			// Nothing was settled: the fixed window still counts its reservation of 4,
			// and the lease is still held.
			probe := checks[0]
			probe.Cost = probe.Rule.Limit + 1 // Exceeded: spends nothing
			if d, err := l.Allow(context.Background(), []ratebudget.Check{probe}); err != nil || d.Remaining != 6 {
				t.Fatalf("fixed window after the failed settle: %+v, %v; want 6 remaining", d, err)
			}
			if d, err := l.Allow(context.Background(), checks[3:]); err != nil || d.Allowed {
				t.Fatalf("lease after the failed settle: %+v, %v; want it still held", d, err)
			}
		})
	}
}
