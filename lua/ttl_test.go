package lua_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestTTLInvariant: random decisions of one to four checks over every time rule, three
// identities (three slots, so later groups refuse after earlier ones were spent and
// refund them) and windows short enough to close, slide and expire while the test runs.
// After every decision each key under the limiter's prefix must expire within its
// rule's window: no decision, refusal or refund may leave a key without a TTL, or with
// a longer one.
func TestTTLInvariant(t *testing.T) {
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	refunds := &scriptCounter{sha: lua.RefundSHA(l)}
	c.AddHook(refunds)
	ctx := context.Background()
	var rules []ratebudget.Rule
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for _, w := range []time.Duration{15 * time.Millisecond, 60 * time.Millisecond, time.Second} {
			rules = append(rules, ratebudget.Rule{
				Name: alg.String() + "-" + w.String(), Algorithm: alg, Limit: 6, Window: w,
			})
		}
	}
	identities := []string{"ann", "bob", "cy"}
	window := map[string]time.Duration{}
	for _, r := range rules {
		for _, id := range identities {
			window[l.Key(ratebudget.Check{Rule: r, Identity: id})] = r.Window
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var refused int
	for i := range 1500 {
		n := 1 + rng.IntN(4)
		checks := make([]ratebudget.Check, 0, n)
		seen := map[string]bool{}
		for len(checks) < n {
			chk := ratebudget.Check{
				Rule:     rules[rng.IntN(len(rules))],
				Identity: identities[rng.IntN(len(identities))],
				Cost:     1 + rng.Int64N(3),
			}
			if k := l.Key(chk); !seen[k] {
				seen[k] = true
				checks = append(checks, chk)
			}
		}
		d, err := l.Allow(ctx, checks)
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		if !d.Allowed {
			refused++
		}
		iter := c.Scan(ctx, 0, l.Prefix()+":*", 100).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			w, ok := window[key]
			if !ok {
				t.Fatalf("decision %d: unexpected key %q", i, key)
			}
			p, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if p == -2*time.Nanosecond {
				continue // expired since the scan
			}
			if p < 0 || p > w { // 0: under a millisecond left
				t.Fatalf("decision %d (%+v → %+v): key %q has PTTL %v, want (0, %v]", i, checks, d, key, p, w)
			}
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The walk must have covered refusals, and refunds of every time rule's spend.
	n := refunds.n.Load()
	t.Logf("%d refusals, %d refund calls", refused, n)
	if refused < 100 || n < 50 {
		t.Fatalf("%d refusals, %d refund calls; want at least 100 and 50", refused, n)
	}
}

// scriptCounter is a go-redis hook counting the calls of one script (EVALSHA or EVAL).
type scriptCounter struct {
	sha string
	n   atomic.Int64
}

func (h *scriptCounter) count(cmd redis.Cmder) {
	if a := cmd.Args(); len(a) > 1 && a[1] == h.sha {
		h.n.Add(1)
	}
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}
