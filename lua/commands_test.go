package lua_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// commandCounter is a go-redis hook counting the commands a client processes, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func countCommands(c *redis.Client) *commandCounter {
	h := &commandCounter{n: map[string]int{}}
	c.AddHook(h)
	return h
}

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, cmd := range cmds {
			h.n[strings.ToLower(cmd.Name())]++
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}
func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.n[strings.ToLower(cmd.Name())]++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

// take returns the counts since the last take and resets them.
func (h *commandCounter) take() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.n
	h.n = map[string]int{}
	return n
}

func (h *commandCounter) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := 0
	for _, v := range h.n {
		t += v
	}
	return t
}

// TestOneCommandPerDecision: once the script is loaded, every decision of checks that
// share a slot is exactly one EVALSHA and nothing else, whatever the number of rules;
// on the server the script runs a bounded number of commands per rule.
func TestOneCommandPerDecision(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	control := srv.Client(t)
	hook := countCommands(c)
	ctx := context.Background()
	rule := func(name string, alg ratebudget.Algorithm) ratebudget.Rule {
		return ratebudget.Rule{Name: name, Algorithm: alg, Limit: 1000, Window: time.Minute}
	}
	fixed, token, rolling := rule("f", ratebudget.FixedWindow), rule("t", ratebudget.TokenBucket), rule("r", ratebudget.RollingWindow)
	// Most server commands a script may run per rule and decision, in steady state (no
	// aged events to trim): see allow.lua.
	perRule := map[ratebudget.Algorithm]int{ratebudget.FixedWindow: 3, ratebudget.TokenBucket: 3, ratebudget.RollingWindow: 6}
	for _, tc := range []struct {
		name  string
		rules []ratebudget.Rule
	}{
		{"fixed", []ratebudget.Rule{fixed}},
		{"token", []ratebudget.Rule{token}},
		{"rolling", []ratebudget.Rule{rolling}},
		{"three-rules", []ratebudget.Rule{fixed, token, rolling}},
		{"three-fixed", []ratebudget.Rule{fixed, rule("f2", ratebudget.FixedWindow), rule("f3", ratebudget.FixedWindow)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)))
			if err != nil {
				t.Fatal(err)
			}
			var checks []ratebudget.Check
			maxServer := 0
			for _, r := range tc.rules {
				checks = append(checks, ratebudget.Check{Rule: r, Identity: "ann", Cost: 1})
				maxServer += perRule[r.Algorithm]
			}
			if _, err := l.Allow(ctx, checks); err != nil { // loads the script if needed
				t.Fatal(err)
			}
			hook.take()
			before := commandStats(t, control)
			const decisions = 200
			for range decisions {
				if d, err := l.Allow(ctx, checks); err != nil || !d.Allowed {
					t.Fatalf("Allow: %+v, %v", d, err)
				}
			}
			if got := hook.take(); len(got) != 1 || got["evalsha"] != decisions {
				t.Fatalf("client sent %v for %d decisions, want only %d evalsha", got, decisions, decisions)
			}
			delta := commandStats(t, control).sub(before)
			if delta.calls["evalsha"] != decisions {
				t.Fatalf("server ran %v evalsha, want %d", delta.calls["evalsha"], decisions)
			}
			inner := 0.0
			for name, n := range delta.calls {
				switch name {
				case "evalsha", "info":
				default:
					inner += n
				}
			}
			t.Logf("server commands per decision inside the script: %.2f (%v)", inner/decisions, delta.calls)
			if inner/decisions > float64(maxServer) {
				t.Fatalf("%.2f server commands per decision, want at most %d", inner/decisions, maxServer)
			}
			// Refusals are one EVALSHA too (with the refusal cache off).
			nc, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)), lua.WithoutRefusalCache())
			if err != nil {
				t.Fatal(err)
			}
			heavy := append([]ratebudget.Check(nil), checks...)
			heavy[0].Rule.Limit, heavy[0].Rule.Window = 1, time.Minute
			for i := range 10 {
				if d, err := nc.Allow(ctx, heavy); err != nil || d.Allowed != (i == 0) {
					t.Fatalf("decision %d: %+v, %v", i, d, err)
				}
			}
			if got := hook.take(); len(got) != 1 || got["evalsha"] != 10 {
				t.Fatalf("client sent %v for 10 decisions, want only 10 evalsha", got)
			}
		})
	}
}

// TestRefusalCacheFlood: a client hammering a refused budget costs Redis almost nothing.
func TestRefusalCacheFlood(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := countCommands(c)
	l, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			r := ratebudget.Rule{Name: "flood", Algorithm: alg, Limit: 3, Window: time.Minute}
			chk := []ratebudget.Check{{Rule: r, Identity: "mallory", Cost: 1}}
			for range 3 {
				if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
					t.Fatalf("Allow: %+v, %v", d, err)
				}
			}
			hook.take()
			const requests, workers = 10000, 16
			var refused atomic.Int64
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range requests / workers {
						cost := int64(1 + w%2) // a larger cost is refused by the same entry
						d, err := l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "mallory", Cost: cost}})
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed || d.Rule != "flood" || d.Index != 0 || d.RetryAfter <= 0 {
							t.Errorf("flood request: %+v, want a refusal with a wait", d)
							return
						}
						refused.Add(1)
					}
				}()
			}
			wg.Wait()
			// Connection setup (HELLO, CLIENT SETINFO on new pool connections) is not a
			// decision's call.
			got := hook.take()
			calls := got["evalsha"] + got["eval"]
			ratio := float64(calls) / float64(refused.Load())
			t.Logf("%d refused requests, %d script calls (%.5f per request); all commands %v", refused.Load(), calls, ratio, got)
			if ratio > 0.01 {
				t.Fatalf("%.4f Redis calls per refused request, want at most 0.01", ratio)
			}
		})
	}
}

// TestRefusalCacheEndsWhenRedisAdmits: while a refusal is repeated from the cache, Redis
// refuses too; when the cache lets a request through, Redis admits it (at most a
// millisecond of rounding later).
func TestRefusalCacheEndsWhenRedisAdmits(t *testing.T) {
	srv := redistest.Start(t)
	cached := srv.Client(t)
	hook := countCommands(cached)
	direct := srv.Client(t)
	prefix := uniquePrefix(t)
	l, err := lua.New(cached, lua.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := lua.New(direct, lua.WithPrefix(prefix), lua.WithoutRefusalCache())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const w = 150 * time.Millisecond
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			r := ratebudget.Rule{Name: "short", Algorithm: alg, Limit: 1, Window: w}
			chk := []ratebudget.Check{{Rule: r, Identity: "oscar", Cost: 1}}
			if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
				t.Fatalf("first: %+v, %v", d, err)
			}
			sent := time.Now()
			d, err := l.Allow(ctx, chk)
			if err != nil || d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("second: %+v, %v; want refused with a wait", d, err)
			}
			// The cached wait runs from the send time, before Redis decided: it may end
			// early by up to this call's round trip (never late), plus a millisecond of
			// rounding on each side.
			early := time.Since(sent) + 2*time.Millisecond
			hook.take()
			local := 0
			deadline := time.Now().Add(10 * w)
			for {
				if time.Now().After(deadline) {
					t.Fatalf("the cached refusal outlived %v", 10*w)
				}
				asked := time.Now()
				d, err := l.Allow(ctx, chk)
				if err != nil {
					t.Fatal(err)
				}
				if hook.total() > 0 {
					// The cache let this one through to Redis: Redis admits it, or its
					// refusal is a rounding away from admitting.
					if !d.Allowed && d.RetryAfter > early {
						t.Fatalf("the cache ended early: Redis refused with %v to wait (allowed: %v)", d.RetryAfter, early)
					}
					if !d.Allowed {
						continue // the next call goes to Redis again
					}
					break
				}
				local++
				if d.Allowed {
					t.Fatal("admitted without asking Redis")
				}
				// Redis agrees while the cache refuses (a refusal writes nothing), unless
				// the cached wait ended between the two calls.
				rd, err := ref.Allow(ctx, chk)
				if err != nil {
					t.Fatal(err)
				}
				if rd.Allowed {
					if since := time.Since(asked); since < d.RetryAfter-2*time.Millisecond {
						t.Fatalf("the cache refused with %v to wait, Redis admitted %v later", d.RetryAfter, since)
					}
					t.Logf("%d refusals repeated from the cache; Redis admitted as the cached wait ended", local)
					return // the budget is spent again
				}
				time.Sleep(200 * time.Microsecond) // pacing the polling loop, not synchronising
			}
			t.Logf("%d refusals repeated from the cache before Redis admitted", local)
			if local == 0 {
				t.Fatal("no refusal was repeated from the cache")
			}
		})
	}
}

// TestTokenBucketBackwardClock: a bucket whose timestamp is ahead of the server's clock
// (the clock went back) refills nothing until the clock catches up, and every wait it
// reports includes that lag, as the in-process engine's do.
func TestTokenBucketBackwardClock(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)), lua.WithoutRefusalCache())
	if err != nil {
		t.Fatal(err)
	}
	// 10 tokens per 10s: one token per second; the level is in tokens x window ms.
	r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 10 * time.Second}
	chk := ratebudget.Check{Rule: r, Identity: "trent", Cost: 1}
	key := l.Key(chk)
	const lag = 5000 // ms
	// set writes the bucket and returns a local time no later than the server's clock
	// reading it was based on, so that the slack below covers every millisecond since.
	set := func(level int64) time.Time {
		before := time.Now()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		bucket := strconv.FormatInt(level, 10) + ":" + strconv.FormatInt(now.UnixMilli()+lag, 10)
		if err := c.Set(ctx, key, bucket, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		return before
	}
	between := func(what string, got, want time.Duration, since time.Time) {
		t.Helper()
		slack := time.Since(since) + 2*time.Millisecond
		if got > want || got < want-slack {
			t.Errorf("%s = %v, want %v minus at most %v", what, got, want, slack)
		}
	}
	// Empty bucket: one token is lag + 1s away, a full bucket lag + 10s.
	start := set(0)
	d, err := l.Allow(ctx, []ratebudget.Check{chk})
	if err != nil || d.Allowed {
		t.Fatalf("empty bucket: %+v, %v", d, err)
	}
	between("RetryAfter", d.RetryAfter, (lag+1000)*time.Millisecond, start)
	between("ResetAfter", d.ResetAfter, (lag+10000)*time.Millisecond, start)
	// Full bucket: admitted, and refilling the spent token waits for the clock too.
	start = set(10 * 10000)
	d, err = l.Allow(ctx, []ratebudget.Check{chk})
	if err != nil || !d.Allowed || d.Remaining != 9 {
		t.Fatalf("full bucket: %+v, %v", d, err)
	}
	between("ResetAfter", d.ResetAfter, (lag+1000)*time.Millisecond, start)
	if pttl := c.PTTL(ctx, key).Val(); pttl < d.ResetAfter-5*time.Millisecond || pttl > d.ResetAfter {
		t.Errorf("PTTL %v, want the reported reset %v", pttl, d.ResetAfter)
	}
	// A full bucket has nothing to refill: a cost above capacity reports no reset.
	set(10 * 10000)
	d, err = l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "trent", Cost: 11}})
	if err != nil || !d.Exceeded || d.ResetAfter != 0 || d.Remaining != 10 {
		t.Fatalf("cost above capacity on a full bucket: %+v, %v; want Exceeded, no reset", d, err)
	}
}

// TestTokenBucketState: a token bucket is one string "<level>:<ms>" (level in tokens x
// window ms, time of the server's clock) whose TTL is the time until full; a value that
// does not parse strictly is an error reply and is left as it was.
func TestTokenBucketState(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)), lua.WithoutRefusalCache())
	if err != nil {
		t.Fatal(err)
	}
	// 10 tokens per 10s: one token per second.
	r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 10 * time.Second}
	chk := []ratebudget.Check{{Rule: r, Identity: "sybil", Cost: 3}}
	key := l.Key(chk[0])
	before, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed || d.Remaining != 7 || d.ResetAfter != 3*time.Second {
		t.Fatalf("first decision: %+v, %v", d, err)
	}
	after, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if typ := c.Type(ctx, key).Val(); typ != "string" {
		t.Fatalf("bucket type %q, want string", typ)
	}
	v := c.Get(ctx, key).Val()
	level, ts, ok := strings.Cut(v, ":")
	ms, err := strconv.ParseInt(ts, 10, 64)
	if !ok || level != "70000" || err != nil || ms < before.UnixMilli() || ms > after.UnixMilli() {
		t.Fatalf("bucket %q, want \"70000:<ms in [%d, %d]>\"", v, before.UnixMilli(), after.UnixMilli())
	}
	if pttl := c.PTTL(ctx, key).Val(); pttl <= 2900*time.Millisecond || pttl > 3*time.Second {
		t.Fatalf("PTTL %v, want the time until full, 3s", pttl)
	}
	for _, bad := range []string{"", "70000", "70000:", ":1", "-1:1", "1:-1", "1.5:1", "1:1:1", " 1:1", "1:1 ", "1e3:1", "0x10:1", "a:b"} {
		if err := c.Set(ctx, key, bad, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := l.Allow(ctx, chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != "server" || !strings.Contains(err.Error(), "corrupt bucket") {
			t.Errorf("bucket %q: Allow = %v, want a corrupt-bucket server error", bad, err)
		}
		if got := c.Get(ctx, key).Val(); got != bad {
			t.Errorf("bucket %q became %q", bad, got)
		}
	}
}
