package lua_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// evalInts runs src and returns its integer reply.
func evalInts(t *testing.T, c *redis.Client, src string, keys []string, args ...any) []int64 {
	t.Helper()
	v, err := c.Eval(context.Background(), src, keys, args...).Result()
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	var out []int64
	for _, x := range v.([]any) {
		out = append(out, x.(int64))
	}
	return out
}

// TestLeaseRulesOnRawState: leases as allow.lua and settle.lua keep them, from a
// hand-written state where a lease has expired untrimmed and the newest lease lies
// beyond now + ttl (the clock went back, or the lease was taken under a longer ttl of
// the rule's name). An expired lease is neither counted nor renewed; a new lease and a
// renewal expire ttl from now, and the key with its newest lease; a second release of a
// lease releases nothing.
func TestLeaseRulesOnRawState(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	key := "{k}:l:inflight"
	now := serverMillis(t, c)
	ahead := now + 600000 // ten minutes past now + ttl
	if err := c.ZAdd(ctx, key, redis.Z{Score: float64(now - 1000), Member: "aa"}, redis.Z{Score: float64(ahead), Member: "bb"}).Err(); err != nil {
		t.Fatal(err)
	}
	const ttl = 10000
	lease := func(member string) []any { return []any{"3", "2", ttl, "2", "1", member} }
	renew := func(member string) []any { return []any{"renew", 3, 2, ttl, 2, 0, 0, 0, 0, member} }
	release := func(member string) []any { return []any{"settle", 3, 2, ttl, 2, 0, 0, 0, 0, member} }

	// The expired lease is not renewed, and keeps its score.
	if r := evalInts(t, c, lua.SettleSource, []string{key}, renew("aa")...); r[0] != 0 {
		t.Fatalf("renewal of an expired lease replied %v, want [0]", r)
	}
	if s := c.ZScore(ctx, key, "aa").Val(); s != float64(now-1000) {
		t.Fatalf("expired lease's score %v after a renewal, want %d", s, now-1000)
	}
	// Mode 1: the expired lease is trimmed and not counted; the new lease expires at
	// now + ttl (the server's clock moves while the test runs: within 5s of it), before
	// the newest, and the key with the newest.
	r := evalInts(t, c, lua.AllowSource, []string{key}, append([]any{"2"}, lease("cc")...)...)
	if r[0] != 1 || r[2] != 0 || r[6] < now+ttl || r[6] > now+ttl+5000 || r[3] > ahead-now {
		t.Fatalf("lease beside one live lease: %v; want admitted, 0 remaining, ticket about %d, reset at most %d", r, now+ttl, ahead-now)
	}
	cc := r[6]
	if n := c.ZCard(ctx, key).Val(); n != 2 {
		t.Fatalf("%d leases, want 2 (the expired one trimmed)", n)
	}
	if s := c.ZScore(ctx, key, "cc").Val(); s != float64(cc) {
		t.Fatalf("new lease's expiry %v, want its ticket's %d", s, cc)
	}
	if pt := c.PExpireTime(ctx, key).Val().Milliseconds(); pt != ahead {
		t.Fatalf("PEXPIRETIME %d, want the newest expiry %d", pt, ahead)
	}
	// Full: refused, retry until the oldest live lease (the new one) expires.
	r = evalInts(t, c, lua.AllowSource, []string{key}, append([]any{"1"}, lease("dd")...)...)
	if r[0] != 0 || r[2] != 0 || r[4] <= 0 || r[4] > ttl {
		t.Fatalf("third lease of 2: %v; want refused, retry at most %d", r, ttl)
	}
	// A renewal moves the lease to ttl from now, and the key keeps the newest expiry.
	if r := evalInts(t, c, lua.SettleSource, []string{key}, renew("cc")...); r[0] != 1 {
		t.Fatalf("renewal of a live lease replied %v, want [1]", r)
	}
	if s := int64(c.ZScore(ctx, key, "cc").Val()); s < cc || s > now+ttl+5000 {
		t.Fatalf("renewed lease's expiry %d, want %d to %d", s, cc, now+ttl+5000)
	}
	if pt := c.PExpireTime(ctx, key).Val().Milliseconds(); pt != ahead {
		t.Fatalf("PEXPIRETIME %d, want the newest expiry %d", pt, ahead)
	}
	// Released twice: the second releases nothing.
	if r := evalInts(t, c, lua.SettleSource, []string{key}, release("cc")...); r[0] != 1 {
		t.Fatalf("release replied %v, want [1]", r)
	}
	if r := evalInts(t, c, lua.SettleSource, []string{key}, release("cc")...); r[0] != 0 {
		t.Fatalf("second release replied %v, want [0]", r)
	}
	if n := c.ZCard(ctx, key).Val(); n != 1 {
		t.Fatalf("%d leases after the releases, want 1", n)
	}
	// A released lease is not renewed either.
	if r := evalInts(t, c, lua.SettleSource, []string{key}, renew("cc")...); r[0] != 0 || c.ZScore(ctx, key, "cc").Err() != redis.Nil {
		t.Fatalf("renewal of a released lease replied %v, want [0] and no lease", r)
	}
}

// TestRollingRetryOverUnnamedEvents: a refusal's retry time is the time at which enough
// events have left the window (engine.go's scan), found by the binary search over ranks,
// also when the newest event does not name the window (after a rebase) and aged events
// precede it: decide-only (no trim) and writing (trim) agree.
func TestRollingRetryOverUnnamedEvents(t *testing.T) {
	for _, mode := range []string{"0", "1"} {
		t.Run("mode "+mode, func(t *testing.T) {
			c := redistest.Start(t).Client(t)
			ctx := context.Background()
			key := "{k}:r:rolling"
			now := serverMillis(t, c)
			const w = 100000
			costs := []int64{4, 1, 2, 3, 1, 5, 2} // first two aged
			times := []int64{now - 150000, now - 120000, now - 80000, now - 60000, now - 40000, now - 20000, now - 10000}
			var zs []redis.Z
			acc := int64(1000)
			for i, k := range costs {
				acc += k
				zs = append(zs, redis.Z{Score: float64(times[i]), Member: fmt.Sprintf("%d:%d:%d", acc, k, times[i])})
			}
			if err := c.ZAdd(ctx, key, zs...).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.PExpire(ctx, key, 90000*1e6).Err(); err != nil {
				t.Fatal(err)
			}
			// In the window: 2, 3, 1, 5, 2 = 13 of 15. Cost 6 needs 4 freed: after the
			// events of 2 and 3 leave (at now-60000 + w).
			r := evalInts(t, c, lua.AllowSource, []string{key}, mode, "2", "15", fmt.Sprint(w), "15", "6")
			want := times[3] + w - now
			if r[0] != 0 || r[2] != 2 || r[4] > want || r[4] < want-5000 {
				t.Fatalf("cost 6 over 13 of 15: %v; want refused, 2 remaining, retry about %d", r, want)
			}
		})
	}
}
