package lua_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestStateInvariants: random decisions of one to four checks over every time rule, three
// identities (three slots, so later groups refuse after earlier ones were spent and
// refund them) and windows short enough to close, slide and expire while the test runs.
// After every decision each key under the limiter's prefix must expire within its
// rule's window (no decision, refusal or refund may leave a key without a TTL, or with
// a longer one), and hold no more than its rule's limit as spent.
func TestStateInvariants(t *testing.T) {
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
	ruleOf := map[string]ratebudget.Rule{}
	for _, r := range rules {
		for _, id := range identities {
			ruleOf[l.Key(ratebudget.Check{Rule: r, Identity: id})] = r
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var refused int
	full := map[ratebudget.Algorithm]int{} // keys seen with their whole budget spent
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
			r, ok := ruleOf[key]
			if !ok {
				t.Fatalf("decision %d: unexpected key %q", i, key)
			}
			w := r.Window
			spent := spentNow(t, c, r, key)
			if spent > r.Limit {
				t.Fatalf("decision %d (%+v → %+v): key %q holds %d spent units, over the limit of %d", i, checks, d, key, spent, r.Limit)
			}
			if spent == r.Limit {
				full[r.Algorithm]++
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
	t.Logf("%d refusals, %d refund calls, budgets seen spent in full: %v", refused, n, full)
	if refused < 100 || n < 50 || len(full) < 3 {
		t.Fatalf("%d refusals, %d refund calls, budgets seen spent in full: %v; want at least 100 and 50, and every time rule", refused, n, full)
	}
}

// spentNow reads how much of r's budget key holds as spent now: a fixed window's count,
// a token bucket's deficit in tokens (rounded up), the costs of a rolling window's events
// still in the window.
func spentNow(t *testing.T, c *redis.Client, r ratebudget.Rule, key string) int64 {
	t.Helper()
	ctx := context.Background()
	switch r.Algorithm {
	case ratebudget.RollingWindow:
		edge := serverMillis(t, c) - r.Window.Milliseconds()
		evs, err := c.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(edge, 10), Max: "+inf"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, e := range parseLog(t, evs) {
			sum += e.cost
		}
		return sum
	default:
		v, err := c.Get(ctx, key).Int64()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		if r.Algorithm == ratebudget.TokenBucket {
			w := r.Window.Milliseconds()
			return (v + w - 1) / w
		}
		return v
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
