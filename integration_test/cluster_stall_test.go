package integration_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// stallHook freezes a server for stall just before the client sends the n-th script
// call (counted from arm) whose first key is key, and thaws it after stall: a server
// that hangs in the middle of a decision. It sits at the top of the client's hook chain,
// above any retry the client makes.
type stallHook struct {
	srv     *redistest.Server
	t       *testing.T
	stall   time.Duration
	key     string
	n       int64
	seen    atomic.Int64
	armed   atomic.Bool
	thawed  chan struct{}
	trigger sync.Once
}

func (h *stallHook) arm(srv *redistest.Server, key string, n int64) {
	h.srv, h.key, h.n = srv, key, n
	h.seen.Store(0)
	h.thawed = make(chan struct{})
	h.trigger = sync.Once{}
	h.armed.Store(true)
}

func (h *stallHook) check(cmds ...redis.Cmder) {
	if !h.armed.Load() {
		return
	}
	for _, c := range cmds {
		a := c.Args()
		if len(a) < 4 || (a[0] != "evalsha" && a[0] != "eval") || argString(a[3]) != h.key {
			continue
		}
		if h.seen.Add(1) == h.n {
			h.trigger.Do(func() {
				h.armed.Store(false)
				h.srv.Freeze(h.t)
				time.AfterFunc(h.stall, func() {
					h.srv.Thaw(h.t)
					close(h.thawed)
				})
			})
		}
	}
}

// argString is a command argument as the server receives it, for the forms the
// limiter passes keys in.
func argString(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case *string:
		return *v
	case []byte:
		return string(v)
	case *[]byte:
		return string(*v)
	}
	return ""
}

// wait returns once the server is thawed; the test fails if the stall never started.
func (h *stallHook) wait(t *testing.T) {
	t.Helper()
	select {
	case <-h.thawed:
	case <-time.After(h.stall + 10*time.Second):
		t.Fatalf("no script call with key %s was seen: nothing stalled", h.key)
	}
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(cmd)
		return next(ctx, cmd)
	}
}

func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.check(cmds...)
		return next(ctx, cmds)
	}
}

// readmeSettings are the client settings README recommends for the limiter.
func readmeSettings(o *redis.ClusterOptions) {
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	o.DialTimeout = 200 * time.Millisecond
	o.DialerRetries = 1
	o.ReadTimeout = 200 * time.Millisecond
	o.WriteTimeout = 200 * time.Millisecond
	o.PoolTimeout = 200 * time.Millisecond
}

// stallTarget is one client type under the stall test: a client with the hook, and
// the server that holds a key.
type stallTarget struct {
	client redis.Scripter
	owner  func(key string) *redistest.Server
	// idle reports whether every pool the client has holds its idle connections: a
	// retry then finds a connection ready, as it would in a service under load.
	idle func() bool
}

// minIdle is the stall clients' MinIdleConns.
const minIdle = 4

// TestStallRunsOnce stalls the server of a budget for 1.5 s while a decision's spend,
// or its refund, is on the way, through each supported client type with the README's
// settings, with a deadline shorter and longer than the stall: the server runs the script exactly once for the spend and once for the refund
// (INFO commandstats), and the budget's counter says the same.
func TestStallRunsOnce(t *testing.T) {
	const stall = 1500 * time.Millisecond
	targets := map[string]func(t *testing.T, h *stallHook) stallTarget{
		"ClusterClient": func(t *testing.T, h *stallHook) stallTarget {
			cl := redistest.StartClusterWithReplicas(t, 3, 0, failoverNodeTimeout)
			c := cl.Client(t, func(o *redis.ClusterOptions) { readmeSettings(o); o.MinIdleConns = minIdle })
			c.AddHook(h)
			return stallTarget{c, func(key string) *redistest.Server {
				return cl.SlotOwner(int(c.ClusterKeySlot(context.Background(), key).Val())).Server
			}, func() bool {
				var short atomic.Bool // ForEachMaster calls concurrently
				_ = c.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
					if n.PoolStats().IdleConns < minIdle {
						short.Store(true)
					}
					return nil
				})
				return !short.Load()
			}}
		},
		// The cluster client's own AutoPipeliner, given to the limiter: every decision
		// goes through it.
		"AutoPipeliner": func(t *testing.T, h *stallHook) stallTarget {
			cl := redistest.StartClusterWithReplicas(t, 3, 0, failoverNodeTimeout)
			c := cl.Client(t, func(o *redis.ClusterOptions) { readmeSettings(o); o.MinIdleConns = minIdle })
			c.AddHook(h)
			ap, err := c.AsyncAutoPipeline()
			if err != nil {
				t.Fatal(err)
			}
			return stallTarget{ap, func(key string) *redistest.Server {
				return cl.SlotOwner(int(c.ClusterKeySlot(context.Background(), key).Val())).Server
			}, func() bool { return true }}
		},
		"Client": func(t *testing.T, h *stallHook) stallTarget {
			srv := redistest.Start(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true,
				DialTimeout: 200 * time.Millisecond, DialerRetries: 1, ReadTimeout: 200 * time.Millisecond,
				WriteTimeout: 200 * time.Millisecond, PoolTimeout: 200 * time.Millisecond, MinIdleConns: minIdle})
			t.Cleanup(func() { c.Close() })
			c.AddHook(h)
			return stallTarget{c, func(string) *redistest.Server { return srv },
				func() bool { return c.PoolStats().IdleConns >= minIdle }}
		},
	}
	for name, mk := range targets {
		t.Run(name, func(t *testing.T) {
			h := &stallHook{t: t, stall: stall}
			tg := mk(t, h)
			for _, deadline := range []time.Duration{500 * time.Millisecond, 3 * time.Second} {
				t.Run(deadline.String(), func(t *testing.T) { stallOnce(t, h, tg, deadline) })
			}
		})
	}
}

func stallOnce(t *testing.T, h *stallHook, tg stallTarget, deadline time.Duration) {
	h.t = t
	prefix := uniquePrefix(t)
	// Each decision below starts from a limiter of its own, so that no refusal it
	// remembers spares a call.
	newLimiter := func() *lua.Limiter {
		l, err := lua.New(tg.client, lua.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := newLimiter()
	ctx := ctxT(t)
	perClient := ratebudget.Rule{Name: "client", Limit: 100, Window: time.Hour}
	service := ratebudget.Rule{Name: "service", Limit: 1, Window: time.Hour}
	// An identity whose budget's slot is on another server than the service budget's,
	// where there are several.
	var a ratebudget.Check
	b := ratebudget.Check{Rule: service, Cost: 1}
	for i := 0; ; i++ {
		a = ratebudget.Check{Rule: perClient, Identity: "c" + strconv.Itoa(i), Cost: 1}
		if tg.owner(keyOf(prefix, a)) != tg.owner(keyOf(prefix, b)) || i > 100 {
			break
		}
	}
	keyA, srvA := keyOf(prefix, a), tg.owner(keyOf(prefix, a))
	// Where b lives on a's server, the refused decision runs b's script there too.
	shared := int64(0)
	if tg.owner(keyOf(prefix, b)) == srvA {
		shared = 1
	}
	counter := func() int64 {
		n, err := srvA.Client(t).Get(ctx, keyA).Int64()
		if err != nil {
			t.Fatalf("counter of %s: %v", keyA, err)
		}
		return n
	}
	// Warm both scripts where they run: spend 3 units of a, then two two-slot
	// decisions: the first spends 1 of a and exhausts b, the second is refused by b
	// and refunds a. The counter is 4.
	for range 3 {
		if d, err := l.Allow(ctx, []ratebudget.Check{a}); err != nil || !d.Allowed {
			t.Fatalf("warm-up: %+v %v", d, err)
		}
	}
	for range 2 {
		if _, err := l.Allow(ctx, []ratebudget.Check{a, b}); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	if n := counter(); n != 4 {
		t.Fatalf("counter %d after the warm-up, want 4", n)
	}
	for deadline := time.Now().Add(10 * time.Second); !tg.idle(); {
		if time.Now().After(deadline) {
			t.Fatal("the client's pools never held their idle connections")
		}
		time.Sleep(10 * time.Millisecond) // the pool fills in the background; nothing to wait on
	}
	// Spend: stall at a's spend; the script runs once, whatever the caller sees.
	t.Run("spend", func(t *testing.T) {
		base := counter()
		before := srvA.ScriptCalls(t)
		h.arm(srvA, keyA, 1)
		dctx, cancel := context.WithTimeout(ctx, deadline)
		d, err := newLimiter().Allow(dctx, []ratebudget.Check{a})
		cancel()
		h.wait(t)
		calls := srvA.ScriptCalls(t) - before
		n := counter()
		t.Logf("allowed %v, error %v: %d script calls on the server, counter %d -> %d", d.Allowed, err, calls, base, n)
		if calls > 1 || n != base+calls {
			t.Errorf("one spend ran the script %d times, counter %d -> %d; want at most once, and the counter up by the runs", calls, base, n)
		}
	})
	// Refund: stall at a's refund after b refused; it is given back once.
	t.Run("refund", func(t *testing.T) {
		base := counter()
		before := srvA.ScriptCalls(t)
		h.arm(srvA, keyA, 2)
		dctx, cancel := context.WithTimeout(ctx, deadline)
		d, err := newLimiter().Allow(dctx, []ratebudget.Check{a, b})
		cancel()
		h.wait(t)
		calls := srvA.ScriptCalls(t) - before
		n := counter()
		t.Logf("allowed %v, error %v: %d script calls on the server, counter %d -> %d", d.Allowed, err, calls, base, n)
		// The spend ran; the refund at most once: a refund cut short keeps the spend
		// (an over-count), a refund run twice gives back what was never spent.
		calls -= shared
		if calls < 1 || calls > 2 || n != base+2-calls {
			t.Errorf("a refused decision ran %d scripts (want the spend and at most one refund), counter %d -> %d", calls, base, n)
		}
	})
}
