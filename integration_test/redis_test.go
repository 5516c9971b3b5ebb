package integration_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

func TestConformance(t *testing.T) {
	c := newClient(t, 64)
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		return limitertest.Harness{Limiter: newLimiter(t, c)}
	})
}

// TestConformanceAsTheDemoRuns runs the suite against the container with the options the
// demo and the README's Redis example use: one server and coalescing.
func TestConformanceAsTheDemoRuns(t *testing.T) {
	c := newClient(t, 64)
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		l, err := lua.New(c, lua.WithPrefix(uniquePrefix(t)), lua.WithOneServer(), lua.WithCoalescing(256))
		if err != nil {
			t.Fatal(err)
		}
		return limitertest.Harness{Limiter: l}
	})
}

// barrier releases all n callers of wait at once.
type barrier struct{ wg sync.WaitGroup }

func newBarrier(n int) *barrier { b := &barrier{}; b.wg.Add(n); return b }
func (b *barrier) wait()        { b.wg.Done(); b.wg.Wait() }

// TestSeedCheck reproduces the budget check on independent connections: a split
// GET/INCR overspends, the script admits exactly the limit, a refusal changes nothing,
// and after the window expires the next admission starts at 1.
func TestSeedCheck(t *testing.T) {
	const workers, limit = 16, 5
	const window = time.Minute
	control := newClient(t, 4)
	ctx := ctxT(t)
	clients := make([]*redis.Client, workers)
	for i := range clients {
		clients[i] = newClient(t, 1) // one connection each
		if err := clients[i].Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	prefix := uniquePrefix(t)

	// Split check/update: everyone reads before anyone increments.
	unsafeKey := prefix + ":unsafe"
	if err := control.Set(ctx, unsafeKey, 0, window).Err(); err != nil {
		t.Fatal(err)
	}
	var admittedUnsafe atomicCount
	b := newBarrier(workers)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			observed, err := c.Get(ctx, unsafeKey).Int()
			b.wait()
			if err != nil || observed >= limit {
				return
			}
			if c.Incr(ctx, unsafeKey).Err() == nil {
				admittedUnsafe.add(1)
			}
		}()
	}
	wg.Wait()
	if n, v := admittedUnsafe.get(), control.Get(ctx, unsafeKey).Val(); n != workers || v != "16" {
		t.Fatalf("split GET/INCR admitted %d (counter %s), want %d: the race did not show", n, v, workers)
	}
	t.Logf("split GET/INCR admits %d against a budget of %d", workers, limit)

	// The script, one limiter per connection.
	rule := ratebudget.Rule{Name: "seed", Limit: limit, Window: window}
	check := []ratebudget.Check{{Rule: rule, Identity: "shared", Cost: 1}}
	limiters := make([]ratebudget.Limiter, workers)
	for i, c := range clients {
		l, err := luaNew(c, prefix)
		if err != nil {
			t.Fatal(err)
		}
		limiters[i] = l
	}
	key := keyOf(prefix, check[0])
	decisions := make([]ratebudget.Decision, workers)
	errs := make([]error, workers)
	b = newBarrier(workers)
	for i, l := range limiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.wait()
			decisions[i], errs[i] = l.Allow(ctx, check)
		}()
	}
	wg.Wait()
	var counts []int64
	for i, d := range decisions {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if d.ResetAfter <= 0 || d.ResetAfter > window {
			t.Errorf("ResetAfter %v out of (0, %v]", d.ResetAfter, window)
		}
		if d.Allowed {
			counts = append(counts, limit-d.Remaining)
		} else if d.Remaining != 0 || d.RetryAfter <= 0 {
			t.Errorf("refusal reports %+v, want 5 used and a retry", d)
		}
	}
	slices.Sort(counts)
	if !slices.Equal(counts, []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("admitted counts %v, want each of 1..5 once", counts)
	}
	if v := control.Get(ctx, key).Val(); v != "5" {
		t.Fatalf("counter = %q, want 5", v)
	}
	t.Logf("the script admits %d and refuses %d across independent connections", limit, workers-limit)

	// A refusal spends nothing and does not move the deadline.
	before := control.PTTL(ctx, key).Val()
	d, err := limiters[0].Allow(ctx, check)
	if err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("refusal: %+v, %v", d, err)
	}
	if after := control.PTTL(ctx, key).Val(); after <= 0 || after > before {
		t.Fatalf("PTTL after refusal %v, before %v: want unchanged or lower", after, before)
	}
	if v := control.Get(ctx, key).Val(); v != "5" {
		t.Fatalf("counter after refusal = %q, want 5", v)
	}

	// Shorten the window, wait for real expiry, and start again at 1.
	if !control.PExpire(ctx, key, 50*time.Millisecond).Val() {
		t.Fatal("PEXPIRE failed")
	}
	deadline := time.Now().Add(3 * time.Second)
	for control.Exists(ctx, key).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the shortened window did not expire")
		}
		time.Sleep(5 * time.Millisecond) // polling real expiry
	}
	d, err = limiters[1].Allow(ctx, check)
	if err != nil || !d.Allowed || d.Remaining != limit-1 || d.ResetAfter <= 0 || d.ResetAfter > window {
		t.Fatalf("after expiry: %+v, %v; want the first admission of a new window", d, err)
	}
	if v := control.Get(ctx, key).Val(); v != "1" {
		t.Fatalf("counter after expiry = %q, want 1", v)
	}
}

type atomicCount struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCount) add(d int) { c.mu.Lock(); c.n += d; c.mu.Unlock() }
func (c *atomicCount) get() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// TestScriptFlush: an emptied script cache (restart, failover, SCRIPT FLUSH) heals on the
// next decision, which spends exactly once.
func TestScriptFlush(t *testing.T) {
	c := newClient(t, 4)
	ctx := ctxT(t)
	l := newLimiter(t, c)
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "flush", Algorithm: alg, Limit: 10, Window: time.Minute}, Identity: "id", Cost: 1}}
		for i := int64(1); i <= 3; i++ {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			d, err := l.Allow(ctx, chk)
			if err != nil || !d.Allowed || d.Remaining != 10-i {
				t.Fatalf("%s: decision %d after SCRIPT FLUSH: %+v, %v; want exactly one spend", algname.Of(alg), i, d, err)
			}
		}
	}
	d, err := l.Allow(ctx, []ratebudget.Check{{Rule: ratebudget.Rule{Name: "flush", Limit: 10, Window: time.Minute}, Identity: "id", Cost: 1}})
	if err != nil || d.Remaining != 6 {
		t.Fatalf("without a flush: %+v, %v", d, err)
	}
}

// keyState is a key's raw value and TTL.
type keyState struct {
	typ   string
	value string
	pttl  time.Duration
}

func rawState(t *testing.T, c *redis.Client, key string) keyState {
	t.Helper()
	ctx := ctxT(t)
	s := keyState{typ: c.Type(ctx, key).Val(), pttl: c.PTTL(ctx, key).Val()}
	switch s.typ {
	case "string":
		s.value = c.Get(ctx, key).Val()
	case "zset":
		s.value = fmt.Sprint(c.ZRangeWithScores(ctx, key, 0, -1).Val())
	}
	return s
}

// TestMultiRuleRawState: a refusal by any rule leaves every other rule's raw state (value
// and TTL) as it was, in one script (one identity) and with refunds (several identities).
// The rules are listed in both orders, so that each time rule is refunded by a rule
// decided after it.
func TestMultiRuleRawState(t *testing.T) {
	c := newClient(t, 4)
	for _, algs := range [][]ratebudget.Algorithm{
		{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow},
		{ratebudget.RollingWindow, ratebudget.TokenBucket, ratebudget.FixedWindow},
	} {
		multiRuleRawState(t, c, algs)
	}
}

func multiRuleRawState(t *testing.T, c *redis.Client, algs []ratebudget.Algorithm) {
	for _, several := range []bool{false, true} {
		for _, refuser := range algs {
			t.Run(fmt.Sprintf("%v-first/several=%v/refused-by-%v", algs[0], several, refuser), func(t *testing.T) {
				ctx := ctxT(t)
				l, prefix := newPrefixed(t, c)
				var checks []ratebudget.Check
				for i, alg := range algs {
					id := "mallory"
					if several {
						id = fmt.Sprintf("id-%d", i)
					}
					limit := int64(10)
					if alg == refuser {
						limit = 1
					}
					checks = append(checks, ratebudget.Check{Rule: ratebudget.Rule{Name: "r" + algname.Of(alg), Algorithm: alg, Limit: limit, Window: time.Minute}, Identity: id, Cost: 1})
				}
				// PTTLs may drop, and buckets refill, by the time the test takes from here.
				start := time.Now()
				if d, err := l.Allow(ctx, checks); err != nil || !d.Allowed {
					t.Fatalf("first decision: %+v, %v", d, err)
				}
				before := make([]keyState, len(checks))
				for i := range checks {
					before[i] = rawState(t, c, keyOf(prefix, checks[i]))
				}
				d, err := l.Allow(ctx, checks)
				if err != nil || d.Allowed || d.Rule != "r"+algname.Of(refuser) {
					t.Fatalf("second decision: %+v, %v; want refused by %v", d, err, algname.Of(refuser))
				}
				for i := range checks {
					after := rawState(t, c, keyOf(prefix, checks[i]))
					slack := time.Since(start) + 2*time.Millisecond
					b := before[i]
					if after.typ != b.typ || after.pttl > b.pttl || after.pttl < b.pttl-slack-time.Millisecond {
						t.Errorf("%s: state %+v became %+v", checks[i].Rule.Name, b, after)
					}
					if after.value == b.value {
						continue
					}
					// A refund rewrites a token bucket at the current time: its deficit is
					// the old one less what refilled since (rate units per ms, for at most
					// the time the test took), and it is full again when the old one was.
					if several && checks[i].Rule.Algorithm == ratebudget.TokenBucket && refuser != ratebudget.TokenBucket {
						bd := parseDeficit(t, b.value)
						ad := parseDeficit(t, after.value)
						rate := checks[i].Rule.Limit
						refilled := time.Duration((bd-ad)/rate) * time.Millisecond
						if ad > bd || (bd-ad)%rate != 0 || refilled > slack {
							t.Errorf("%s: bucket %s became %s, want %s less %d per ms for at most %v",
								checks[i].Rule.Name, b.value, after.value, b.value, rate, slack)
						}
						continue
					}
					t.Errorf("%s: value %q became %q", checks[i].Rule.Name, b.value, after.value)
				}
			})
		}
	}
}

func parseDeficit(t *testing.T, v string) int64 {
	t.Helper()
	ds, _, _ := strings.Cut(v, ":") // "<deficit>:<time until full>:<window>"
	d, err := strconv.ParseInt(ds, 10, 64)
	if err != nil || d < 0 {
		t.Fatalf("bucket %q: not a deficit (%v)", v, err)
	}
	return d
}

// TestTTLAudit: after a mix of decisions every key written carries a TTL no longer than
// its rule needs, and a counter found without a TTL is given one.
func TestTTLAudit(t *testing.T) {
	c := newClient(t, 8)
	ctx := ctxT(t)
	l, prefix := newPrefixed(t, c)
	windows := map[string]time.Duration{}
	var all []ratebudget.Check
	for i, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for j, w := range []time.Duration{time.Second, 7 * time.Second, time.Minute} {
			name := fmt.Sprintf("a%d-w%d", i, j)
			r := ratebudget.Rule{Name: name, Algorithm: alg, Limit: 3, Window: w}
			windows[name] = w
			all = append(all, ratebudget.Check{Rule: r, Identity: fmt.Sprintf("u%d", j%2), Scope: "/s", Cost: 1})
		}
	}
	for round := range 5 {
		for i := range all {
			if _, err := l.Allow(ctx, all[i:i+1]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Allow(ctx, all); err != nil { // several groups; refused after round 2
			t.Fatal(err)
		}
		_ = round
	}
	// A counter left without a TTL (e.g. by an older, split implementation) is repaired,
	// by a refusal as well as by an admission.
	fixed := ratebudget.Check{Rule: ratebudget.Rule{Name: "immortal", Limit: 5, Window: time.Second}, Identity: "x", Cost: 1}
	windows["immortal"] = time.Second
	for _, v := range []string{"2", "5"} {
		if err := c.Set(ctx, keyOf(prefix, fixed), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, []ratebudget.Check{fixed})
		if err != nil || d.Allowed != (v == "2") {
			t.Fatalf("immortal counter %s: %+v, %v", v, d, err)
		}
		if p := c.PTTL(ctx, keyOf(prefix, fixed)).Val(); p <= 0 || p > time.Second {
			t.Fatalf("immortal counter %s: PTTL %v after a decision, want (0, 1s]", v, p)
		}
	}

	// One key per rule at most. Keys of the short windows may have expired by now (on a
	// loaded machine the test takes seconds), even between SCAN and PTTL; those of the
	// one-minute windows cannot have, and are all audited.
	seen := map[string]int{}
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		_, rest, _ := strings.Cut(key, "}:")
		name, _, _ := strings.Cut(rest, ":")
		w, ok := windows[name]
		if !ok {
			t.Errorf("unexpected key %q", key)
			continue
		}
		p := c.PTTL(ctx, key).Val()
		if p == -2 { // expired since SCAN
			continue
		}
		if seen[name]++; p <= 0 || p > w {
			t.Errorf("key %q: PTTL %v, want (0, %v]", key, p, w)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for name, w := range windows {
		if n := seen[name]; n > 1 || w == time.Minute && n != 1 {
			t.Errorf("rule %s: %d keys, want one (or none once its %v window passed)", name, n, w)
		}
	}
}

// TestKeysShareSlot: all rule keys of one identity hash to one slot (so one script call
// decides them), and hostile identities give bounded keys and still work.
func TestKeysShareSlot(t *testing.T) {
	c := newClient(t, 4)
	ctx := ctxT(t)
	l, prefix := newPrefixed(t, c)
	// CLUSTER KEYSLOT needs cluster support enabled: ask a private cluster-mode server
	// (it computes slots without owning any).
	slots := redistest.Start(t, "--cluster-enabled", "yes").Client(t)
	hostile := []string{
		"", "alice", strings.Repeat("x", 1<<20), "{a}", "}{", "{}", "a}b{c", "\x00", "a\x00b",
		"a\r\nb", "\r\n*1\r\n$4\r\nPING\r\n", "a:b", "ü{ñ}",
	}
	maxLen := 0
	for _, id := range hostile {
		var checks []ratebudget.Check
		for i, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
			for _, scope := range []string{"", "/v1/{id}", strings.Repeat("}", 1000)} {
				checks = append(checks, ratebudget.Check{
					Rule:     ratebudget.Rule{Name: fmt.Sprintf("rule%d-%d", i, len(checks)), Algorithm: alg, Limit: 2, Window: time.Minute},
					Identity: id, Scope: scope, Cost: 1,
				})
			}
		}
		slot := int64(-1)
		for _, ch := range checks {
			key := keyOf(prefix, ch)
			maxLen = max(maxLen, len(key))
			s, err := slots.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("identity %.20q: key %q in slot %d, others in %d", id, key, s, slot)
			}
			slot = s
		}
		d, err := l.Allow(ctx, checks)
		if err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("identity %.20q: %+v, %v", id, d, err)
		}
	}
	if limit := len(prefix) + 2*22 + 64; maxLen > limit {
		t.Fatalf("longest key %d bytes, want at most %d", maxLen, limit)
	}
	t.Logf("longest key: %d bytes (prefix %d bytes)", maxLen, len(prefix))
}

// TestBytesPerKey measures Redis memory per budget: INFO used_memory before and after
// creating 100k keys in the layout the script writes, pipelined.
func TestBytesPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 300k keys")
	}
	// 300k keys in pipelines of 2000 commands take a few seconds, more on a loaded
	// machine: this test gets a minute and long socket timeouts.
	requireRedis(t)
	opts := clientOptions(redisAddr, 8)
	opts.ReadTimeout, opts.WriteTimeout = 30*time.Second, 30*time.Second
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	l, prefix := newPrefixed(t, c)
	const n = 100_000
	// The keys vanish on their own, but none before the test's minute is up: on a loaded
	// machine writing them took over 20s, and a sample written first had expired.
	const window = 2 * time.Minute
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		rule := ratebudget.Rule{Name: "mem", Algorithm: alg, Limit: 100, Window: window}
		// The reference key, written by the script itself.
		ref := ratebudget.Check{Rule: rule, Identity: "reference", Cost: 1}
		if _, err := l.Allow(ctx, []ratebudget.Check{ref}); err != nil {
			t.Fatal(err)
		}
		refState := rawState(t, c, keyOf(prefix, ref))
		refEnc := c.ObjectEncoding(ctx, keyOf(prefix, ref)).Val()
		refUsage := c.MemoryUsage(ctx, keyOf(prefix, ref)).Val()

		before := usedMemory(t, c)
		now := time.Now().UnixMilli()
		for start := 0; start < n; start += 2000 {
			pipe := c.Pipeline()
			for i := start; i < start+2000; i++ {
				key := keyOf(prefix, ratebudget.Check{Rule: rule, Identity: "user-" + strconv.Itoa(i), Cost: 1})
				switch alg {
				case ratebudget.FixedWindow:
					pipe.Set(ctx, key, "1", window)
				case ratebudget.TokenBucket:
					// One token spent: a deficit of one token (window ms units), its
					// time until full (1.2s) and the window, as the script writes it. The
					// script gives it the TTL until full; the TTL's length does not
					// change the memory a key takes.
					w := window.Milliseconds()
					pipe.Set(ctx, key, fmt.Sprintf("%d:%d:%d", w, w/100, w), window)
				case ratebudget.RollingWindow:
					pipe.ZAdd(ctx, key, redis.Z{Score: float64(now), Member: fmt.Sprintf("%d:%d:%d:%d:%d", 1, 1, now, 0, now)})
					pipe.PExpire(ctx, key, window)
				}
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		after := usedMemory(t, c)
		sample := keyOf(prefix, ratebudget.Check{Rule: rule, Identity: "user-7", Cost: 1})
		if s := rawState(t, c, sample); s.typ != refState.typ || c.ObjectEncoding(ctx, sample).Val() != refEnc {
			t.Fatalf("pipelined key %+v does not match the script's %+v (%s)", s, refState, refEnc)
		}
		t.Logf("%-7v: %6.1f bytes per key (INFO used_memory over %d keys; MEMORY USAGE of one key %d, encoding %s, key %d bytes)",
			alg, float64(after-before)/n, n, refUsage, refEnc, len(keyOf(prefix, ref)))
	}
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
