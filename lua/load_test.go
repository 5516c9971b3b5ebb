package lua_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// scriptsLoaded returns the number of scripts in c's server's script cache.
func scriptsLoaded(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "number_of_cached_scripts:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no number_of_cached_scripts")
	return 0
}

// TestLoad: Load puts both scripts in the server's script cache, so that the first
// decision is a single EVALSHA (no NOSCRIPT, no EVAL); on a Redis Cluster it loads them
// on every master.
func TestLoad(t *testing.T) {
	ctx := context.Background()
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		control := srv.Client(t)
		l := newLimiter(t, c)
		if n := scriptsLoaded(t, control); n != 0 {
			t.Fatalf("%d scripts cached before Load, want 0", n)
		}
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if n := scriptsLoaded(t, control); n != 2 {
			t.Fatalf("%d scripts cached after Load, want 2 (allow.lua and settle.lua)", n)
		}
		before := commandStats(t, control)
		chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}, Identity: "ann", Cost: 1}}
		if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
		if delta := commandStats(t, control).sub(before); delta.calls["evalsha"] != 1 || delta.calls["eval"] != 0 {
			t.Fatalf("first decision after Load ran %v evalsha, %v eval; want one evalsha", delta.calls["evalsha"], delta.calls["eval"])
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c, nodes := redistest.StartCluster(t, 3)
		l := newLimiter(t, c)
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		for i, m := range masters(t, nodes) {
			if n := scriptsLoaded(t, m); n != 2 {
				t.Fatalf("master %d holds %d scripts after Load, want 2", i, n)
			}
		}
	})
	t.Run("store down", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		l := newLimiter(t, c)
		srv.Kill(t)
		var se *ratebudget.StoreError
		if err := l.Load(ctx); !errors.As(err, &se) {
			t.Fatalf("Load with the server gone: %v, want a StoreError", err)
		}
	})
}

// TestReturnsByDeadline: on a hung server (SIGSTOP), a decision returns by its
// context's deadline with an uncertain timeout, on the caller's goroutine and through
// the pipeline alike, however long the client's own ReadTimeout (a minute here).
func TestReturnsByDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { c.Close() })
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Freeze(t)
	const callers = 8
	type res struct {
		err  error
		took time.Duration
	}
	out := make(chan res, callers)
	for i := range callers {
		go func() {
			dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := l.Allow(dctx, []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}, Identity: strconv.Itoa(i), Cost: 1}})
			out <- res{err, time.Since(start)}
		}()
	}
	for range callers {
		r := <-out
		var se *ratebudget.StoreError
		if !errors.As(r.err, &se) || se.Class != ratebudget.ClassTimeout || !se.Uncertain {
			t.Fatalf("decision on a hung server: %v, want an uncertain timeout", r.err)
		}
		// Far short of the client's ReadTimeout: the context bounded the wait.
		if r.took > 20*time.Second {
			t.Fatalf("decision took %v on a hung server with a 100ms deadline", r.took)
		}
	}
}

// TestKeyed: a limiter with a key secret keeps its budgets under other keys than a
// limiter without one.
func TestKeyed(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	plain, err := lua.New(c)
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := lua.New(c, lua.WithKeySecret([]byte("0123456789abcdef")))
	if err != nil {
		t.Fatal(err)
	}
	chk := ratebudget.Check{Rule: ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}, Identity: "ann"}
	if plain.Key(chk) == keyed.Key(chk) {
		t.Fatalf("key %q does not depend on the secret", plain.Key(chk))
	}
}
