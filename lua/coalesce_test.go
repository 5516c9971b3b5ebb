package lua_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// transports are the ways decisions reach Redis: all through the one go-redis client,
// on the caller's goroutine when nothing else is in flight and pipelined otherwise.
var transports = []struct {
	name string
	opts []lua.Option
}{
	{"client", nil},
}

// coalescing starts a private redis-server and a limiter on it with the transport's
// options, coalescing in groups of up to 256, no refusal cache, and opts.
func coalescing(t *testing.T, transport []lua.Option, opts ...lua.Option) (*redistest.Server, *redis.Client, *lua.Limiter) {
	t.Helper()
	srv := redistest.Start(t)
	control := srv.Client(t)
	all := append(append(slices.Clip(transport), lua.WithCoalescing(256), lua.WithRefusalCache(0)), opts...)
	return srv, control, newLimiter(t, control, all...)
}

// apiCheck is one check of identity "ann" against a fixed window of limit per minute.
func apiCheck(limit int64) []ratebudget.Check {
	return []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: limit, Window: time.Minute}, Identity: "ann", Cost: 1}}
}

// exactLimitAcrossClients sends one decision for each of 200 clients at once, each of
// the checks of checks(client), which hold a per-client check at index clientAt and a
// service-wide check whose limit is 50: exactly 50 must be admitted, and the per-client
// counters must sum to 50 (a refused request spends nothing, or is refunded).
func exactLimitAcrossClients(t *testing.T, l *lua.Limiter, rdb redis.Cmdable, checks func(client string) []ratebudget.Check, clientAt int) {
	t.Helper()
	ctx := context.Background()
	const clients, limit = 200, 50
	var admitted atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			<-start
			d, err := l.Allow(ctx, checks("client-"+strconv.Itoa(i)))
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := admitted.Load(); n != limit {
		t.Fatalf("admitted %d of %d, want exactly %d", n, clients, limit)
	}
	spent := 0
	for i := range clients {
		n, err := rdb.Get(ctx, l.Key(checks("client-" + strconv.Itoa(i))[clientAt])).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		spent += n
	}
	if spent != limit {
		t.Fatalf("per-client counters sum to %d, want %d", spent, limit)
	}
}

func TestCoalescingAndOneServerConfig(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	for _, n := range []int{-1, 1, 4097} {
		_, err := lua.New(c, lua.WithCoalescing(n))
		var ce *ratebudget.ConfigError
		if !errors.As(err, &ce) || ce.Field != "WithCoalescing" {
			t.Errorf("WithCoalescing(%d): %v, want a ConfigError naming WithCoalescing", n, err)
		}
	}
	for _, n := range []int{0, 2, 4096} {
		if _, err := lua.New(c, lua.WithCoalescing(n)); err != nil {
			t.Errorf("WithCoalescing(%d): %v", n, err)
		}
	}
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer cluster.Close()
	var ce *ratebudget.ConfigError
	if _, err := lua.New(cluster, lua.WithOneServer()); !errors.As(err, &ce) || ce.Field != "WithOneServer" {
		t.Errorf("WithOneServer on a cluster client: %v, want a ConfigError naming WithOneServer", err)
	}
}

// TestConformanceCoalesced runs the shared suite with coalescing on, over both transports.
func TestConformanceCoalesced(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			limitertest.Run(t, func(t *testing.T) limitertest.Harness {
				return limitertest.Harness{Limiter: newLimiter(t, client, append(tr.opts, lua.WithCoalescing(64))...)}
			})
		})
	}
}

// waitFor polls cond until it holds, failing the test after 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	d   ratebudget.Decision
	err error
}

// hold freezes srv and starts one decision of checks on l, which then waits for Redis
// with its signature in flight; later decisions of the same checks join a group.
func hold(t *testing.T, srv *redistest.Server, l *lua.Limiter, checks []ratebudget.Check, out chan<- result) {
	t.Helper()
	srv.Freeze(t)
	go func() {
		d, err := l.Allow(context.Background(), checks)
		out <- result{d, err}
	}()
	waitFor(t, "the first decision in flight", func() bool { _, f := lua.Waiting(l); return f == 1 })
}

// join starts n decisions of checks on l, each with its own context from ctx(i), and
// waits until want of them wait in a group.
func join(t *testing.T, l *lua.Limiter, checks []ratebudget.Check, n, want int, ctx func(i int) context.Context, out chan<- result) {
	t.Helper()
	for i := range n {
		go func() {
			d, err := l.Allow(ctx(i), checks)
			out <- result{d, err}
		}()
	}
	waitFor(t, "decisions to join a group", func() bool { m, _ := lua.Waiting(l); return m == want })
}

func background(int) context.Context { return context.Background() }

// admitConcurrently runs each decisions of chk in each of callers goroutines at once and
// returns how many were admitted.
func admitConcurrently(t *testing.T, l *lua.Limiter, chk []ratebudget.Check, callers, each int) int {
	t.Helper()
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				d, err := l.Allow(context.Background(), chk)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(admitted.Load())
}

// TestCoalescedGroup: decisions that arrive while one is in flight are sent as one
// call, admitted in full, and each gets the remaining budget it would have seen one
// after another. The server runs two script calls for 100 decisions.
func TestCoalescedGroup(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			srv, control, l := coalescing(t, tr.opts)
			chk := apiCheck(1000)
			warm := []ratebudget.Check{{Rule: chk[0].Rule, Identity: "warm", Cost: 1}}
			if _, err := l.Allow(context.Background(), warm); err != nil { // loads the script
				t.Fatal(err)
			}
			before := commandStats(t, control)
			out := make(chan result, 100)
			hold(t, srv, l, chk, out)
			join(t, l, chk, 99, 99, background, out)
			srv.Thaw(t)
			var remaining []int64
			for range 100 {
				r := <-out
				if r.err != nil || !r.d.Allowed {
					t.Fatalf("decision: %+v, %v; want admitted", r.d, r.err)
				}
				remaining = append(remaining, r.d.Remaining)
			}
			slices.Sort(remaining)
			for i, v := range remaining {
				if v != int64(900+i) {
					t.Fatalf("remaining, sorted: %v; want 900 to 999, each once", remaining)
				}
			}
			if m, f := lua.Waiting(l); m != 0 || f != 0 {
				t.Errorf("after the decisions: %d waiting, %d in flight; want none", m, f)
			}
			delta := commandStats(t, control).sub(before)
			if delta.calls["evalsha"] != 2 || delta.calls["eval"] != 0 {
				t.Errorf("server ran %v evalsha, %v eval for 100 decisions; want 2 evalsha", delta.calls["evalsha"], delta.calls["eval"])
			}
			if v, err := control.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v != 100 {
				t.Fatalf("counter in Redis: %d, %v; want 100", v, err)
			}
		})
	}
}

// TestCoalescedAtTheLimit: a group that does not fit spends nothing and its members are
// decided one by one, so exactly the limit is admitted; a group is never larger than the
// rule's capacity, and decisions beyond a full group go alone.
func TestCoalescedAtTheLimit(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			srv, control, l := coalescing(t, tr.opts, lua.WithCoalescing(4096))
			const limit, callers = 50, 200
			chk := apiCheck(limit)
			out := make(chan result, callers)
			hold(t, srv, l, chk, out)
			// The group holds at most limit / cost = 50 decisions; the other 149 go alone.
			join(t, l, chk, callers-1, limit, background, out)
			srv.Thaw(t)
			admitted := 0
			for range callers {
				r := <-out
				if r.err != nil {
					t.Fatal(r.err)
				}
				if r.d.Allowed {
					admitted++
				} else if r.d.RetryAfter <= 0 {
					t.Errorf("refusal without a retry time: %+v", r.d)
				}
			}
			if admitted != limit {
				t.Fatalf("admitted %d of %d, want exactly %d", admitted, callers, limit)
			}
			if v, err := control.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v != limit {
				t.Fatalf("counter in Redis: %d, %v; want %d", v, err, limit)
			}
		})
	}
}

// TestCoalescedMembersLeave: a member whose context ends (canceled, or its deadline
// passes) while its group waits, gets a certain error and spends nothing; the rest of
// the group is decided.
func TestCoalescedMembersLeave(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			srv, control, l := coalescing(t, tr.opts)
			chk := apiCheck(1000)
			out := make(chan result, 32)
			hold(t, srv, l, chk, out)
			const members, leaving = 10, 4
			ctxs := make([]context.Context, members)
			cancels := make([]context.CancelFunc, members)
			for i := range ctxs {
				ctxs[i], cancels[i] = context.WithCancel(context.Background())
				defer cancels[i]()
			}
			left := make(chan result, members)
			for i := range members {
				go func() {
					d, err := l.Allow(ctxs[i], chk)
					if i < leaving {
						left <- result{d, err}
						return
					}
					out <- result{d, err}
				}()
			}
			waitFor(t, "decisions to join a group", func() bool { m, _ := lua.Waiting(l); return m == members })
			// Two more with a deadline run out of time in the group.
			for range 2 {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					defer cancel()
					d, err := l.Allow(ctx, chk)
					left <- result{d, err}
				}()
			}
			for i := range leaving {
				cancels[i]()
			}
			for range leaving + 2 {
				r := <-left
				var se *ratebudget.StoreError
				if !errors.As(r.err, &se) || se.Uncertain || (se.Class != ratebudget.ClassCanceled && se.Class != ratebudget.ClassTimeout) {
					t.Fatalf("a member that left: %+v, %v; want a certain canceled or timeout error", r.d, r.err)
				}
			}
			waitFor(t, "members to leave", func() bool { m, _ := lua.Waiting(l); return m == members-leaving })
			srv.Thaw(t)
			var remaining []int64
			for range 1 + members - leaving {
				r := <-out
				if r.err != nil || !r.d.Allowed {
					t.Fatalf("decision: %+v, %v; want admitted", r.d, r.err)
				}
				remaining = append(remaining, r.d.Remaining)
			}
			slices.Sort(remaining)
			if want := []int64{993, 994, 995, 996, 997, 998, 999}; !slices.Equal(remaining, want) {
				t.Errorf("remaining: %v, want %v", remaining, want)
			}
			if v, err := control.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v != 1+members-leaving {
				t.Fatalf("counter in Redis: %d, %v; want %d", v, err, 1+members-leaving)
			}
		})
	}
}

// TestCoalescedStoreError: when the store fails, every member of the group gets a store
// error of its own, and nobody waits forever.
func TestCoalescedStoreError(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			srv := redistest.Start(t)
			control := srv.Client(t)
			l := newLimiter(t, control, append(tr.opts, lua.WithCoalescing(256))...)
			chk := apiCheck(1000)
			out := make(chan result, 32)
			hold(t, srv, l, chk, out)
			join(t, l, chk, 8, 8, background, out)
			srv.Kill(t)
			seen := map[*ratebudget.StoreError]bool{}
			for range 9 {
				r := <-out
				var se *ratebudget.StoreError
				if !errors.As(r.err, &se) {
					t.Fatalf("decision with the store gone: %+v, %v; want a StoreError", r.d, r.err)
				}
				if seen[se] {
					t.Fatal("two members share one *StoreError")
				}
				seen[se] = true
			}
		})
	}
}

// TestCoalescedExactUnderContention: 64 callers on one budget, coalescing on, admit
// exactly the limit.
func TestCoalescedExactUnderContention(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	for _, tr := range transports {
		for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
			t.Run(tr.name+"/"+algname.Of(alg), func(t *testing.T) {
				l := newLimiter(t, client, append(tr.opts, lua.WithCoalescing(16), lua.WithRefusalCache(0))...)
				const callers, each, limit = 64, 20, 500
				chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Algorithm: alg, Limit: limit, Window: time.Hour}, Identity: "ann", Cost: 1}}
				admitted := admitConcurrently(t, l, chk, callers, each)
				if admitted != limit {
					t.Fatalf("admitted %d of %d, want exactly %d", admitted, callers*each, limit)
				}
			})
		}
	}
}

// TestCoalescedSenderLeaves: the first member of a group, which is to send its call,
// has its context end as the group is sealed. It reports a certain error, having sent
// nothing, and the other members decide alone: all admitted, and the budget in Redis
// counts exactly the admissions.
func TestCoalescedSenderLeaves(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			srv, control, l := coalescing(t, tr.opts)
			chk := apiCheck(1000)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			lua.OnSeal(l, cancel)
			out := make(chan result, 8)
			hold(t, srv, l, chk, out)
			sender := make(chan result, 1)
			go func() {
				d, err := l.Allow(ctx, chk)
				sender <- result{d, err}
			}()
			waitFor(t, "the sender to join", func() bool { m, _ := lua.Waiting(l); return m == 1 })
			join(t, l, chk, 3, 4, background, out)
			srv.Thaw(t)
			s := <-sender
			var se *ratebudget.StoreError
			if !errors.As(s.err, &se) || se.Uncertain || se.Class != ratebudget.ClassCanceled {
				t.Fatalf("sender: %+v, %v; want a certain canceled error", s.d, s.err)
			}
			for range 4 {
				if r := <-out; r.err != nil || !r.d.Allowed {
					t.Fatalf("decision %+v, %v; want admitted", r.d, r.err)
				}
			}
			if v, err := control.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v != 4 {
				t.Fatalf("counter in Redis: %d, %v; want 4", v, err)
			}
		})
	}
}

// TestCoalescedSenderTimesOut: the sender's own deadline passes while its
// group's call waits on a frozen server. It reports an uncertain timeout; the other
// members, who still have time, decide alone and are admitted once the server answers.
// The group's call, already written, is then applied too: the budget is over-counted by
// the group, never under-counted.
func TestCoalescedSenderTimesOut(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			srv, control, l := coalescing(t, tr.opts)
			chk := apiCheck(1000)
			lua.OnSeal(l, func() { srv.Freeze(t) })
			out := make(chan result, 8)
			hold(t, srv, l, chk, out)
			sender := make(chan result, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				d, err := l.Allow(ctx, chk)
				sender <- result{d, err}
			}()
			waitFor(t, "the sender to join", func() bool { m, _ := lua.Waiting(l); return m == 1 })
			join(t, l, chk, 2, 3, background, out)
			srv.Thaw(t) // the first decision returns; the group is sealed, and the server frozen again
			if r := <-out; r.err != nil || !r.d.Allowed {
				t.Fatalf("first decision %+v, %v; want admitted", r.d, r.err)
			}
			s := <-sender
			var se *ratebudget.StoreError
			if !errors.As(s.err, &se) || !se.Uncertain || se.Class != ratebudget.ClassTimeout {
				t.Fatalf("sender: %+v, %v; want an uncertain timeout", s.d, s.err)
			}
			srv.Thaw(t)
			for range 2 {
				if r := <-out; r.err != nil || !r.d.Allowed {
					t.Fatalf("decision %+v, %v; want admitted", r.d, r.err)
				}
			}
			if v, err := control.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v != 1+3+2 {
				t.Fatalf("counter in Redis: %d, %v; want 6 (1, the group of 3, then 2 alone)", v, err)
			}
		})
	}
}

// TestCoalescedSlotGroups: with coalescing on, a decision whose checks live in several
// slots (a per-client budget, then a service-wide budget at its limit) from 200 clients
// at once admits exactly the service's limit, and the per-client spend of the refused
// requests is given back. (Decisions of different clients are not identical, so they
// are not grouped; each is decided slot group by slot group.)
func TestCoalescedSlotGroups(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			_, control, l := coalescing(t, tr.opts)
			ctx := context.Background()
			perClient := ratebudget.Rule{Name: "client", Limit: 1_000_000, Window: time.Minute}
			checks := func(global ratebudget.Rule, client string) []ratebudget.Check {
				return []ratebudget.Check{{Rule: perClient, Identity: client, Cost: 1}, {Rule: global, Identity: "*", Cost: 1}}
			}
			tag := func(k string) string { return k[strings.IndexByte(k, '{'):strings.IndexByte(k, '}')] }
			if tag(l.Key(checks(perClient, "x")[0])) == tag(l.Key(checks(perClient, "x")[1])) {
				t.Fatal("test setup: the two budgets must have different hash tags")
			}
			tight := ratebudget.Rule{Name: "tight", Limit: 50, Window: time.Minute}
			exactLimitAcrossClients(t, l, control, func(client string) []ratebudget.Check { return checks(tight, "tight-"+client) }, 0)
			if v, err := control.Get(ctx, l.Key(checks(tight, "")[1])).Int(); err != nil || v != 50 {
				t.Fatalf("service counter: %d, %v; want 50", v, err)
			}
		})
	}
}

// TestOneServer: with WithOneServer, a per-client budget and a service-wide budget in
// another slot are decided in one script call, all-or-nothing: a refusal by the service
// budget spends nothing anywhere, with no refund call; under contention exactly the
// limit is admitted.
func TestOneServer(t *testing.T) {
	for _, tr := range transports {
		for _, coalesce := range []bool{false, true} {
			name := tr.name
			opts := append(tr.opts, lua.WithOneServer(), lua.WithRefusalCache(0))
			if coalesce {
				name += "/coalesced"
				opts = append(opts, lua.WithCoalescing(256))
			}
			t.Run(name, func(t *testing.T) {
				srv := redistest.Start(t)
				control := srv.Client(t)
				l := newLimiter(t, control, opts...)
				ctx := context.Background()
				perClient := ratebudget.Rule{Name: "client", Limit: 10, Window: time.Minute}
				checks := func(service ratebudget.Rule, client string) []ratebudget.Check {
					return []ratebudget.Check{{Rule: perClient, Identity: client, Cost: 1}, {Rule: service, Cost: 1}}
				}
				tag := func(k string) string { return k[strings.IndexByte(k, '{'):strings.IndexByte(k, '}')] }
				small := ratebudget.Rule{Name: "service", Limit: 3, Window: time.Minute}
				if tag(l.Key(checks(small, "c0")[0])) == tag(l.Key(checks(small, "c0")[1])) {
					t.Fatal("test setup: the two budgets must have different hash tags")
				}
				if _, err := l.Allow(ctx, checks(ratebudget.Rule{Name: "warm", Limit: 1, Window: time.Minute}, "w")); err != nil {
					t.Fatal(err) // loads the script
				}
				before := commandStats(t, control)
				for i := range 5 {
					client := "c" + strconv.Itoa(i)
					d, err := l.Allow(ctx, checks(small, client))
					if err != nil {
						t.Fatal(err)
					}
					if want := i < 3; d.Allowed != want || !want && d.Rule != "service" {
						t.Fatalf("client %d: %+v, want allowed=%v (refused by the service rule)", i, d, want)
					}
					n, err := control.Get(ctx, l.Key(checks(small, client)[0])).Int()
					if err != nil && !errors.Is(err, redis.Nil) {
						t.Fatal(err)
					}
					if want := map[bool]int{true: 1, false: 0}[i < 3]; n != want {
						t.Fatalf("client %d: per-client counter %d, want %d", i, n, want)
					}
				}
				if delta := commandStats(t, control).sub(before); delta.calls["evalsha"] != 5 || delta.calls["eval"] != 0 {
					t.Fatalf("server ran %v evalsha, %v eval for 5 decisions; want 5 evalsha and no refund", delta.calls["evalsha"], delta.calls["eval"])
				}

				tight := ratebudget.Rule{Name: "tight", Limit: 50, Window: time.Minute}
				exactLimitAcrossClients(t, l, control, func(client string) []ratebudget.Check { return checks(tight, client) }, 0)
			})
		}
	}
}

// TestConformanceOneServer runs the shared suite with WithOneServer.
func TestConformanceOneServer(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		return limitertest.Harness{Limiter: newLimiter(t, client, lua.WithOneServer())}
	})
}

// TestCoalescedOutcomes: through AllowEach every member of a group gets each check's
// outcome as it would have seen it admitted one after another: a fixed window and a
// token bucket each show (n-1-i) more units remaining for place i, the same place for
// both, and the bucket (one token per 100ms) is full again 100ms sooner per unit.
func TestCoalescedOutcomes(t *testing.T) {
	srv, _, l := coalescing(t, nil)
	chk := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "api", Limit: 1000, Window: time.Minute}, Identity: "ann", Cost: 1},
		{Rule: ratebudget.Rule{Name: "bucket", Algorithm: ratebudget.TokenBucket, Limit: 600, Window: time.Minute}, Cost: 1},
	}
	warm := []ratebudget.Check{{Rule: chk[0].Rule, Identity: "warm", Cost: 1}}
	if _, err := l.Allow(context.Background(), warm); err != nil { // loads the script
		t.Fatal(err)
	}
	type each struct {
		d    ratebudget.Decision
		outs []ratebudget.Outcome
		err  error
	}
	out := make(chan each, 100)
	decide := func() {
		outs := make([]ratebudget.Outcome, len(chk))
		d, err := l.AllowEach(context.Background(), chk, outs)
		out <- each{d, outs, err}
	}
	srv.Freeze(t)
	go decide()
	waitFor(t, "the first decision in flight", func() bool { _, f := lua.Waiting(l); return f == 1 })
	for range 99 {
		go decide()
	}
	waitFor(t, "decisions to join a group", func() bool { m, _ := lua.Waiting(l); return m == 99 })
	srv.Thaw(t)
	var api, bucket []int64
	var full time.Duration // the bucket's ResetAfter plus 100ms per unit remaining
	for i := range 100 {
		r := <-out
		if r.err != nil || !r.d.Allowed || !r.outs[0].Allowed || !r.outs[1].Allowed {
			t.Fatalf("decision %d: %+v %+v, %v; want admitted", i, r.d, r.outs, r.err)
		}
		if 999-r.outs[0].Remaining != 599-r.outs[1].Remaining {
			t.Fatalf("outcomes %+v: api and bucket at different places", r.outs)
		}
		if r.d.Remaining != r.outs[r.d.Index].Remaining || r.d.ResetAfter != r.outs[r.d.Index].ResetAfter {
			t.Fatalf("decision %+v does not report its rule's outcome %+v", r.d, r.outs[r.d.Index])
		}
		api, bucket = append(api, r.outs[0].Remaining), append(bucket, r.outs[1].Remaining)
		if r.outs[1].Remaining == 599 {
			continue // the first decision, alone: earlier, so its bucket refills for longer
		}
		f := r.outs[1].ResetAfter + time.Duration(r.outs[1].Remaining)*100*time.Millisecond
		if full != 0 && f != full {
			t.Fatalf("bucket: remaining %d, full again in %v; want %v less 100ms per unit remaining",
				r.outs[1].Remaining, r.outs[1].ResetAfter, full)
		}
		full = f
	}
	slices.Sort(api)
	slices.Sort(bucket)
	for i := range 100 {
		// The first decision went alone; the 99 others as a group.
		if api[i] != int64(900+i) || bucket[i] != int64(500+i) {
			t.Fatalf("remaining, sorted: api %v, bucket %v; want 900 to 999 and 500 to 599", api, bucket)
		}
	}
}

// TestCoalescedRefusedOutcomes: a coalesced group that a full budget refuses is decided
// again member by member, and every member reports the check that fits with its budget
// as it is, which no refusal spent from: whole, nothing to reset (every time rule that
// coalesces: leases never do).
func TestCoalescedRefusedOutcomes(t *testing.T) {
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
			srv, _, l := coalescing(t, nil)
			ctx := context.Background()
			a := ratebudget.Rule{Name: "a", Algorithm: alg, Limit: 1000, Window: time.Hour}
			// A capacity of 100, so that decisions of cost 1 group; all spent.
			full := ratebudget.Rule{Name: "full", Limit: 100, Window: time.Hour}
			// One identity, one slot: each decision is one script call, all-or-nothing.
			if d, err := l.Allow(ctx, []ratebudget.Check{{Rule: full, Identity: "ann", Cost: 100}}); err != nil || !d.Allowed {
				t.Fatalf("filling %s: %+v, %v", full.Name, d, err)
			}
			chk := []ratebudget.Check{{Rule: a, Identity: "ann", Cost: 1}, {Rule: full, Identity: "ann", Cost: 1}}
			type each struct {
				d    ratebudget.Decision
				outs []ratebudget.Outcome
				err  error
			}
			const n = 20
			out := make(chan each, n)
			decide := func() {
				outs := make([]ratebudget.Outcome, len(chk))
				d, err := l.AllowEach(ctx, chk, outs)
				out <- each{d, outs, err}
			}
			srv.Freeze(t)
			go decide()
			waitFor(t, "the first decision in flight", func() bool { _, f := lua.Waiting(l); return f == 1 })
			for range n - 1 {
				go decide()
			}
			waitFor(t, "decisions to join a group", func() bool { m, _ := lua.Waiting(l); return m == n-1 })
			srv.Thaw(t)
			want := ratebudget.Outcome{Allowed: true, Remaining: 1000}
			for i := range n {
				r := <-out
				if r.err != nil || r.d.Allowed || r.d.Rule != full.Name || r.outs[0] != want {
					t.Fatalf("decision %d: %+v %+v, %v; want refused by %s, and %s %+v", i, r.d, r.outs, r.err, full.Name, a.Name, want)
				}
			}
		})
	}
}
