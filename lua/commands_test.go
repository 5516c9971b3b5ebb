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
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/limitertest"
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
		h.n["(pipelined)"] += len(cmds)
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
			l := newLimiter(t, c)
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
			// A token bucket's admission is exactly GET, PTTL and SET (no TIME).
			if tc.name == "token" && (inner != 3*decisions || delta.calls["get"] != decisions ||
				delta.calls["pttl"] != decisions || delta.calls["set"] != decisions) {
				t.Fatalf("token admissions ran %v, want exactly GET, PTTL and SET per decision", delta.calls)
			}
			// Refusals are one EVALSHA too (with the refusal cache off).
			nc := newLimiter(t, c, lua.WithRefusalCache(0))
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
			if tc.name == "token" {
				// A token bucket's refusal is exactly GET and PTTL.
				before := commandStats(t, control)
				for range decisions {
					if d, err := nc.Allow(ctx, heavy); err != nil || d.Allowed {
						t.Fatalf("refusal: %+v, %v", d, err)
					}
				}
				delta := commandStats(t, control).sub(before)
				inner := 0.0
				for name, n := range delta.calls {
					if name != "evalsha" && name != "info" {
						inner += n
					}
				}
				if inner != 2*decisions || delta.calls["get"] != decisions || delta.calls["pttl"] != decisions {
					t.Fatalf("token refusals ran %v, want exactly GET and PTTL per decision", delta.calls)
				}
			}
		})
	}
}

// TestHookSeesEveryCommand: with 64 concurrent callers, whose decisions are pipelined
// while others are in flight, every command the server runs for the limiter passed
// through the client's hooks: the hook's EVALSHA and EVAL count equals the server's, one
// per decision once the script is loaded. It runs with go-redis's default pipeline
// (half duplex: pipelined commands pass the pipeline hooks, so the test also sees that
// some were pipelined) and with a full-duplex one (AutoPipelineOptions{FullDuplex:
// true}: go-redis runs each pipelined command's process hooks).
func TestHookSeesEveryCommand(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name string
		opts *redis.AutoPipelineOptions
	}{{"half-duplex", nil}, {"full-duplex", &redis.AutoPipelineOptions{FullDuplex: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, AutoPipelineOptions: tc.opts})
			t.Cleanup(func() { c.Close() })
			control := srv.Client(t)
			hook := countCommands(c)
			l := newLimiter(t, c, lua.WithRefusalCache(0))
			ctx := context.Background()
			if err := l.Load(ctx); err != nil {
				t.Fatal(err)
			}
			hook.take()
			before := commandStats(t, control)
			const callers, each = 64, 50
			rule := ratebudget.Rule{Name: "api-" + tc.name, Limit: 1 << 20, Window: time.Minute}
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					chk := []ratebudget.Check{{Rule: rule, Identity: "c" + strconv.Itoa(i), Cost: 1}}
					for range each {
						if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
							t.Errorf("Allow: %+v, %v", d, err)
							return
						}
					}
				})
			}
			wg.Wait()
			got := hook.take()
			delta := commandStats(t, control).sub(before)
			server := int(delta.calls["evalsha"] + delta.calls["eval"])
			if sent := got["evalsha"] + got["eval"]; sent != callers*each || server != sent {
				t.Fatalf("hook saw %v; server ran %d scripts; want %d each", got, server, callers*each)
			}
			if tc.opts == nil && got["(pipelined)"] == 0 {
				t.Fatalf("hook saw %v: no decision was pipelined among %d concurrent callers", got, callers)
			}
			t.Logf("%d of %d decisions through the pipeline hooks", got["(pipelined)"], callers*each)
		})
	}
}

// TestConformanceAutoPipeliner runs the shared suite with an *redis.AutoPipeliner as
// the client: every decision goes through its pipeline.
func TestConformanceAutoPipeliner(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ap, err := client.AsyncAutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		return limitertest.Harness{Limiter: newLimiter(t, ap)}
	})
}

// TestRefusalCacheFlood: a client hammering a refused budget costs Redis almost nothing.
func TestRefusalCacheFlood(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := countCommands(c)
	l := newLimiter(t, c)
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
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
						cost := int64(1)
						if alg == ratebudget.FixedWindow {
							// A larger cost is refused by the same entry: its wait is the
							// window's end too (under the other time rules it waits longer,
							// which Redis tells).
							cost += int64(w % 2)
						}
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
	ref, err := lua.New(direct, lua.WithPrefix(prefix), lua.WithRefusalCache(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
			// A run too slow to decide its outcome is repeated on a fresh budget with
			// the window doubled.
			w := 150 * time.Millisecond
			for attempt := 1; ; attempt++ {
				if cacheEndsWhenRedisAdmits(t, l, ref, hook, alg, w, "oscar-"+strconv.Itoa(attempt)) {
					return
				}
				if attempt == 6 {
					t.Fatalf("%d runs, the last with a %v window: each was too slow to decide its outcome", attempt, w)
				}
				t.Logf("run %d with a %v window was too slow to decide its outcome; again with %v", attempt, w, 2*w)
				w *= 2
			}
		})
	}
}

// cacheEndsWhenRedisAdmits is one run of TestRefusalCacheEndsWhenRedisAdmits on a fresh
// budget of one unit per w. It returns false, having asserted only what holds whatever
// the timing, when the time measured around the calls does not decide the outcome.
func cacheEndsWhenRedisAdmits(t *testing.T, l, ref *lua.Limiter, hook *commandCounter, alg ratebudget.Algorithm, w time.Duration, id string) bool {
	t.Helper()
	ctx := context.Background()
	r := ratebudget.Rule{Name: "short", Algorithm: alg, Limit: 1, Window: w}
	chk := []ratebudget.Check{{Rule: r, Identity: id, Cost: 1}}
	begin := time.Now()
	if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
		t.Fatalf("first: %+v, %v", d, err)
	}
	sent := time.Now()
	refusal, err := l.Allow(ctx, chk)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(begin)+2*time.Millisecond >= w {
		return false // the unit may be back already
	}
	if refusal.Allowed || refusal.RetryAfter <= 0 {
		t.Fatalf("second: %+v; want refused with a wait", refusal)
	}
	// The cached wait runs from the send time, before Redis decided: it may end early by
	// up to this call's round trip (never late), plus a millisecond of rounding on each
	// side. So it has ended for certain by returned + RetryAfter + 1ms, and not before
	// sent + RetryAfter - 1ms.
	returned := time.Now()
	early := returned.Sub(sent) + 2*time.Millisecond
	hook.take()
	local := 0
	var firstReturned time.Time
	for deadline := time.Now().Add(time.Minute); ; {
		if time.Now().After(deadline) {
			t.Fatal("no decision from Redis within a minute")
		}
		asked := time.Now()
		d, err := l.Allow(ctx, chk)
		if err != nil {
			t.Fatal(err)
		}
		if firstReturned.IsZero() {
			firstReturned = time.Now()
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
		if late := asked.Sub(returned) - refusal.RetryAfter - time.Millisecond; late > 0 {
			t.Fatalf("the cached refusal outlived its wait of %v by %v", refusal.RetryAfter, late)
		}
		// Redis agrees while the cache refuses (a refusal writes nothing), unless the
		// cached wait ended between the two calls.
		rd, err := ref.Allow(ctx, chk)
		if err != nil {
			t.Fatal(err)
		}
		if rd.Allowed {
			if since := time.Since(asked); since < d.RetryAfter-2*time.Millisecond {
				t.Fatalf("the cache refused with %v to wait, Redis admitted %v later", d.RetryAfter, since)
			}
			t.Logf("%d refusals repeated from the cache; Redis admitted as the cached wait ended", local)
			return true // the budget is spent again
		}
		time.Sleep(200 * time.Microsecond) // pacing the polling loop, not synchronising
	}
	t.Logf("%d refusals repeated from the cache before Redis admitted", local)
	if local == 0 {
		if firstReturned.Sub(sent) < refusal.RetryAfter-time.Millisecond {
			t.Fatalf("no refusal was repeated from the cache: the first call after it returned %v after the refusal was sent, its wait was %v", firstReturned.Sub(sent), refusal.RetryAfter)
		}
		return false // the machine was too slow to ask within the cached wait
	}
	return true
}

// TestTokenBucketBackwardClock: a bucket whose TTL is longer than its deficit implies
// (the server's clock went back since it was written) refills nothing until the clock
// catches up, and every wait it reports includes that lag, as the in-process engine's
// do; an admission keeps the lag in the TTL it writes, so the next decision sees it too.
func TestTokenBucketBackwardClock(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	// 10 tokens per 10s: one token per second; the deficit is in tokens x window ms,
	// and refills by 10 units per ms.
	r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 10 * time.Second}
	chk := ratebudget.Check{Rule: r, Identity: "trent", Cost: 1}
	key := l.Key(chk)
	const lag = 5000 // ms
	// set writes a deficit with the TTL it would have been written with lag ms ahead of
	// the server's clock, and returns the local time before the write, so that the slack
	// below covers every millisecond since.
	set := func(deficit int64) time.Time {
		before := time.Now()
		ttl := time.Duration(lag+(deficit+9)/10) * time.Millisecond
		if err := c.Set(ctx, key, strconv.FormatInt(deficit, 10), ttl).Err(); err != nil {
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
	start := set(10 * 10000)
	d, err := l.Allow(ctx, []ratebudget.Check{chk})
	if err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("empty bucket: %+v, %v", d, err)
	}
	between("RetryAfter", d.RetryAfter, (lag+1000)*time.Millisecond, start)
	between("ResetAfter", d.ResetAfter, (lag+10000)*time.Millisecond, start)
	if v := c.Get(ctx, key).Val(); v != "100000" {
		t.Errorf("a refusal rewrote the bucket as %q", v)
	}
	// Half-empty bucket: 5 tokens, nothing refilled while the clock lags.
	start = set(5 * 10000)
	d, err = l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "trent", Cost: 6}})
	if err != nil || d.Allowed || d.Remaining != 5 {
		t.Fatalf("half-empty bucket: %+v, %v", d, err)
	}
	between("RetryAfter", d.RetryAfter, (lag+1000)*time.Millisecond, start)
	between("ResetAfter", d.ResetAfter, (lag+5000)*time.Millisecond, start)
	// Full bucket: admitted, and refilling the spent token waits for the clock too.
	start = set(0)
	d, err = l.Allow(ctx, []ratebudget.Check{chk})
	if err != nil || !d.Allowed || d.Remaining != 9 {
		t.Fatalf("full bucket: %+v, %v", d, err)
	}
	between("ResetAfter", d.ResetAfter, (lag+1000)*time.Millisecond, start)
	if v := c.Get(ctx, key).Val(); v != "10000:1000:10000" {
		t.Errorf("bucket %q after spending one token of a full one, want deficit \"10000\", full in 1000ms, window 10000ms", v)
	}
	if pttl, slack := c.PTTL(ctx, key).Val(), time.Since(start)+2*time.Millisecond; pttl < d.ResetAfter-slack || pttl > d.ResetAfter {
		t.Errorf("PTTL %v, want the reported reset %v minus at most %v", pttl, d.ResetAfter, slack)
	}
	// The written TTL carries the lag: the next decision still refills nothing and waits
	// for the clock (9 tokens, 10 wanted: one token, lag + 1s away).
	d, err = l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "trent", Cost: 10}})
	if err != nil || d.Allowed || d.Remaining != 9 {
		t.Fatalf("after the admission: %+v, %v", d, err)
	}
	between("RetryAfter", d.RetryAfter, (lag+1000)*time.Millisecond, start)
	between("ResetAfter", d.ResetAfter, (lag+1000)*time.Millisecond, start)
	// A full bucket has nothing to refill: a cost above capacity reports no reset.
	set(0)
	d, err = l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "trent", Cost: 11}})
	if err != nil || !d.Exceeded || d.ResetAfter != 0 || d.Remaining != 10 {
		t.Fatalf("cost above capacity on a full bucket: %+v, %v; want Exceeded, no reset", d, err)
	}
}

// TestTokenBucketState: a token bucket is one string,
// "<deficit>:<time until full>:<window>", its deficit (full - level, in tokens x window
// ms), ceil(deficit / rate) and the window (ms) as decimal integers, whose TTL is the
// time until full; the time since it was written is that time until full - PTTL (a
// plain deficit, as written before, is read with ceil(deficit / rate)). A bucket found
// without a TTL is read as written now and given its TTL back; a deficit above full is
// debt (refused, Remaining reported as 0, the decision's floor); a value of another
// form, a deficit beyond 2^53, a time until full beyond the deficit or a window out of
// 1ms..366 days is an error reply and is left as it was.
func TestTokenBucketState(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	// 10 tokens per 10s: one token per second; 10 units per ms, full = 100000.
	r := ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 10 * time.Second}
	chk := []ratebudget.Check{{Rule: r, Identity: "sybil", Cost: 3}}
	key := l.Key(chk[0])
	first := time.Now()
	if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed || d.Remaining != 7 || d.ResetAfter != 3*time.Second {
		t.Fatalf("first decision: %+v, %v", d, err)
	}
	if typ := c.Type(ctx, key).Val(); typ != "string" {
		t.Fatalf("bucket type %q, want string", typ)
	}
	if v := c.Get(ctx, key).Val(); v != "30000:3000:10000" {
		t.Fatalf("bucket %q, want the deficit \"30000\", full in 3000ms, window 10000ms", v)
	}
	if pttl, slack := c.PTTL(ctx, key).Val(), time.Since(first)+2*time.Millisecond; pttl < 3*time.Second-slack || pttl > 3*time.Second {
		t.Fatalf("PTTL %v, want the time until full, 3s, minus at most %v", pttl, slack)
	}

	// The refill is read from the TTL: a deficit of 5 tokens written 2s ago (TTL 3s
	// left of 5s) holds 7 tokens now; spending one leaves a deficit of 4 tokens, full in
	// 4s, less the milliseconds that passed since the write below.
	start := time.Now()
	if err := c.Set(ctx, key, "50000", 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "sybil", Cost: 1}})
	slack := time.Since(start) + 2*time.Millisecond
	if err != nil || !d.Allowed || d.Remaining != 6 || d.ResetAfter > 4*time.Second || d.ResetAfter < 4*time.Second-slack {
		t.Fatalf("after 2s of refill: %+v, %v; want admitted, 6 left, reset 4s minus at most %v", d, err, slack)
	}
	ds, ts, _ := strings.Cut(c.Get(ctx, key).Val(), ":")
	ts, ws, _ := strings.Cut(ts, ":")
	v, _ := strconv.ParseInt(ds, 10, 64)
	if ts != strconv.FormatInt((v+9)/10, 10) || ws != "10000" {
		t.Fatalf("bucket %q: time until full %q, window %q, want ceil(deficit / 10) and 10000", c.Get(ctx, key).Val(), ts, ws)
	}
	if el := (40000 - v) / 10; v > 40000 || (40000-v)%10 != 0 || time.Duration(el)*time.Millisecond > slack {
		t.Fatalf("deficit %d, want 40000 less 10 per ms since the write (at most %v)", v, slack)
	}
	// The TTL keeps running down after the decision: count the slack up to this read.
	if pttl := c.PTTL(ctx, key).Val(); pttl > d.ResetAfter || pttl < d.ResetAfter-time.Since(start)-2*time.Millisecond {
		t.Fatalf("PTTL %v, want the reported reset %v minus at most %v", pttl, d.ResetAfter, time.Since(start)+2*time.Millisecond)
	}

	// A bucket without a TTL counts as written now, and is given its TTL back by an
	// admission and by a refusal alike.
	for _, tc := range []struct {
		value   string
		allowed bool
		left    int64
		pttl    time.Duration // TTL after the decision
	}{
		{"50000", true, 2, 8 * time.Second},
		{"100000", false, 0, 10 * time.Second},
		{"0", true, 7, 3 * time.Second},
	} {
		start := time.Now()
		if err := c.Set(ctx, key, tc.value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, chk)
		if err != nil || d.Allowed != tc.allowed || d.Remaining != tc.left {
			t.Fatalf("bucket %s without a TTL: %+v, %v", tc.value, d, err)
		}
		p := c.PTTL(ctx, key).Val()
		if slack := time.Since(start) + 2*time.Millisecond; p > tc.pttl || p < tc.pttl-slack {
			t.Fatalf("bucket %s without a TTL: PTTL %v after the decision, want %v minus at most %v", tc.value, p, tc.pttl, slack)
		}
		if !tc.allowed && c.Get(ctx, key).Val() != tc.value {
			t.Fatalf("bucket %s without a TTL: a refusal changed the value", tc.value)
		}
	}
	// Strict parsing: anything but a decimal integer below 2^53 is an error reply.
	for _, bad := range []string{"", "-1", "+1", "1.5", " 1", "1 ", "1e3", "0x10", "a",
		"99999999999999999999", "70000:1796069878916", "1:", ":1", "1:2", "1:-1", "1:1:1:1", "99999999999999999999:1",
		"1:1:0", "1:1:31622400001", "1:1:", "1:1:-1", "1:2:10000", "99999999999999999999:1:10000"} {
		if err := c.Set(ctx, key, bad, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := l.Allow(ctx, chk)
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || !strings.Contains(err.Error(), "corrupt bucket") {
			t.Errorf("bucket %q: Allow = %v, want a corrupt-bucket server error", bad, err)
		}
		if got := c.Get(ctx, key).Val(); got != bad {
			t.Errorf("bucket %q became %q", bad, got)
		}
	}
	// An empty bucket (deficit = full) refuses, and so does a deficit above full (debt
	// from a settle, or a capacity lowered under the same name): not an error.
	for _, empty := range []string{"100000", "100001", "5000000"} {
		if err := c.Set(ctx, key, empty, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Allow(ctx, chk); err != nil || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
			t.Fatalf("deficit %s: %+v, %v; want an empty bucket's refusal", empty, d, err)
		}
	}
}

// TestFixedWindowCounterWithoutTTL: a fixed-window counter found without a TTL counts as
// a window opened now, and is given the window as its TTL back by an admission and by a
// refusal alike, alone or in a group; a refusal leaves its count as it was.
func TestFixedWindowCounterWithoutTTL(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	r := ratebudget.Rule{Name: "fw", Limit: 5, Window: time.Hour}
	for _, tc := range []struct {
		name    string
		value   string
		checks  int
		allowed bool
		count   string // after the decision
	}{
		{"admitted alone", "2", 1, true, "3"},
		{"refused alone", "5", 1, false, "5"},
		{"admitted in a group", "2", 2, true, "3"},
		{"refused in a group", "5", 2, false, "5"},
	} {
		var checks []ratebudget.Check
		for i := range tc.checks {
			checks = append(checks, ratebudget.Check{Rule: r, Identity: tc.name, Scope: strconv.Itoa(i), Cost: 1})
		}
		for _, chk := range checks {
			if err := c.Set(ctx, l.Key(chk), tc.value, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		d, err := l.Allow(ctx, checks)
		if err != nil || d.Allowed != tc.allowed || d.ResetAfter != time.Hour {
			t.Fatalf("%s: %+v, %v; want allowed %v with the window's reset, 1h", tc.name, d, err, tc.allowed)
		}
		for _, chk := range checks {
			key := l.Key(chk)
			if v := c.Get(ctx, key).Val(); v != tc.count {
				t.Errorf("%s: counter %q after the decision, want %q", tc.name, v, tc.count)
			}
			if p, slack := c.PTTL(ctx, key).Val(), time.Since(start)+2*time.Millisecond; p > time.Hour || p < time.Hour-slack {
				t.Errorf("%s: PTTL %v after the decision, want the window, 1h, minus at most %v", tc.name, p, slack)
			}
		}
	}
}

// TestTokenBucketRefundKeepsLag: a refund (a later slot's group refused) gives the cost
// back to a bucket whose clock lags, and the TTL it writes keeps the lag.
func TestTokenBucketRefundKeepsLag(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := countCommands(c)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	// 10 units per ms, full = 100000; the fixed window of another identity (another
	// slot) is spent, so it refuses after the bucket's group was admitted.
	tb := ratebudget.Check{Rule: ratebudget.Rule{Name: "tb", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: 10 * time.Second}, Identity: "ann", Cost: 1}
	fw := ratebudget.Check{Rule: ratebudget.Rule{Name: "fw", Limit: 1, Window: time.Minute}, Identity: "bob", Cost: 1}
	if d, err := l.Allow(ctx, []ratebudget.Check{fw}); err != nil || !d.Allowed {
		t.Fatalf("spending the fixed window: %+v, %v", d, err)
	}
	// 5 tokens, written 5s ahead of the server's clock: PTTL = lag + 5s.
	const lag = 5 * time.Second
	start := time.Now()
	if err := c.Set(ctx, l.Key(tb), "50000", lag+5*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	hook.take()
	d, err := l.Allow(ctx, []ratebudget.Check{tb, fw})
	if err != nil || d.Allowed || d.Rule != "fw" {
		t.Fatalf("decision: %+v, %v; want refused by fw", d, err)
	}
	// Two allow calls and a refund (EVAL too, if the refund script was not loaded yet).
	if got := hook.take(); got["evalsha"] != 3 {
		t.Fatalf("client sent %v, want two allow calls and a refund", got)
	}
	if v := c.Get(ctx, l.Key(tb)).Val(); v != "50000:5000:10000" {
		t.Fatalf("bucket %q after the refund, want \"50000:5000:10000\" (no refill while the clock lags)", v)
	}
	p := c.PTTL(ctx, l.Key(tb)).Val()
	if slack := time.Since(start) + 2*time.Millisecond; p > lag+5*time.Second || p < lag+5*time.Second-slack {
		t.Fatalf("PTTL %v after the refund, want %v (lag + time until full) minus at most %v", p, lag+5*time.Second, slack)
	}
}

// TestRefusalCacheAfterAdmission: a cached refusal is not repeated once Redis has admitted
// a cheaper request for the same budget. That spend changed what the refusal reported
// (fewer units remaining, for a token bucket or a rolling window a longer wait), so the
// next request asks Redis again and reports the budget as it now is.
func TestRefusalCacheAfterAdmission(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := countCommands(c)
	l := newLimiter(t, c)
	ctx := context.Background()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		t.Run(algname.Of(alg), func(t *testing.T) {
			r := ratebudget.Rule{Name: "stale", Algorithm: alg, Limit: 3, Window: time.Hour}
			allow := func(cost int64) ratebudget.Decision {
				t.Helper()
				d, err := l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "olga", Cost: cost}})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			if d := allow(2); !d.Allowed {
				t.Fatalf("cost 2 of 3: %+v", d)
			}
			first := allow(3)
			hook.take()
			if d := allow(3); d.Allowed || d.Remaining != 1 || hook.total() != 0 {
				t.Fatalf("cost 3 again: %+v after %v; want the cached refusal, 1 remaining", d, hook.take())
			}
			if d := allow(1); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("cost 1: %+v; want admitted, 0 remaining", d)
			}
			hook.take()
			d := allow(3)
			if calls := hook.take(); calls["evalsha"] != 1 {
				t.Fatalf("cost 3 after an admission: Redis saw %v, want one call", calls)
			}
			if d.Allowed || d.Remaining != 0 || d.RetryAfter < first.RetryAfter-time.Second {
				t.Fatalf("cost 3 after an admission: %+v; want refused with 0 remaining and a wait of at least %v", d, first.RetryAfter)
			}
		})
	}
}

// TestRefusalCacheAfterLeaseAdmission: a decision that takes an in-flight lease is never
// answered from the refusal cache, and when it admits, its spend of the other checks'
// budgets drops their cached refusals, as any admission does, through Allow and
// AllowEach alike.
func TestRefusalCacheAfterLeaseAdmission(t *testing.T) {
	c := redistest.Start(t).Client(t)
	hook := countCommands(c)
	l := newLimiter(t, c)
	ctx := context.Background()
	lease := ratebudget.Check{Rule: ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 10, Window: time.Hour}, Identity: "olga", Cost: 1}
	for _, each := range []bool{false, true} {
		t.Run(map[bool]string{false: "allow", true: "each"}[each], func(t *testing.T) {
			r := ratebudget.Rule{Name: "stale-" + strconv.FormatBool(each), Limit: 3, Window: time.Hour}
			allow := func(checks ...ratebudget.Check) ratebudget.Decision {
				t.Helper()
				var d ratebudget.Decision
				var err error
				if each {
					d, err = l.AllowEach(ctx, checks, make([]ratebudget.Outcome, len(checks)))
				} else {
					d, err = l.Allow(ctx, checks)
				}
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			spend := func(cost int64) ratebudget.Check { return ratebudget.Check{Rule: r, Identity: "olga", Cost: cost} }
			if d := allow(spend(2)); !d.Allowed {
				t.Fatalf("cost 2 of 3: %+v", d)
			}
			allow(spend(3)) // refused, and cached
			hook.take()
			if d := allow(spend(3)); d.Allowed || d.Remaining != 1 || hook.total() != 0 {
				t.Fatalf("cost 3 again: %+v after %v; want the cached refusal, 1 remaining", d, hook.take())
			}
			if d := allow(spend(1), lease); !d.Allowed {
				t.Fatalf("cost 1 with a lease: %+v; want admitted", d)
			}
			hook.take()
			d := allow(spend(3))
			if calls := hook.take(); calls["evalsha"] != 1 {
				t.Fatalf("cost 3 after the admission with a lease: Redis saw %v, want one call", calls)
			}
			if d.Allowed || d.Remaining != 0 {
				t.Fatalf("cost 3 after the admission with a lease: %+v; want refused with 0 remaining", d)
			}
		})
	}
}

// TestRefusalCacheExceeded: a request with a check whose cost exceeds its rule's capacity
// is reported Exceeded (waiting will not help), as the store reports it, even when
// another of its checks has a cached refusal.
func TestRefusalCacheExceeded(t *testing.T) {
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c)
	ctx := context.Background()
	a := ratebudget.Check{Rule: ratebudget.Rule{Name: "a", Limit: 3, Window: time.Hour}, Identity: "pat", Cost: 3}
	b := ratebudget.Check{Rule: ratebudget.Rule{Name: "b", Limit: 4, Window: time.Hour}, Identity: "pat", Cost: 5}
	if d, err := l.Allow(ctx, []ratebudget.Check{{Rule: a.Rule, Identity: "pat", Cost: 1}}); err != nil || !d.Allowed {
		t.Fatalf("cost 1 of a: %+v, %v", d, err)
	}
	if d, err := l.Allow(ctx, []ratebudget.Check{a}); err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("cost 3 of a: %+v, %v; want refused with a wait (cached)", d, err)
	}
	d, err := l.Allow(ctx, []ratebudget.Check{a, b})
	if err != nil || d.Allowed || !d.Exceeded || d.Rule != "b" || d.RetryAfter != 0 {
		t.Fatalf("a and b: %+v, %v; want b Exceeded", d, err)
	}
}
