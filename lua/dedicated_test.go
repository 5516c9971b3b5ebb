package lua_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/israce"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

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

func dedicated(t *testing.T, c lua.Client, opts ...lua.Option) *lua.Limiter {
	t.Helper()
	return newLimiter(t, c, append([]lua.Option{lua.WithDedicatedConnection()}, opts...)...)
}

// TestConformanceDedicated runs the shared suite over the dedicated connection.
func TestConformanceDedicated(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		return limitertest.Harness{Limiter: dedicated(t, client)}
	})
}

// TestDedicatedExactUnderContention: 64 callers on one dedicated connection admit
// exactly the limit, and the budget in Redis says so.
func TestDedicatedExactUnderContention(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	l := dedicated(t, client, lua.WithoutRefusalCache())
	if !l.BoundByContext() {
		t.Fatal("a dedicated connection must report BoundByContext")
	}
	const callers, each, limit = 64, 20, 500
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: limit, Window: time.Minute}, Identity: "ann", Cost: 1}}
	admitted := admitConcurrently(t, l, chk, callers, each)
	if admitted != limit {
		t.Fatalf("admitted %d of %d, want exactly %d", admitted, callers*each, limit)
	}
	if v, err := client.Get(context.Background(), l.Key(chk[0])).Int(); err != nil || v != limit {
		t.Fatalf("counter in Redis: %d, %v, want %d", v, err, limit)
	}
}

// TestDedicatedScriptFlush: after SCRIPT FLUSH the next decision loads the script
// (EVAL after NOSCRIPT) and decides normally.
func TestDedicatedScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	l := dedicated(t, client)
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 2, Window: time.Minute}, Identity: "ann", Cost: 1}}
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		if i == 1 {
			if err := client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		d, err := l.Allow(ctx, chk)
		if err != nil || d.Allowed != want {
			t.Fatalf("decision %d: %+v, %v, want allowed=%v", i, d, err, want)
		}
	}
}

// TestDedicatedUsesClientSettings: the connection authenticates as the client's user
// and selects the client's database.
func TestDedicatedUsesClientSettings(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "acl", "setuser", "limiter", "on", ">pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw", DB: 5, MaxRetries: -1})
	defer c.Close()
	l := dedicated(t, c)
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}, Identity: "ann", Cost: 1}}
	if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	if v, err := c.Get(ctx, l.Key(chk[0])).Result(); err != nil || v != "1" {
		t.Fatalf("counter in DB 5: %q, %v", v, err)
	}
	if n := admin.Exists(ctx, l.Key(chk[0])).Val(); n != 0 {
		t.Fatal("the counter was written to DB 0")
	}
	// A credentials provider is asked at each dial.
	var asked atomic.Int32
	cp := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1,
		CredentialsProviderContext: func(context.Context) (string, string, error) {
			asked.Add(1)
			return "limiter", "pw", nil
		}})
	defer cp.Close()
	lp := dedicated(t, cp)
	if d, err := lp.Allow(ctx, chk); err != nil || !d.Allowed {
		t.Fatalf("Allow with a credentials provider: %+v, %v", d, err)
	}
	if asked.Load() == 0 {
		t.Fatal("the credentials provider was not asked")
	}
}

// TestDedicatedNeedsPlainClient: the option is refused at construction for a client it
// cannot serve, naming itself.
func TestDedicatedNeedsPlainClient(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	_, err := lua.New(cc, lua.WithDedicatedConnection())
	var ce *ratebudget.ConfigError
	if !errors.As(err, &ce) || ce.Field != "WithDedicatedConnection" || !strings.Contains(err.Error(), "*redis.ClusterClient") {
		t.Fatalf("cluster client: %v, want a ConfigError naming WithDedicatedConnection and the type", err)
	}
}

// TestDedicatedStoreErrors: the failures of a dedicated connection are classified like
// the client's: a frozen server is an uncertain timeout (with a context deadline, or
// with AllowWithin's timeout, through either transport), a killed one a connection
// error, a refused dial a certain one, and Close a certain one.
func TestDedicatedStoreErrors(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	l := dedicated(t, client)
	pooled := newLimiter(t, client)
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 100, Window: time.Minute}, Identity: "ann", Cost: 1}}
	for _, lim := range []*lua.Limiter{l, pooled} {
		if _, err := lim.Allow(context.Background(), chk); err != nil {
			t.Fatal(err)
		}
	}
	class := func(ctx context.Context) (string, bool) {
		_, err := l.Allow(ctx, chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) {
			t.Fatalf("Allow = %v, want a StoreError", err)
		}
		return se.Class, se.Uncertain
	}

	srv.Freeze(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if c, u := class(ctx); c != "timeout" || !u {
		t.Errorf("frozen: %s uncertain=%v, want an uncertain timeout", c, u)
	}
	cancel()
	// AllowWithin bounds the call by its timeout alone (no context deadline).
	for _, lim := range []*lua.Limiter{l, pooled} {
		_, err := lim.AllowWithin(context.Background(), 100*time.Millisecond, chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != "timeout" || !se.Uncertain {
			t.Errorf("frozen, AllowWithin: %v, want an uncertain timeout", err)
		}
	}
	srv.Thaw(t)
	if d, err := l.Allow(context.Background(), chk); err != nil || !d.Allowed {
		t.Fatalf("after thaw: %+v, %v", d, err)
	}

	srv.Kill(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, u := class(context.Background())
		if c != "connection" {
			t.Fatalf("killed: class %s, want connection", c)
		}
		if !u {
			break // a refused dial: nothing was sent
		}
		if time.Now().After(deadline) {
			t.Fatal("no certain dial error after the kill")
		}
	}
	l.Close()
	if c, u := class(context.Background()); c != "connection" || u {
		t.Errorf("closed: %s uncertain=%v, want a certain connection error", c, u)
	}
}

// TestDedicatedOneCommandPerDecision: over the dedicated connection too, a decision of
// three rules of one identity is exactly one EVALSHA on the server (counted with INFO
// commandstats from another client), and a flood of refused requests barely reaches it.
func TestDedicatedOneCommandPerDecision(t *testing.T) {
	srv := redistest.Start(t)
	control := srv.Client(t)
	ctx := context.Background()
	l := dedicated(t, control)
	rule := func(name string, alg ratebudget.Algorithm) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: 1 << 30, Window: time.Minute}
	}
	var checks []ratebudget.Check
	for _, r := range []ratebudget.Rule{rule("f", ratebudget.FixedWindow), rule("t", ratebudget.TokenBucket), rule("r", ratebudget.RollingWindow)} {
		checks = append(checks, ratebudget.Check{Rule: r, Identity: "ann", Cost: 1})
	}
	if _, err := l.Allow(ctx, checks); err != nil { // loads the script
		t.Fatal(err)
	}
	before := commandStats(t, control)
	const decisions = 200
	for range decisions {
		if d, err := l.Allow(ctx, checks); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	delta := commandStats(t, control).sub(before)
	if delta.calls["evalsha"] != decisions || delta.calls["eval"] != 0 {
		t.Fatalf("server ran %v evalsha and %v eval for %d decisions, want exactly %d evalsha",
			delta.calls["evalsha"], delta.calls["eval"], decisions, decisions)
	}

	// A refused budget: after the first refusal the refusal cache answers.
	refused := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "tight", Limit: 1, Window: time.Minute}, Identity: "mallory", Cost: 1}}
	before = commandStats(t, control)
	const flood = 1000
	admitted := 0
	for range flood {
		d, err := l.Allow(ctx, refused)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	delta = commandStats(t, control).sub(before)
	if admitted != 1 || delta.calls["evalsha"] > 2 {
		t.Fatalf("flood: %d admitted, %v script calls for %d requests, want 1 admitted and at most 2 calls",
			admitted, delta.calls["evalsha"], flood)
	}
	t.Logf("flood of %d requests: %v script calls (%.4f per request)", flood, delta.calls["evalsha"], delta.calls["evalsha"]/flood)
}

// TestDedicatedDecisionAllocs: once warm, a decision over the dedicated connection
// allocates nothing, for one check or for three in one slot: keys go out from the
// scratch buffer, numbers by pointer, and the reply is read into reused integers.
func TestDedicatedDecisionAllocs(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates; make test runs this without it")
	}
	srv := redistest.Start(t)
	l := dedicated(t, srv.Client(t))
	rule := func(name string, alg ratebudget.Algorithm) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: 1 << 30, Window: time.Minute}
	}
	for _, tc := range []struct {
		name  string
		rules []ratebudget.Rule
	}{
		{"fixed", []ratebudget.Rule{rule("f", ratebudget.FixedWindow)}},
		{"token", []ratebudget.Rule{rule("t", ratebudget.TokenBucket)}},
		{"rolling", []ratebudget.Rule{rule("r", ratebudget.RollingWindow)}},
		{"3mixed", []ratebudget.Rule{rule("f", ratebudget.FixedWindow), rule("t", ratebudget.TokenBucket), rule("r", ratebudget.RollingWindow)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := make([]ratebudget.Check, len(tc.rules))
			for i, r := range tc.rules {
				checks[i] = ratebudget.Check{Rule: r, Identity: "allocs-" + tc.name, Cost: 1}
			}
			ctx := context.Background()
			admitted, failed := 0, 0
			allocs := testing.AllocsPerRun(200, func() {
				d, err := l.Allow(ctx, checks)
				if err != nil {
					failed++
				} else if d.Allowed {
					admitted++
				}
			})
			if failed > 0 || admitted != 201 { // AllocsPerRun makes one warm-up call
				t.Fatalf("%d of 201 decisions admitted, %d failed", admitted, failed)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per decision, want 0", allocs)
			}
		})
	}
}

// TestCoalescedAndOneServerAllocs: over the dedicated connection, a decision through the
// coalescer (with nothing to group) and one of two identities' rules in one call under
// WithOneServer allocate nothing either.
func TestCoalescedAndOneServerAllocs(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates; make test runs this without it")
	}
	srv := redistest.Start(t)
	client := srv.Client(t)
	rule := func(name string) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Limit: 1 << 30, Window: time.Minute}
	}
	for _, tc := range []struct {
		name   string
		opts   []lua.Option
		checks []ratebudget.Check
	}{
		{"coalesced", []lua.Option{lua.WithCoalescing(64)}, []ratebudget.Check{{Rule: rule("f"), Identity: "ann", Cost: 1}}},
		{"one server, two identities", []lua.Option{lua.WithOneServer()}, []ratebudget.Check{{Rule: rule("client"), Identity: "ann", Cost: 1}, {Rule: rule("service"), Cost: 1}}},
		{"both", []lua.Option{lua.WithOneServer(), lua.WithCoalescing(64)}, []ratebudget.Check{{Rule: rule("client"), Identity: "bob", Cost: 1}, {Rule: rule("service"), Cost: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := dedicated(t, client, tc.opts...)
			ctx := context.Background()
			failed := 0
			allocs := testing.AllocsPerRun(200, func() {
				if d, err := l.Allow(ctx, tc.checks); err != nil || !d.Allowed {
					failed++
				}
			})
			if failed > 0 {
				t.Fatalf("%d of 201 decisions failed or were refused", failed)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per decision, want 0", allocs)
			}
		})
	}
}
