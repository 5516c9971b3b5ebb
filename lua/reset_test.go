package lua_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestResetSeenByAnotherReplica: two limiters on one Redis (two replicas), both with
// the refusal of a spent budget in their caches. After a reset through one, that one
// admits its next request at once; the other repeats its cached refusal for less than
// 1s of its clock after the refused request, and admits its next request once 1s has
// passed, with the budget's full limit less the one admission since.
func TestResetSeenByAnotherReplica(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for _, each := range []bool{false, true} {
			name := algname.Of(alg)
			if each {
				name += "/AllowEach"
			}
			t.Run(name, func(t *testing.T) {
				prefix := uniquePrefix(t)
				var clockA, clockB atomic.Int64
				replica := func(clock *atomic.Int64) *lua.Limiter {
					return newLimiter(t, client, lua.WithPrefix(prefix), lua.WithRefusalClock(func() time.Duration { return time.Duration(clock.Load()) }))
				}
				a, b := replica(&clockA), replica(&clockB)
				// A 25h window: a cached refusal would otherwise be repeated for a day.
				rule := ratebudget.Rule{Name: "daily", Algorithm: alg, Limit: 5, Window: 25 * time.Hour}
				c := []ratebudget.Check{{Rule: rule, Identity: "tenant-7", Cost: 1}}
				decide := func(l *lua.Limiter) ratebudget.Decision {
					t.Helper()
					var d ratebudget.Decision
					var err error
					if each {
						d, err = l.AllowEach(ctx, c, make([]ratebudget.Outcome, 1))
					} else {
						d, err = l.Allow(ctx, c)
					}
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				for range 5 {
					if d := decide(a); !d.Allowed {
						t.Fatalf("spending: %+v", d)
					}
				}
				for _, l := range []*lua.Limiter{a, a, b, b} {
					if d := decide(l); d.Allowed || d.RetryAfter <= time.Second {
						t.Fatalf("a spent budget: %+v, want a refusal with a long wait", d)
					}
				}
				if err := a.Reset(ctx, ratebudget.Check{Rule: rule, Identity: "tenant-7"}); err != nil {
					t.Fatal(err)
				}
				if d := decide(a); !d.Allowed || d.Remaining != 4 {
					t.Fatalf("the replica that reset: %+v, want admitted with 4 remaining", d)
				}
				// b's refusal was cached at its clock's 0: repeated below 1s, never after.
				clockB.Store(int64(time.Second - time.Millisecond))
				if d := decide(b); d.Allowed || d.RetryAfter <= time.Hour {
					t.Fatalf("the other replica %v after its refusal: %+v, want its cached refusal", time.Second-time.Millisecond, d)
				}
				clockB.Store(int64(time.Second))
				if d := decide(b); !d.Allowed || d.Remaining != 3 {
					t.Fatalf("the other replica 1s after its refusal: %+v, want admitted with 3 remaining (5, less a's and this admission)", d)
				}
			})
		}
	}
}

// TestResetKeys: a reset deletes exactly the budget keys of its checks, of every time
// rule (an in-flight rule's leases included), in one call per hash slot, and no other key.
func TestResetKeys(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, client)
	var checks []ratebudget.Check
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow, ratebudget.InFlight} {
		rule := ratebudget.Rule{Name: "r", Algorithm: alg, Limit: 5, Window: time.Hour}
		for _, id := range []string{"x", "y"} {
			checks = append(checks, ratebudget.Check{Rule: rule, Identity: id, Scope: "/s", Cost: 1})
		}
	}
	for _, c := range checks {
		if d, err := l.Allow(ctx, []ratebudget.Check{c}); err != nil || !d.Allowed {
			t.Fatalf("%+v: %+v, %v", c, d, err)
		}
	}
	var reset, kept []ratebudget.Check
	for i, c := range checks {
		if i%2 == 0 {
			reset = append(reset, c)
		} else {
			kept = append(kept, c)
		}
	}
	if err := l.Reset(ctx, reset...); err != nil {
		t.Fatal(err)
	}
	for _, c := range reset {
		if n := client.Exists(ctx, l.Key(c)).Val(); n != 0 {
			t.Fatalf("%s left after its reset", l.Key(c))
		}
	}
	for _, c := range kept {
		if n := client.Exists(ctx, l.Key(c)).Val(); n != 1 {
			t.Fatalf("%s gone, want it kept", l.Key(c))
		}
	}
}

// TestRefusalCacheAfterFlushAll: after a FLUSHALL, a refusal cached under a 25h rule is
// repeated for less than 1s of the cache's clock after the refused request, reporting
// Redis's wait, and the next request after that is decided by Redis: admitted.
func TestRefusalCacheAfterFlushAll(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	var clock atomic.Int64
	l := newLimiter(t, client, lua.WithRefusalClock(func() time.Duration { return time.Duration(clock.Load()) }))
	rule := ratebudget.Rule{Name: "daily", Limit: 2, Window: 25 * time.Hour}
	c := []ratebudget.Check{{Rule: rule, Identity: "tenant-9", Cost: 1}}
	for range 2 {
		if d, err := l.Allow(ctx, c); err != nil || !d.Allowed {
			t.Fatalf("spending: %+v, %v", d, err)
		}
	}
	if d, err := l.Allow(ctx, c); err != nil || d.Allowed {
		t.Fatalf("a spent budget: %+v, %v", d, err)
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Store(int64(time.Second - time.Millisecond))
	if d, err := l.Allow(ctx, c); err != nil || d.Allowed || d.RetryAfter < 24*time.Hour {
		t.Fatalf("%v after the refusal: %+v, %v; want the cached refusal and Redis's wait", time.Second-time.Millisecond, d, err)
	}
	clock.Store(int64(time.Second))
	if d, err := l.Allow(ctx, c); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("1s after the refusal: %+v, %v; want admitted by Redis with 1 remaining", d, err)
	}
}
