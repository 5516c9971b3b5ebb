package lua_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// tryAgainHook is a go-redis hook that counts the script calls (EVALSHA, EVAL) a client
// returns, by outcome. The first call answered TRYAGAIN after hold was set sends on
// seen and waits, before returning, until release is closed. With slow set to n > 0,
// the n-th call answered TRYAGAIN after that comes back late: once the time left until
// its context's deadline is less than the time since it was sent.
type tryAgainHook struct {
	tryAgain, ok atomic.Int64
	hold         atomic.Bool
	seen         chan struct{}
	release      chan struct{}
	slow         atomic.Int64
}

func newScriptCalls() *tryAgainHook {
	return &tryAgainHook{seen: make(chan struct{}, 1), release: make(chan struct{})}
}

func (h *tryAgainHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tryAgainHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *tryAgainHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmd)
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return err
		}
		var rErr redis.Error
		switch {
		case err == nil:
			h.ok.Add(1)
		case errors.As(err, &rErr) && strings.HasPrefix(rErr.Error(), "TRYAGAIN "):
			h.tryAgain.Add(1)
			if h.hold.CompareAndSwap(true, false) {
				h.seen <- struct{}{}
				<-h.release
			}
			if dl, ok := ctx.Deadline(); ok && h.slow.Load() > 0 && h.slow.Add(-1) == 0 {
				// The wait is the slowness of the reply, what the test is about, not a
				// way to let something else happen first.
				late := time.NewTimer(time.Until(sent.Add(dl.Sub(sent) / 2)))
				<-late.C
			}
		}
		return err
	}
}

// splitSlot starts migrating the slot of keys[0] from its node to another node of
// nodes, and moves keys[0] there; the other keys stay. It returns a function that
// completes the migration: the other keys moved, the slot given to the new node.
func splitSlot(t *testing.T, c *redis.ClusterClient, nodes []*redistest.Server, keys []string) (finish func()) {
	t.Helper()
	ctx := context.Background()
	s := slot(t, c, keys[0])
	for _, k := range keys[1:] {
		if slot(t, c, k) != s {
			t.Fatalf("keys %q and %q are in different slots", keys[0], k)
		}
	}
	src, dst := -1, -1
	for i, n := range nodes {
		if n.Client(t).Exists(ctx, keys...).Val() == int64(len(keys)) {
			src = i
		}
	}
	if src < 0 {
		t.Fatalf("no node holds all of %q", keys)
	}
	dst = (src + 1) % len(nodes)
	from, to := nodes[src].Client(t), nodes[dst].Client(t)
	fromID, toID := from.Do(ctx, "CLUSTER", "MYID").Val(), to.Do(ctx, "CLUSTER", "MYID").Val()
	host, port, _ := net.SplitHostPort(nodes[dst].Addr)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(to.Do(ctx, "CLUSTER", "SETSLOT", s, "IMPORTING", fromID).Err())
	must(from.Do(ctx, "CLUSTER", "SETSLOT", s, "MIGRATING", toID).Err())
	must(from.Migrate(ctx, host, port, keys[0], 0, 5*time.Second).Err())
	return func() {
		t.Helper()
		for _, k := range keys[1:] {
			must(from.Migrate(ctx, host, port, k, 0, 5*time.Second).Err())
		}
		must(to.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", toID).Err())
		must(from.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", toID).Err())
	}
}

// counters returns the value of each key, read through the cluster client (which
// follows a key being migrated).
func counters(t *testing.T, c *redis.ClusterClient, keys []string) []int64 {
	t.Helper()
	var vs []int64
	for _, k := range keys {
		v, err := c.Get(context.Background(), k).Int64()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		vs = append(vs, v)
	}
	return vs
}

// TestTryAgainWhileResharding: a decision whose keys share a slot that is being
// migrated, some keys moved and some not, gets TRYAGAIN from Redis (the script did not
// run). The limiter sends it again until the migration is over, and it is spent once;
// if the decision's deadline comes first, it fails with a certain error and nothing is
// spent.
func TestTryAgainWhileResharding(t *testing.T) {
	c, nodes := redistest.StartCluster(t, 2)
	h := newScriptCalls()
	c.AddHook(h)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	checksOf := func(id string) []ratebudget.Check {
		return []ratebudget.Check{
			{Rule: ratebudget.Rule{Name: "minute", Limit: 10, Window: time.Hour}, Identity: id, Cost: 3},
			{Rule: ratebudget.Rule{Name: "day", Limit: 100, Window: 24 * time.Hour}, Identity: id, Cost: 3},
		}
	}
	keysOf := func(checks []ratebudget.Check) []string {
		return []string{l.Key(checks[0]), l.Key(checks[1])}
	}

	t.Run("MigrationEnds", func(t *testing.T) {
		checks := checksOf("ann")
		keys := keysOf(checks)
		if _, err := l.Allow(ctx, checks); err != nil {
			t.Fatal(err)
		}
		finish := splitSlot(t, c, nodes, keys)
		h.hold.Store(true)
		tries, oks := h.tryAgain.Load(), h.ok.Load()
		type result struct {
			d   ratebudget.Decision
			err error
		}
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			d, err := l.Allow(ctx, checks)
			done <- result{d, err}
		}()
		select {
		case <-h.seen:
		case r := <-done:
			t.Fatalf("Allow = %+v, %v before any TRYAGAIN", r.d, r.err)
		}
		finish()
		close(h.release)
		r := <-done
		if r.err != nil || !r.d.Allowed {
			t.Fatalf("Allow = %+v, %v; want it admitted once the migration is over", r.d, r.err)
		}
		if n := h.tryAgain.Load() - tries; n != 1 {
			t.Errorf("%d TRYAGAIN replies, want 1", n)
		}
		if n := h.ok.Load() - oks; n != 1 {
			t.Errorf("%d script calls succeeded, want 1", n)
		}
		if got := counters(t, c, keys); got[0] != 6 || got[1] != 6 {
			t.Fatalf("counters %v after two decisions of cost 3, want [6 6]", got)
		}
	})

	t.Run("DeadlineFirst", func(t *testing.T) {
		checks := checksOf("bob")
		keys := keysOf(checks)
		if _, err := l.Allow(ctx, checks); err != nil {
			t.Fatal(err)
		}
		splitSlot(t, c, nodes, keys)
		tries := h.tryAgain.Load()
		// The first try comes back at once, the second one late: with less time left
		// than it took, which a third try could not come back in. The limiter stops
		// there, before the deadline, with the second try's certain TRYAGAIN; had it
		// sent a third try, the deadline would cut it short, an uncertain error. (Both
		// tries taken as they come, the last one can be cut short by a stall of the
		// process or of the server, on a loaded machine.) The deadline is a bound on the
		// first try.
		h.slow.Store(2)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := l.Allow(dctx, checks)
		early := dctx.Err() == nil
		var se *ratebudget.StoreError
		var rErr redis.Error
		if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain ||
			!errors.As(err, &rErr) || !strings.HasPrefix(rErr.Error(), "TRYAGAIN ") {
			t.Fatalf("Allow = %v; want a certain server error carrying TRYAGAIN", err)
		}
		if n := h.tryAgain.Load() - tries; n != 2 {
			t.Errorf("%d TRYAGAIN replies before the deadline, want 2: the call sent again once, and not after a try that took longer than the time left", n)
		}
		if !early {
			t.Errorf("Allow returned after its deadline, want it to stop when the next try could not come back in time")
		}
		if got := counters(t, c, keys); got[0] != 3 || got[1] != 3 {
			t.Fatalf("counters %v, want [3 3]: the failed decision spent", got)
		}
		// Without a deadline the call stops trying after a bounded time: a migration
		// left half done does not hold it until it is canceled.
		tries = h.tryAgain.Load()
		_, err = l.Allow(context.Background(), checks)
		if !errors.As(err, &rErr) || !strings.HasPrefix(rErr.Error(), "TRYAGAIN ") {
			t.Fatalf("Allow without a deadline = %v; want the last TRYAGAIN", err)
		}
		if n := h.tryAgain.Load() - tries; n < 2 {
			t.Errorf("%d TRYAGAIN replies without a deadline, want the call sent again", n)
		}
		if got := counters(t, c, keys); got[0] != 3 || got[1] != 3 {
			t.Fatalf("counters %v, want [3 3]", got)
		}
	})
}

// replyErr is an error reply, as a server sends it.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// injectErrs is a go-redis hook that makes the first n script calls fail with err:
// without sending them when sent is false, after running them when it is true.
type injectErrs struct {
	err   error
	sent  bool
	n     atomic.Int64
	calls atomic.Int64
}

func (h *injectErrs) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *injectErrs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *injectErrs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmd)
		}
		h.calls.Add(1)
		if h.n.Add(-1) < 0 {
			return next(ctx, cmd)
		}
		if h.sent {
			_ = next(ctx, cmd)
		}
		cmd.SetErr(h.err)
		return h.err
	}
}

// TestOnlyTryAgainIsSentAgain: TRYAGAIN is the one error after which a script call is
// sent again. CLUSTERDOWN and MASTERDOWN (also refusals before the script runs) and
// errors after which the script may have run are returned at once, and nothing is
// spent twice.
func TestOnlyTryAgainIsSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		err       error
		sent      bool
		wantCalls int64
		wantClass ratebudget.ErrorClass
		uncertain bool
		wantSpent int64
	}{
		{"TRYAGAIN", replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), false, 3, "", false, 2},
		{"CLUSTERDOWN", replyErr("CLUSTERDOWN The cluster is down"), false, 1, "server", false, 0},
		{"MASTERDOWN", replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), false, 1, "server", false, 0},
		{"ERR TRYAGAIN", replyErr("ERR TRYAGAIN not a cluster refusal"), false, 1, "server", false, 0},
		{"lost reply", io.ErrUnexpectedEOF, true, 1, "connection", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := srv.Client(t)
			h := &injectErrs{err: tc.err, sent: tc.sent}
			h.n.Store(2)
			c.AddHook(h)
			l := newLimiter(t, c, lua.WithRefusalCache(0))
			if err := l.Load(ctx); err != nil {
				t.Fatal(err)
			}
			check := ratebudget.Check{Rule: ratebudget.Rule{Name: "r", Limit: 10, Window: time.Hour}, Identity: "ann", Cost: 2}
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			d, err := l.Allow(dctx, []ratebudget.Check{check})
			if tc.wantClass == "" {
				if err != nil || !d.Allowed {
					t.Fatalf("Allow = %+v, %v; want admitted", d, err)
				}
			} else {
				var se *ratebudget.StoreError
				if !errors.As(err, &se) || se.Class != tc.wantClass || se.Uncertain != tc.uncertain {
					t.Fatalf("Allow = %v; want a %q error, uncertain %v", err, tc.wantClass, tc.uncertain)
				}
			}
			if n := h.calls.Load(); n != tc.wantCalls {
				t.Errorf("%d script calls, want %d", n, tc.wantCalls)
			}
			spent, err := c.Get(ctx, l.Key(check)).Int64()
			if errors.Is(err, redis.Nil) {
				spent, err = 0, nil
			}
			if err != nil || spent != tc.wantSpent {
				t.Fatalf("counter %d, %v; want %d", spent, err, tc.wantSpent)
			}
		})
	}
}

// TestSettleSentAgainAfterTryAgain: a settle answered TRYAGAIN goes through the same
// send path: it is sent again and applied once.
func TestSettleSentAgainAfterTryAgain(t *testing.T) {
	c := redistest.Start(t).Client(t)
	h := &injectErrs{err: replyErr("TRYAGAIN Multiple keys request during rehashing of slot")}
	c.AddHook(h)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	checks := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "r", Limit: 10, Window: time.Hour}, Identity: "ann", Cost: 5}}
	tickets := make([]ratebudget.Ticket, 1)
	if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve = %+v, %v", d, err)
	}
	h.n.Store(2)
	before := h.calls.Load()
	if err := l.Settle(ctx, checks, tickets, []int64{1}); err != nil {
		t.Fatalf("Settle = %v, want the call sent again after TRYAGAIN", err)
	}
	if n := h.calls.Load() - before; n != 3 {
		t.Errorf("%d settle calls, want 3 (two TRYAGAIN, then the one that ran)", n)
	}
	if n, err := c.Get(ctx, l.Key(checks[0])).Int64(); err != nil || n != 1 {
		t.Fatalf("counter %d, %v after settling 5 to 1; want 1", n, err)
	}
}
