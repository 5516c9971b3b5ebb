package lua_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestCluster runs the limiter on a three-master Redis Cluster through
// *redis.ClusterClient (pipelining included): the conformance suite, the state
// invariants and the same answers as the in-process limiter under random decisions,
// contention for budgets spread over the masters, and a request whose rules live in
// different slots.
func TestCluster(t *testing.T) {
	c, nodes := redistest.StartCluster(t, 3)
	ctx := context.Background()

	t.Run("Conformance", func(t *testing.T) {
		limitertest.Run(t, func(t *testing.T) limitertest.Harness {
			l := newLimiter(t, c)
			return limitertest.Harness{Limiter: l}
		})
	})

	// Refunds across masters: the state invariants of TestStateInvariants, with 8
	// callers, audited on every master.
	t.Run("StateInvariants", func(t *testing.T) {
		w := newWalk(t, c, masters(t, nodes), lua.WithRefusalCache(0))
		w.concurrently(8, 250)
		w.covered(100, 20)
	})

	// Slot by slot across masters, with refunds: the answers of TestSameDecisionsAsMemory.
	t.Run("SameDecisionsAsMemory", func(t *testing.T) {
		sameDecisions(t, walkOptions{}, masters(t, nodes), []namedLimiter{{"cluster", newLimiter(t, c, lua.WithRefusalCache(0))}})
	})

	t.Run("ContentionAcrossMasters", func(t *testing.T) {
		prefix := uniquePrefix(t)
		l, err := lua.New(c, lua.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		rule := ratebudget.Rule{Name: "c", Limit: 5, Window: time.Minute}
		const identities, callers = 12, 16
		admitted := make([]int, identities)
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for id := range identities {
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					d, err := l.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "id-" + strconv.Itoa(id), Cost: 1}})
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						admitted[id]++
						mu.Unlock()
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		for id, n := range admitted {
			if n != 5 {
				t.Errorf("identity %d: %d admitted, want exactly 5", id, n)
			}
		}
		// The budgets really are spread over the masters.
		masters := map[string]bool{}
		for id := range identities {
			key := l.Key(ratebudget.Check{Rule: rule, Identity: "id-" + strconv.Itoa(id), Cost: 1})
			for i, n := range nodes {
				if n.Client(t).Exists(ctx, key).Val() == 1 {
					masters[strconv.Itoa(i)] = true
				}
			}
		}
		if len(masters) < 2 {
			t.Fatalf("%d identities' budgets all on %d master(s); the test proves nothing about a cluster", identities, len(masters))
		}
	})

	t.Run("RulesInDifferentSlots", func(t *testing.T) {
		prefix := uniquePrefix(t)
		l, err := lua.New(c, lua.WithPrefix(prefix), lua.WithRefusalCache(0))
		if err != nil {
			t.Fatal(err)
		}
		perClient := ratebudget.Rule{Name: "client", Limit: 10, Window: time.Minute}
		service := ratebudget.Rule{Name: "service", Limit: 3, Window: time.Minute}
		checks := func(client string) []ratebudget.Check {
			return []ratebudget.Check{{Rule: perClient, Identity: client, Cost: 1}, {Rule: service, Cost: 1}}
		}
		k0 := l.Key(checks("c0")[0])
		ks := l.Key(checks("c0")[1])
		if slot(t, c, k0) == slot(t, c, ks) {
			t.Fatalf("the two rules share a slot (%d): pick another identity", slot(t, c, k0))
		}
		for i := range 5 {
			client := "c" + strconv.Itoa(i)
			d, err := l.Allow(ctx, checks(client))
			if err != nil {
				t.Fatal(err)
			}
			want := i < 3
			if d.Allowed != want {
				t.Fatalf("client %d: allowed %v, want %v (%+v)", i, d.Allowed, want, d)
			}
			if !want && d.Rule != "service" {
				t.Fatalf("client %d refused by %q, want the service rule", i, d.Rule)
			}
			// A refused request spends nothing: the per-client spend was refunded.
			n, err := c.Get(ctx, l.Key(checks(client)[0])).Int()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			if wantN := map[bool]int{true: 1, false: 0}[want]; n != wantN {
				t.Fatalf("client %d: per-client counter %d after the decision, want %d", i, n, wantN)
			}
		}
		if n, _ := c.Get(ctx, ks).Int(); n != 3 {
			t.Fatalf("service counter %d, want 3", n)
		}
	})
}

// TestClusterCoalesced: with coalescing, 200 clients at once against a service-wide
// budget of 50 in another slot than their own budgets: exactly 50 are admitted, and
// the refused requests' per-client spend is given back.
func TestClusterCoalesced(t *testing.T) {
	c, _ := redistest.StartCluster(t, 3)
	ctx := context.Background()
	l, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)), lua.WithRefusalCache(0), lua.WithCoalescing(256))
	if err != nil {
		t.Fatal(err)
	}
	perClient := ratebudget.Rule{Name: "client", Limit: 10, Window: time.Minute}
	service := ratebudget.Rule{Name: "service", Limit: 50, Window: time.Minute}
	checks := func(client string) []ratebudget.Check {
		return []ratebudget.Check{{Rule: perClient, Identity: client, Cost: 1}, {Rule: service, Cost: 1}}
	}
	exactLimitAcrossClients(t, l, c, checks, 0)
	if n, err := c.Get(ctx, l.Key(checks("")[1])).Int(); err != nil || n != 50 {
		t.Fatalf("service counter %d, %v; want 50", n, err)
	}
}

func slot(t *testing.T, c *redis.ClusterClient, key string) int64 {
	t.Helper()
	s, err := c.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// masters returns a client of each node.
func masters(t *testing.T, nodes []*redistest.Server) []*redis.Client {
	var cs []*redis.Client
	for _, n := range nodes {
		cs = append(cs, n.Client(t))
	}
	return cs
}
