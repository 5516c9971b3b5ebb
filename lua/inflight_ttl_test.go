package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/memory"
)

// TestInFlightShortenedLeaseTTL: an in-flight rule whose Window (the lease's time to
// live) is shortened under the same name gives its leases the new TTL, on Redis as in
// the in-process engine, while leases taken under the old TTL are held: a lease taken or
// renewed under the short rule expires within its Window, not with the newest lease of
// the long rule, and the key's TTL still covers that lease. The long lease is then
// released, so that the short one is the newest and ResetAfter reports its expiry.
func TestInFlightShortenedLeaseTTL(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c)
	clock := limitertest.NewFakeClock(time.Unix(1_700_000_000, 0))
	mem, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(ttl time.Duration) ratebudget.Rule {
		return ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 3, Window: ttl}
	}
	long, short := rule(time.Hour), rule(10*time.Second)
	for _, lim := range []namedLimiter{{"memory", mem}, {"redis", l}} {
		t.Run(lim.name, func(t *testing.T) {
			s := lim.l.(limitertest.Settler)
			for _, renewed := range []bool{false, true} {
				id := map[bool]string{false: "taken", true: "renewed"}[renewed]
				check := func(r ratebudget.Rule) []ratebudget.Check {
					return []ratebudget.Check{{Rule: r, Identity: id, Cost: 1}}
				}
				var old, lease [1]ratebudget.Ticket
				if d, err := s.Reserve(ctx, check(long), old[:], nil); err != nil || !d.Allowed {
					t.Fatalf("the long lease: %+v, %v", d, err)
				}
				if d, err := s.Reserve(ctx, check(short), lease[:], nil); err != nil || !d.Allowed {
					t.Fatalf("the short lease: %+v, %v", d, err)
				}
				if renewed {
					if err := s.Renew(ctx, check(short), lease[:]); err != nil {
						t.Fatal(err)
					}
				}
				if err := s.Settle(ctx, check(long), old[:], nil); err != nil {
					t.Fatal(err)
				}
				var o [1]ratebudget.Outcome
				d, err := lim.l.(limitertest.Reporter).AllowEach(ctx, check(short), o[:])
				if err != nil || !d.Allowed || d.Remaining != 1 {
					t.Fatalf("%s: a lease next to the short one: %+v, %v; want admitted, 1 remaining", id, d, err)
				}
				// Now two short leases: the newest expires 10s from now.
				if d.ResetAfter > short.Window {
					t.Errorf("%s: ResetAfter %v with short leases only, want at most %v", id, d.ResetAfter, short.Window)
				}
				if lim.name == "redis" {
					key := l.Key(check(short)[0])
					if p := c.PTTL(ctx, key).Val(); p <= 0 || p > short.Window {
						t.Errorf("%s: key's PTTL %v, want within the short TTL %v", id, p, short.Window)
					}
				}
			}
		})
	}
}
