package lua_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// orderHook puts the test in charge of the order in which calls reach the server. Once
// armed for a script, the next call of it returns an uncertain error at once (a lost
// reply): with ranFirst the call has run before (only its reply is lost), otherwise it
// is held, and runs when the test calls release. Every other settle.lua call reports its
// result on settled.
type orderHook struct {
	mu       sync.Mutex
	sha      string // the script whose next call to take; "" when disarmed
	ranFirst bool
	held     redis.Cmder
	settled  chan error
}

func (h *orderHook) arm(sha string, ranFirst bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.ranFirst = sha, ranFirst
}

// release sends the held call now, on c, and returns its command, with its reply.
func (h *orderHook) release(t *testing.T, c *redis.Client) *redis.Cmd {
	t.Helper()
	h.mu.Lock()
	cmd := h.held
	h.held = nil
	h.mu.Unlock()
	if cmd == nil {
		t.Fatal("no call was held")
	}
	late := c.Do(context.Background(), cmd.Args()...)
	if args := cmd.Args(); args[1] == sha1hex(lua.SettleSource) {
		<-h.settled // its own report
	}
	return late
}

func (h *orderHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *orderHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *orderHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	settle := sha1hex(lua.SettleSource)
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if cmd.Name() != "evalsha" || len(args) < 2 {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		take := h.sha != "" && args[1] == h.sha
		ranFirst := h.ranFirst
		if take {
			h.sha = ""
			if !ranFirst {
				h.held = cmd
			}
		}
		h.mu.Unlock()
		if take {
			if ranFirst {
				_ = next(ctx, cmd)
			}
			return io.ErrUnexpectedEOF
		}
		err := next(ctx, cmd)
		if args[1] == settle {
			h.settled <- err
		}
		return err
	}
}

// stallLimiter is a limiter on a server of its own, with the order hook on its client.
func stallLimiter(t *testing.T) (*lua.Limiter, *redis.Client, *orderHook, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &orderHook{settled: make(chan error, 64)}
	client.AddHook(hook)
	l := newLimiter(t, client, lua.WithRefusalCache(0))
	if err := l.Load(context.Background()); err != nil { // EVALSHA runs the scripts: no NOSCRIPT round
		t.Fatal(err)
	}
	return l, client, hook, srv
}

func awaitSettle(t *testing.T, hook *orderHook) {
	t.Helper()
	select {
	case err := <-hook.settled:
		if err != nil {
			t.Fatalf("settle.lua: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no settle.lua call within 10s")
	}
}

// count is a fixed window's count: 0 when the key is gone (nothing spent).
func count(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	n, err := c.Get(context.Background(), key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sam(limit int64) []ratebudget.Check {
	return []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: limit, Window: time.Minute}, Identity: "sam", Cost: 1}}
}

// A void that reaches the server before the reservation it voids (the reservation was
// held up, its caller answered without it) leaves a tombstone, and the reservation,
// when it arrives, is a no-op: an error reply, nothing spent.
func TestVoidBeforeReservation(t *testing.T) {
	l, c, hook, _ := stallLimiter(t)
	ctx := context.Background()
	checks := sam(10)
	hook.arm(sha1hex(lua.AllowSource), false)
	tickets := make([]ratebudget.Ticket, 1)
	_, err := l.Reserve(ctx, checks, tickets, nil)
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || !se.Uncertain {
		t.Fatalf("Reserve: %v, want an uncertain StoreError", err)
	}
	awaitSettle(t, hook) // the void
	late := hook.release(t, c)
	if err := late.Err(); err == nil || !strings.Contains(err.Error(), "reservation voided") {
		t.Fatalf("the late reservation: %v, want the reply that it was voided", err)
	}
	if n := count(t, c, l.Key(checks[0])); n != 0 {
		t.Fatalf("count %d after the late reservation, want 0", n)
	}
	if s := awaitRepairs(t, l); s.Queued != 1 || s.Landed != 1 || s.Dropped != 0 {
		t.Fatalf("repairs %+v, want one queued and landed", s)
	}
}

// A void that reaches the server after the reservation it voids (which ran, its reply
// lost) gives the reservation's spend back; the budget is as before.
func TestVoidAfterReservation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		checks []ratebudget.Check
	}{
		{"fixed", sam(10)},
		{"three algorithms and a lease", []ratebudget.Check{
			{Rule: ratebudget.Rule{Name: "f", Limit: 10, Window: time.Minute}, Identity: "ann", Cost: 2},
			{Rule: ratebudget.Rule{Name: "t", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Minute}, Identity: "ann", Cost: 3},
			{Rule: ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 10, Window: time.Minute}, Identity: "ann", Cost: 4},
			{Rule: ratebudget.Rule{Name: "l", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}, Identity: "ann", Cost: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, c, hook, _ := stallLimiter(t)
			ctx := context.Background()
			hook.arm(sha1hex(lua.AllowSource), true)
			tickets := make([]ratebudget.Ticket, len(tc.checks))
			if _, err := l.Reserve(ctx, tc.checks, tickets, nil); err == nil {
				t.Fatal("Reserve: no error, want the lost reply's")
			}
			awaitSettle(t, hook) // the void
			for _, ch := range tc.checks {
				if n, err := c.Exists(ctx, l.Key(ch)).Result(); err != nil || n != 0 {
					t.Fatalf("%s: key exists (%d, %v) after the void: the spend was not given back", ch.Rule.Name, n, err)
				}
			}
			// The budget is whole: the reservation again, of the whole lease too.
			if d, err := l.Reserve(ctx, tc.checks, tickets, nil); err != nil || !d.Allowed {
				t.Fatalf("Reserve after the void: %+v, %v", d, err)
			}
		})
	}
}

// A give-back whose reply was lost is re-sent with the reservation's id, and applies
// once: when the first attempt ran (the re-sent one then finds the reservation settled)
// and when the re-sent one lands first (the first one, arriving late, is a no-op).
func TestRepeatedGiveBackAppliesOnce(t *testing.T) {
	for _, ranFirst := range []bool{true, false} {
		name := "re-sent lands first"
		if ranFirst {
			name = "first attempt ran"
		}
		t.Run(name, func(t *testing.T) {
			l, c, hook, _ := stallLimiter(t)
			ctx := context.Background()
			checks := sam(10)
			a, b := make([]ratebudget.Ticket, 1), make([]ratebudget.Ticket, 1)
			for _, tk := range [][]ratebudget.Ticket{a, b} {
				if d, err := l.Reserve(ctx, checks, tk, nil); err != nil || !d.Allowed {
					t.Fatalf("Reserve: %+v, %v", d, err)
				}
			}
			hook.arm(sha1hex(lua.SettleSource), ranFirst)
			if err := l.Settle(ctx, checks, a, []int64{0}); err == nil {
				t.Fatal("Settle: no error, want the lost reply's")
			}
			awaitSettle(t, hook) // the re-sent give-back
			if !ranFirst {
				first := hook.release(t, c)
				if err := first.Err(); err != nil {
					t.Fatalf("the late first attempt: %v", err)
				}
				if v := first.Val(); !equalInts(v, 0) {
					t.Fatalf("the late first attempt replied %v, want 0: not applied", v)
				}
			}
			if n := count(t, c, l.Key(checks[0])); n != 1 {
				t.Fatalf("count %d, want 1: b's spend, a's given back once", n)
			}
			if s := awaitRepairs(t, l); s.Queued != 1 || s.Landed != 1 {
				t.Fatalf("repairs %+v, want one queued and landed", s)
			}
			// A settle of b as it should be: given back, marker and all.
			if err := l.Settle(ctx, checks, b, []int64{0}); err != nil {
				t.Fatal(err)
			}
			awaitSettle(t, hook)
			if n := count(t, c, l.Key(checks[0])); n != 0 {
				t.Fatalf("count %d, want 0", n)
			}
		})
	}
}

// awaitRepairs waits until no repair of l is pending, and returns the counts, which
// l.Repairs reports then too: nothing pending, and as many dropped.
func awaitRepairs(t *testing.T, l *lua.Limiter) lua.RepairStats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := lua.RepairCounts(l)
		if s.Pending == 0 && s.Landed+s.Dropped == s.Queued {
			if pending, dropped := l.Repairs(); pending != 0 || dropped != int64(s.Dropped) {
				t.Fatalf("Repairs() = %d pending, %d dropped; want 0 and %d (%+v)", pending, dropped, s.Dropped, s)
			}
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("repairs %+v still pending after 20s", s)
		}
		time.Sleep(time.Millisecond) // polling the repairs' counts, not a synchronisation
	}
}

func equalInts(v any, want ...int64) bool {
	vals, ok := v.([]any)
	if !ok || len(vals) != len(want) {
		return false
	}
	for i := range vals {
		if vals[i] != want[i] {
			return false
		}
	}
	return true
}

// A store that stalls (SIGSTOP for a while, then SIGCONT) with reservations and
// give-backs in flight loses no budget: the give-backs that failed are re-sent, the
// reservations whose callers gave up are voided, and once the repairs have landed the
// budget is whole, whichever way each call went.
func TestStallLosesNoBudget(t *testing.T) {
	_, c, _, srv := stallLimiter(t)
	// The hook's settled channel is not read here: a limiter on a client without it.
	c2 := srv.Client(t)
	l := newLimiter(t, c2, lua.WithRefusalCache(0))
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	const limit = 20
	checks := sam(limit)
	// Half the budget reserved before the stall, given back during it.
	held := make([][]ratebudget.Ticket, limit/2)
	for i := range held {
		held[i] = make([]ratebudget.Ticket, 1)
		if d, err := l.Reserve(ctx, checks, held[i], nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
	}
	srv.Freeze(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range held {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			errs <- l.Settle(sctx, checks, held[i], []int64{0})
		})
	}
	for range 40 {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := l.Reserve(rctx, checks, make([]ratebudget.Ticket, 1), nil)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Fatal("a call succeeded while the server was stopped")
		}
	}
	srv.Thaw(t)
	if s := awaitRepairs(t, l); s.Dropped != 0 || s.Landed == 0 {
		t.Fatalf("repairs %+v, want all landed", s)
	}
	if n := count(t, c, l.Key(checks[0])); n != 0 {
		t.Fatalf("count %d after the stall, want 0: the budget is whole", n)
	}
	for i := range limit {
		if d, err := l.Allow(ctx, checks); err != nil || !d.Allowed {
			t.Fatalf("admission %d after the stall: %+v, %v", i+1, d, err)
		}
	}
	if d, err := l.Allow(ctx, checks); err != nil || d.Allowed {
		t.Fatalf("admission %d: %+v, %v, want a refusal", limit+1, d, err)
	}
}
