package middleware_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// countingLimiter counts the decisions and the pings that reach a lua.Limiter.
type countingLimiter struct {
	*lua.Limiter
	allows, pings atomic.Int64
}

func (c *countingLimiter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	c.allows.Add(1)
	return c.Limiter.Allow(ctx, checks)
}

func (c *countingLimiter) Ping(ctx context.Context) error {
	c.pings.Add(1)
	return c.Limiter.Ping(ctx)
}

// breakerWatch records a breaker's transitions: opened and closed are closed at the
// first opening and at the first closing after it, and allowsAtClose is the number of
// decisions that had reached the store when it closed (OnChange runs under the
// breaker's lock, so no decision passes it meanwhile).
type breakerWatch struct {
	lim            *countingLimiter
	opened, closed chan struct{}
	openOnce       sync.Once
	closeOnce      sync.Once
	allowsAtClose  atomic.Int64
}

func (w *breakerWatch) onChange(open bool) {
	if open {
		w.openOnce.Do(func() { close(w.opened) })
		return
	}
	w.closeOnce.Do(func() {
		w.allowsAtClose.Store(w.lim.allows.Load())
		close(w.closed)
	})
}

// waitUntil fails the test unless ch is closed within a generous bound.
func waitUntil(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not happen within 30s", what)
	}
}

// load sends requests to h from n goroutines until the returned function is called,
// which waits for them. Each goroutine sends one after the other; at n = 1 that is one
// request at a time, the lowest traffic that shows the breaker anything.
func load(h http.Handler, n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
					do(h, "GET", "/", nil)
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// An outage of the store opens the breaker at one request at a time and at 32 at
// once, whether it hangs (SIGSTOP: connections accepted, nothing answered) or is gone
// (killed: connections refused). While it is open no request reaches the store, the
// failure policy answers every one, and the limiter is pinged off the request path;
// the first answered ping closes it, after SIGCONT and after a restart on the same
// port, before any request has reached the store again; the next request is served.
func TestBreakerOnARedisOutage(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"stall", "restart"} {
		for _, callers := range []int{1, 32} {
			t.Run(fault+"/"+strconv.Itoa(callers), func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t)
				lim, err := lua.New(srv.Client(t), lua.WithPrefix("brk"), lua.WithRefusalCache(0))
				if err != nil {
					t.Fatal(err)
				}
				if err := lim.Load(context.Background()); err != nil {
					t.Fatal(err)
				}
				cl := &countingLimiter{Limiter: lim}
				w := &breakerWatch{lim: cl, opened: make(chan struct{}), closed: make(chan struct{})}
				// A deadline that a loaded machine meets while the store is healthy.
				h := mustNew(t, cl, []middleware.Rule{{Rule: rule("api", 1<<40, time.Hour), Identity: global}},
					middleware.WithTimeout(500*time.Millisecond),
					middleware.WithBreaker(middleware.Breaker{OnChange: w.onChange}))(ok)
				if rec := do(h, "GET", "/", nil); rec.Code != 200 {
					t.Fatalf("healthy store: %d", rec.Code)
				}
				if fault == "stall" {
					srv.Freeze(t)
				} else {
					srv.Kill(t)
				}
				stop := load(h, callers)
				waitUntil(t, w.opened, "the breaker opening")
				stop()

				// Open: requests keep coming, none reaches the store, pings go on.
				before, pings := cl.allows.Load(), cl.pings.Load()
				stop = load(h, 1)
				bound := time.After(30 * time.Second)
				for cl.pings.Load() < pings+2 {
					select {
					case <-w.closed:
						t.Fatal("the breaker closed while the store was down")
					case <-bound:
						t.Fatalf("%d pings within 30s of the breaker opening, want 2", cl.pings.Load()-pings)
					case <-time.After(time.Millisecond): // polling the ping count
					}
				}
				if n := cl.allows.Load(); n != before {
					t.Fatalf("%d decisions reached the store while the breaker was open", n-before)
				}
				if fault == "stall" {
					srv.Thaw(t)
				} else {
					srv.Restart(t)
				}
				waitUntil(t, w.closed, "the breaker closing")
				stop()
				if n := w.allowsAtClose.Load(); n != before {
					t.Fatalf("%d decisions reached the store before the breaker closed; want none: a ping closes it", n-before)
				}
				if rec := do(h, "GET", "/", nil); rec.Code != 200 {
					t.Fatalf("after the breaker closed: %d, want 200", rec.Code)
				}
			})
		}
	}
}

// A starved host with a healthy store: some calls are held back until past their
// deadline (as by a process not scheduled in time) and others have their reply read
// late, but replies keep coming: the breaker stays closed, though the calls held back
// alone add up to more than Stall. (The failure ratio is set out of reach: a third of
// the calls fail, more on a loaded machine.)
func TestBreakerStaysClosedOnAStarvedHost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	lim, err := lua.New(client, lua.WithPrefix("starved"), lua.WithRefusalCache(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := lim.Load(context.Background()); err != nil { // each decision is then one EVALSHA
		t.Fatal(err)
	}
	var n atomic.Int64
	client.AddHook(starve{n: &n})
	var opened atomic.Int64
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("api", 1<<40, time.Hour), Identity: global}},
		middleware.WithTimeout(50*time.Millisecond),
		middleware.WithBreaker(middleware.Breaker{Stall: time.Second, OnChange: func(open bool) {
			if open {
				opened.Add(1)
			}
		}}), middleware.WithBreakerTuning(0, 0, 1, 0))(ok)
	codes := map[int]int{}
	for range 90 { // 30 held back, 50ms each: 1.5s without a reply if replies did not count
		codes[do(h, "GET", "/", nil).Code]++
	}
	if opened.Load() != 0 || codes[503] < 30 || codes[200] == 0 || codes[200]+codes[503] != 90 {
		t.Fatalf("breaker opened %d times, answers %v; want 0, and at least 30 x 503 (the calls held back) with the others 200", opened.Load(), codes)
	}
}

// starve holds back every third script call until its context ends and reads the
// reply of the next one only then.
type starve struct{ n *atomic.Int64 }

func (starve) DialHook(next redis.DialHook) redis.DialHook { return next }
func (starve) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (s starve) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			return next(ctx, cmd)
		}
		switch s.n.Add(1) % 3 {
		case 0:
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		case 1:
			err := next(ctx, cmd)
			<-ctx.Done()
			return err
		}
		return next(ctx, cmd)
	}
}
