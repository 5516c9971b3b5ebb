package lua_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/lua"
)

// TestKeyspaceLeftBehind: a random workload over every time rule and every path that
// writes (Allow, AllowEach, Reserve, then Settle below, at, above the reservation or
// cancelled, Renew, leases left to expire, refunds of slot groups, costs above the
// capacity, rules of one name with lowered limits), for hostile identities and scopes.
// After every step each key under the limiter's prefix must have a TTL within its
// rule's bound (a window; a token bucket's time to refill two capacities, its deepest
// debt), and once the workload stops the keyspace must empty by itself.
func TestKeyspaceLeftBehind(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		c := redistest.Start(t).Client(t)
		runKeyspace(t, c, []*redis.Client{c}, 900)
	})
	t.Run("one-server", func(t *testing.T) {
		c := redistest.Start(t).Client(t)
		runKeyspace(t, c, []*redis.Client{c}, 600, lua.WithOneServer())
	})
	t.Run("cluster", func(t *testing.T) {
		c, nodes := redistest.StartCluster(t, 3)
		runKeyspace(t, c, masters(t, nodes), 600)
	})
}

// keyspaceFamily is one rule name: the rule and its variants of lowered limits.
type keyspaceFamily struct {
	variants []ratebudget.Rule
	bound    time.Duration // the longest TTL any variant may give a key
}

func ttlBound(r ratebudget.Rule) time.Duration {
	if r.Algorithm == ratebudget.TokenBucket {
		// Up to two capacities of deficit (debt from a settle above its reservation),
		// refilled at Limit per Window.
		return time.Duration((2*timerule.Capacity(&r)*r.Window.Milliseconds()+r.Limit-1)/r.Limit) * time.Millisecond
	}
	return r.Window
}

func runKeyspace(t *testing.T, c redis.Scripter, servers []*redis.Client, steps int, opts ...lua.Option) {
	ctx := context.Background()
	prefix := uniquePrefix(t)
	l, err := lua.New(c, append([]lua.Option{lua.WithPrefix(prefix), lua.WithRefusalCache(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("{x}:\x00", 20_000)
	ids := []string{"", "{", "}", "{}", "a:b", "\x00", "\xff\xfe\xfd", long, "{" + long, "plain"}
	scopes := []string{"", "{s}", "/a:b", "\x00\xff", long}
	var fams []keyspaceFamily
	bound := map[string]time.Duration{}
	for _, win := range []time.Duration{50 * time.Millisecond, 120 * time.Millisecond, 200 * time.Millisecond} {
		name := func(a ratebudget.Algorithm) string { return fmt.Sprintf("%v-%d", a, win.Milliseconds()) }
		for _, f := range [][]ratebudget.Rule{
			{{Algorithm: ratebudget.FixedWindow, Limit: 6}, {Algorithm: ratebudget.FixedWindow, Limit: 2}},
			{{Algorithm: ratebudget.TokenBucket, Limit: 6}, {Algorithm: ratebudget.TokenBucket, Limit: 2}, {Algorithm: ratebudget.TokenBucket, Limit: 3, Burst: 9}},
			{{Algorithm: ratebudget.RollingWindow, Limit: 6}, {Algorithm: ratebudget.RollingWindow, Limit: 2}},
			{{Algorithm: ratebudget.InFlight, Limit: 4}, {Algorithm: ratebudget.InFlight, Limit: 1}},
		} {
			fam := keyspaceFamily{}
			for _, r := range f {
				r.Name, r.Window = name(r.Algorithm), win
				if err := r.Validate(); err != nil {
					t.Fatal(err)
				}
				fam.variants = append(fam.variants, r)
				fam.bound = max(fam.bound, ttlBound(r))
			}
			fams = append(fams, fam)
			for _, id := range ids {
				for _, sc := range scopes {
					bound[l.Key(ratebudget.Check{Rule: fam.variants[0], Identity: id, Scope: sc})] = fam.bound
				}
			}
		}
	}
	if len(bound) != len(fams)*len(ids)*len(scopes) {
		t.Fatalf("%d distinct keys for %d budgets", len(bound), len(fams)*len(ids)*len(scopes))
	}

	rng := rand.New(rand.NewPCG(3, 4))
	draw := func() []ratebudget.Check {
		n := 1 + rng.IntN(3)
		var checks []ratebudget.Check
		seen := map[string]bool{}
		for len(checks) < n {
			fam := fams[rng.IntN(len(fams))]
			r := fam.variants[rng.IntN(len(fam.variants))]
			// Most checks go to a few budgets, so that they fill and refuse.
			id, sc := ids[rng.IntN(3)], scopes[rng.IntN(2)]
			if rng.IntN(3) == 0 {
				id, sc = ids[rng.IntN(len(ids))], scopes[rng.IntN(len(scopes))]
			}
			ch := ratebudget.Check{Rule: r, Identity: id, Scope: sc, Cost: 1}
			if r.Algorithm != ratebudget.InFlight {
				ch.Cost = 1 + rng.Int64N(3)
				if rng.IntN(50) == 0 {
					ch.Cost = timerule.Capacity(&r) + 1
				}
			}
			if k := l.Key(ch); !seen[k] {
				seen[k] = true
				checks = append(checks, ch)
			}
		}
		return checks
	}
	type reserved struct {
		checks  []ratebudget.Check
		tickets []ratebudget.Ticket
	}
	var pending []reserved
	var stats struct{ allowed, refused, exceeded, settled, renewed, lost int }
	maxTTL := map[ratebudget.Algorithm]time.Duration{}
	count := func(d ratebudget.Decision) {
		switch {
		case d.Allowed:
			stats.allowed++
		case d.Exceeded:
			stats.exceeded++
		default:
			stats.refused++
		}
	}
	markers := 0 // seen by the last audit
	audit := func(step int) int {
		keys := 0
		markers = 0
		for _, srv := range servers {
			var all []string
			iter := srv.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			for iter.Next(ctx) {
				all = append(all, iter.Val())
			}
			if err := iter.Err(); err != nil {
				t.Fatal(err)
			}
			pipe := srv.Pipeline()
			cmds := make([]*redis.DurationCmd, len(all))
			for i, k := range all {
				cmds[i] = pipe.PTTL(ctx, k)
			}
			if len(all) > 0 {
				if _, err := pipe.Exec(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for i, k := range all {
				b, ok := bound[k]
				if strings.Contains(k, "}:~r:") {
					// A reservation's marker, or a tombstone: at most lua.MarkerTTL.
					if p := cmds[i].Val(); p != -2*time.Nanosecond && (p < 0 || p > lua.MarkerTTL) {
						t.Fatalf("step %d: marker %q has PTTL %v, want (0, %v]", step, k, p, lua.MarkerTTL)
					}
					markers++
					continue
				}
				if !ok {
					t.Fatalf("step %d: unexpected key %q", step, k)
				}
				p := cmds[i].Val()
				if p == -2*time.Nanosecond {
					continue // expired since the scan
				}
				if p < 0 || p > b {
					t.Fatalf("step %d: key %q has PTTL %v, want (0, %v]", step, k, p, b)
				}
				keys++
				for _, f := range fams {
					if strings.Contains(k, "}:"+f.variants[0].Name+":") {
						maxTTL[f.variants[0].Algorithm] = max(maxTTL[f.variants[0].Algorithm], p)
					}
				}
			}
		}
		return keys
	}

	covered := func() bool {
		return stats.allowed >= steps/4 && stats.refused >= steps/20 && stats.exceeded > 0 && stats.settled >= steps/20 && stats.renewed > 0
	}
	most := 0
	// steps steps, then on until every path was taken: on a loaded machine windows of
	// 50-200 ms end between slow steps, and budgets fill (and refuse) less often.
	for step := 0; step < steps || !covered() && step < 5*steps; step++ {
		switch op := rng.IntN(10); {
		case op < 3:
			d, err := l.Allow(ctx, draw())
			if err != nil {
				t.Fatalf("step %d: Allow: %v", step, err)
			}
			count(d)
		case op < 4:
			checks := draw()
			outs := make([]ratebudget.Outcome, len(checks))
			d, err := l.AllowEach(ctx, checks, outs)
			if err != nil {
				t.Fatalf("step %d: AllowEach: %v", step, err)
			}
			count(d)
		case op < 7:
			checks := draw()
			tickets := make([]ratebudget.Ticket, len(checks))
			d, err := l.Reserve(ctx, checks, tickets, nil)
			if err != nil {
				t.Fatalf("step %d: Reserve: %v", step, err)
			}
			count(d)
			if d.Allowed {
				pending = append(pending, reserved{checks, tickets})
			}
		case op < 9 && len(pending) > 0:
			i := rng.IntN(len(pending))
			p := pending[i]
			pending = append(pending[:i], pending[i+1:]...)
			var costs []int64
			if rng.IntN(5) > 0 {
				costs = make([]int64, len(p.checks))
				for j, ch := range p.checks {
					costs[j] = []int64{0, max(0, ch.Cost-1), ch.Cost, ch.Cost + 2, 3 * ch.Cost, 2 * timerule.Capacity(&ch.Rule)}[rng.IntN(6)]
				}
			}
			if err := l.Settle(ctx, p.checks, p.tickets, costs); err != nil {
				t.Fatalf("step %d: Settle: %v", step, err)
			}
			stats.settled++
		case len(pending) > 0:
			p := pending[rng.IntN(len(pending))]
			switch err := l.Renew(ctx, p.checks, p.tickets); {
			case errors.Is(err, ratebudget.ErrLeaseLost):
				stats.lost++
			case err != nil:
				t.Fatalf("step %d: Renew: %v", step, err)
			default:
				stats.renewed++
			}
		}
		if len(pending) > 30 {
			pending = pending[10:] // never settled: their leases expire
		}
		most = max(most, audit(step))
	}
	t.Logf("%+v; most keys at once %d; longest PTTL seen per rule: %v", stats, most, maxTTL)
	if !covered() {
		t.Fatalf("the workload did not cover every path in %d steps: %+v", 5*steps, stats)
	}

	// The keyspace empties by itself: poll until no budget key is left. The markers of
	// reservations never settled, or settled at their reserved cost (no call), expire
	// within lua.MarkerTTL, as the audit checks.
	start := time.Now()
	for audit(steps) > 0 {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("keys left 30s after the last decision")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("keyspace empty %v after the last decision, but for %d markers", time.Since(start).Round(time.Millisecond), markers)
}
