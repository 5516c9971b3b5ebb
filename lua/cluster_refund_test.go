package lua_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestClusterRefundAfterStalledGroup: a decision of two slot groups on two masters
// (a client's in-flight lease and per-client budget on one, a service-wide budget on
// the other) whose second group times out because its master stalls (frozen, as a
// master about to be failed over): the caller gets an uncertain error by its deadline,
// and the first group's spend and lease, on the healthy master, are given back,
// although the caller's deadline is over by then. Otherwise the client, never
// admitted, holds a lease until its TTL (an hour here) and is refused meanwhile.
func TestClusterRefundAfterStalledGroup(t *testing.T) {
	// A node timeout longer than the test: the frozen master is never marked failed, so
	// the healthy one keeps answering.
	cl := redistest.StartClusterWithReplicas(t, 3, 0, time.Minute, "--cluster-require-full-coverage", "no")
	c := cl.Client(t, nil)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	lease := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Hour}
	perClient := ratebudget.Rule{Name: "client", Limit: 10, Window: time.Hour}
	service := ratebudget.Rule{Name: "service", Limit: 1000, Window: time.Hour}
	owner := func(key string) *redistest.Node { return cl.SlotOwner(int(slot(t, c, key))) }
	var checks []ratebudget.Check
	for i := 0; ; i++ {
		id := "uma-" + strconv.Itoa(i)
		checks = []ratebudget.Check{{Rule: lease, Identity: id, Cost: 1}, {Rule: perClient, Identity: id, Cost: 1}, {Rule: service, Cost: 1}}
		if owner(l.Key(checks[0])) != owner(l.Key(checks[2])) {
			break
		}
	}
	healthy := owner(l.Key(checks[0])).Client(t)
	leaseKey, clientKey := l.Key(checks[0]), l.Key(checks[1])
	stalled := owner(l.Key(checks[2]))

	stalled.Freeze(t)
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := l.Allow(dctx, checks)
	cancel()
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || !se.Uncertain {
		t.Fatalf("decision with a stalled master: %v, want an uncertain store error", err)
	}
	// The give-back runs after the decision returned: wait for it, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for {
		leases, lerr := healthy.ZCard(ctx, leaseKey).Result()
		spent, serr := healthy.Get(ctx, clientKey).Int()
		if lerr != nil || serr != nil && serr != redis.Nil {
			t.Fatalf("reading the healthy master: %v, %v", lerr, serr)
		}
		if leases == 0 && spent == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the failed decision, the healthy master still holds %d lease(s) (%v) and a per-client count of %d (%v); want both given back", leases, lerr, spent, serr)
		}
		time.Sleep(20 * time.Millisecond) // polling the healthy master, with the bound above
	}
	stalled.Thaw(t)
	// The stalled master's script (sent before the stall was seen) may run now: the
	// client's own budgets are free again either way.
	d, err := l.Allow(ctx, checks[:2])
	if err != nil || !d.Allowed {
		t.Fatalf("the client's next request: %+v, %v; want admitted", d, err)
	}
}

// TestClusterSettleAfterStalledGroup: a settle of two slot groups on two masters, the
// first one's master stalled: the settle fails by its deadline, and the second group's
// lease, on a healthy master, is released all the same, not held until its TTL because
// the stalled group used up the settle's time.
func TestClusterSettleAfterStalledGroup(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 0, time.Minute, "--cluster-require-full-coverage", "no")
	c := cl.Client(t, nil)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	service := ratebudget.Rule{Name: "service", Limit: 1000, Window: time.Hour}
	lease := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Hour}
	owner := func(key string) *redistest.Node { return cl.SlotOwner(int(slot(t, c, key))) }
	var checks []ratebudget.Check
	for i := 0; ; i++ {
		id := "uma-" + strconv.Itoa(i)
		checks = []ratebudget.Check{{Rule: service, Cost: 1}, {Rule: lease, Identity: id, Cost: 1}}
		if owner(l.Key(checks[0])) != owner(l.Key(checks[1])) {
			break
		}
	}
	tickets := make([]ratebudget.Ticket, 2)
	if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	healthy, leaseKey := owner(l.Key(checks[1])).Client(t), l.Key(checks[1])
	if n, err := healthy.ZCard(ctx, leaseKey).Result(); err != nil || n != 1 {
		t.Fatalf("leases held after Reserve: %d, %v; want 1", n, err)
	}
	owner(l.Key(checks[0])).Freeze(t)
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := l.Settle(sctx, checks, tickets, []int64{0, 1}) // the service spend given back: a call to the stalled master
	cancel()
	var se *ratebudget.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("settle with a stalled master: %v, want a store error", err)
	}
	if n, err := healthy.ZCard(ctx, leaseKey).Result(); err != nil || n != 0 {
		t.Fatalf("leases held on the healthy master after the settle: %d, %v; want 0", n, err)
	}
}
