package lua_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// rollingLog reads a rolling window's events, oldest first.
func rollingLog(t *testing.T, c *redis.Client, key string) []redis.Z {
	t.Helper()
	zs, err := c.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return zs
}

// serverMillis is the Redis server's clock in milliseconds.
func serverMillis(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// rollingCase is a limiter (without its refusal cache) on a private server, and one
// check of a rolling window for "ann".
type rollingCase struct {
	c   *redis.Client
	l   *lua.Limiter
	chk []ratebudget.Check
	key string
}

func newRollingCase(t *testing.T, limit int64, window time.Duration, cost int64) rollingCase {
	t.Helper()
	c := redistest.Start(t).Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: limit, Window: window}
	chk := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: cost}}
	return rollingCase{c: c, l: l, chk: chk, key: l.Key(chk[0])}
}

// allow decides the case's check at the given cost.
func (rc rollingCase) allow(t *testing.T, cost int64) ratebudget.Decision {
	t.Helper()
	chk := []ratebudget.Check{rc.chk[0]}
	chk[0].Cost = cost
	d, err := rc.l.Allow(context.Background(), chk)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// writeLog adds hand-written events to the case's log and gives the key ttl.
func (rc rollingCase) writeLog(t *testing.T, ttl time.Duration, events ...redis.Z) {
	t.Helper()
	ctx := context.Background()
	if err := rc.c.ZAdd(ctx, rc.key, events...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.c.PExpire(ctx, rc.key, ttl).Err(); err != nil {
		t.Fatal(err)
	}
}

// spendRefuser spends a fixed window of limit 1 for another identity (another slot) and
// returns its check, which then refuses after the case's group was admitted: a
// decision of both gives the case's spend back.
func (rc rollingCase) spendRefuser(t *testing.T) ratebudget.Check {
	t.Helper()
	fw := ratebudget.Check{Rule: ratebudget.Rule{Name: "fw", Limit: 1, Window: time.Minute}, Identity: "bob", Cost: 1}
	if d, err := rc.l.Allow(context.Background(), []ratebudget.Check{fw}); err != nil || !d.Allowed {
		t.Fatalf("spending the fixed window: %+v, %v", d, err)
	}
	return fw
}

// allowRefunded decides the case's check with fw after it and fails unless fw refused:
// the case's group was admitted, then refunded.
func (rc rollingCase) allowRefunded(t *testing.T, fw ratebudget.Check) {
	t.Helper()
	d, err := rc.l.Allow(context.Background(), []ratebudget.Check{rc.chk[0], fw})
	if err != nil || d.Allowed || d.Rule != "fw" {
		t.Fatalf("decision: %+v, %v; want refused by fw", d, err)
	}
}

// event is a hand-written log event at ms named member.
func event(ms int64, member string) redis.Z { return redis.Z{Score: float64(ms), Member: member} }

// TestRollingLogForm: every event is named "<cumulative cost>:<cost>:<ms>:<base>:<oldest
// ms>" with the ms equal to its score and, since no event left the window, a base of 0
// and the first event's time; events of one millisecond are merged, and the key expires
// when its newest event leaves the window.
func TestRollingLogForm(t *testing.T) {
	rc := newRollingCase(t, 1000, time.Minute, 1)
	spent := 0
	for i := range 50 {
		cost := int64(1 + i%4)
		d := rc.allow(t, cost)
		if !d.Allowed {
			t.Fatalf("admission %d: %+v", i, d)
		}
		spent += int(cost)
		if d.Remaining != int64(1000-spent) {
			t.Fatalf("admission %d: remaining %d, want %d", i, d.Remaining, 1000-spent)
		}
	}
	acc, prev := 0, -1.0
	zs := rollingLog(t, rc.c, rc.key)
	for _, z := range zs {
		f := strings.Split(z.Member.(string), ":")
		if len(f) != 5 || f[3] != "0" || f[4] != fmt.Sprintf("%.0f", zs[0].Score) {
			t.Fatalf("member %q: want five fields ending in :0:<the first event's ms>", z.Member)
		}
		a, err1 := strconv.Atoi(f[0])
		cost, err2 := strconv.Atoi(f[1])
		ms, err3 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil || err3 != nil || ms != z.Score {
			t.Fatalf("member %q at score %.0f: want decimal fields ending in the score", z.Member, z.Score)
		}
		if z.Score <= prev {
			t.Fatalf("two events at %.0f ms: events of one millisecond must be merged", z.Score)
		}
		if acc += cost; a != acc {
			t.Fatalf("member %q: cumulative cost %d, want %d", z.Member, a, acc)
		}
		prev = z.Score
	}
	if acc != spent {
		t.Fatalf("log holds %d units, want %d", acc, spent)
	}
	if p := rc.c.PTTL(context.Background(), rc.key).Val(); p <= 0 || p > time.Minute {
		t.Fatalf("PTTL %v, want (0, 1m]", p)
	}
}

// TestRollingClockAhead: an event ahead of the server's clock (the clock went back)
// takes the new event into its millisecond, and the key lives until that event leaves
// the window.
func TestRollingClockAhead(t *testing.T) {
	rc := newRollingCase(t, 10, 10*time.Second, 2)
	start := time.Now() // the TTL may drop by the time the test takes from here
	ahead := serverMillis(t, rc.c) + 5000
	rc.writeLog(t, 15*time.Second, event(ahead, fmt.Sprintf("3:3:%d:0:%d", ahead, ahead)))
	if d := rc.allow(t, 2); !d.Allowed || d.Remaining != 5 {
		t.Fatalf("cost 2 over 3 spent of 10: %+v; want admitted with 5 remaining", d)
	}
	zs := rollingLog(t, rc.c, rc.key)
	if len(zs) != 1 || zs[0].Member != fmt.Sprintf("5:5:%d:0:%d", ahead, ahead) || zs[0].Score != float64(ahead) {
		t.Fatalf("log %v, want one event 5:5:%d:0:%d", zs, ahead, ahead)
	}
	p := rc.c.PTTL(context.Background(), rc.key).Val()
	if slack := time.Since(start) + 2*time.Millisecond; p > 15*time.Second || p < 15*time.Second-slack {
		t.Fatalf("PTTL %v, want 15s (5s ahead + the window) minus at most %v", p, slack)
	}
}

// TestRollingMergeKeepsTTL: admissions merged into the newest event (here one ahead of
// the server's clock, so that every admission merges) replace it without emptying the
// set and without a PEXPIRE: the key keeps the TTL that ends when that event leaves the
// window.
func TestRollingMergeKeepsTTL(t *testing.T) {
	rc := newRollingCase(t, 100, 10*time.Second, 2)
	start := time.Now() // the TTL may drop by the time the test takes from here
	ahead := serverMillis(t, rc.c) + 5000
	rc.writeLog(t, 15*time.Second, event(ahead, fmt.Sprintf("3:3:%d:0:%d", ahead, ahead)))
	if err := rc.c.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if d := rc.allow(t, 2); !d.Allowed || d.Remaining != int64(100-3-2*(i+1)) {
			t.Fatalf("admission %d: %+v", i, d)
		}
	}
	stats := commandStats(t, rc.c)
	if stats.calls["zrem"] != 5 || stats.calls["pexpire"] != 0 {
		t.Fatalf("zrem %v, pexpire %v for 5 merged admissions; want 5 and 0", stats.calls["zrem"], stats.calls["pexpire"])
	}
	zs := rollingLog(t, rc.c, rc.key)
	if len(zs) != 1 || zs[0].Member != fmt.Sprintf("13:13:%d:0:%d", ahead, ahead) {
		t.Fatalf("log %v, want one event 13:13:%d:0:%d", zs, ahead, ahead)
	}
	p := rc.c.PTTL(context.Background(), rc.key).Val()
	if slack := time.Since(start) + 2*time.Millisecond; p > 15*time.Second || p < 15*time.Second-slack {
		t.Fatalf("PTTL %v, want 15s (5s ahead + the window) minus at most %v", p, slack)
	}
}

// TestRollingWindowSlides: once the oldest event that the newest one names has left the
// window, the next admission trims the aged events, reads the oldest event left and
// names it, with the sum before it, in its own event.
func TestRollingWindowSlides(t *testing.T) {
	rc := newRollingCase(t, 100, time.Minute, 5)
	now := serverMillis(t, rc.c)
	a, b, d := now-70000, now-20000, now-10000
	// 7 units that have left the window, then 10 and 20 units, all naming the first event.
	rc.writeLog(t, 50*time.Second,
		event(a, fmt.Sprintf("7:7:%d:0:%d", a, a)),
		event(b, fmt.Sprintf("17:10:%d:0:%d", b, a)),
		event(d, fmt.Sprintf("37:20:%d:0:%d", d, a)))
	if dec := rc.allow(t, 5); !dec.Allowed || dec.Remaining != 65 {
		t.Fatalf("cost 5 over 30 spent of 100: %+v; want admitted with 65 remaining", dec)
	}
	zs := rollingLog(t, rc.c, rc.key)
	if len(zs) != 3 || zs[0].Score != float64(b) {
		t.Fatalf("log %v, want the aged event trimmed", zs)
	}
	if m := zs[2].Member.(string); m != fmt.Sprintf("42:5:%.0f:7:%d", zs[2].Score, b) {
		t.Fatalf("new event %q, want 42:5:<ms>:7:%d", m, b)
	}
}

// TestRollingNewestNamesTheWindow: while the oldest event that the newest one names is
// in the window, an admission reads only the newest event: one ZRANGE, no trimming
// and no score (counted by the server, which counts commands run by scripts); and it
// sets the key's TTL only when it adds an event, not when it merges into the newest.
func TestRollingNewestNamesTheWindow(t *testing.T) {
	rc := newRollingCase(t, 1000, time.Minute, 1)
	for range 3 {
		if d := rc.allow(t, 1); !d.Allowed {
			t.Fatalf("warm-up: %+v", d)
		}
	}
	if err := rc.c.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for range n {
		if d := rc.allow(t, 1); !d.Allowed {
			t.Fatalf("%+v", d)
		}
	}
	stats := commandStats(t, rc.c)
	// An admission merged into the newest event (of the same millisecond) replaces it
	// (ZREM) and keeps the key's TTL; any other sets the TTL (PEXPIRE).
	merged := stats.calls["zrem"]
	want := map[string]float64{"time": n, "zrange": n, "zadd": n, "pexpire": n - merged}
	for cmd, calls := range stats.calls {
		if cmd == "evalsha" || cmd == "eval" || cmd == "zrem" || strings.HasPrefix(cmd, "config") {
			continue
		}
		if calls != want[cmd] {
			t.Errorf("%s called %v times by %d admissions, want %v", cmd, calls, n, want[cmd])
		}
	}
	for cmd, calls := range want {
		if stats.calls[cmd] != calls {
			t.Errorf("%s called %v times by %d admissions, want %v", cmd, stats.calls[cmd], n, calls)
		}
	}
}

// TestRollingRefund: an admission given back because a later group refused leaves the
// log as it was before (an admission that trimmed nothing named the same window as the
// event before it, which stays as it is), and the key keeps its TTL.
func TestRollingRefund(t *testing.T) {
	rc := newRollingCase(t, 10, time.Minute, 3)
	hook := countCommands(rc.c)
	ctx := context.Background()
	if d := rc.allow(t, 3); !d.Allowed || d.Remaining != 7 {
		t.Fatalf("first admission: %+v", d)
	}
	fw := rc.spendRefuser(t)
	before := rollingLog(t, rc.c, rc.key)
	if len(before) != 1 || strings.Count(before[0].Member.(string), ":") != 4 {
		t.Fatalf("log %v, want one event naming the window", before)
	}
	// Wait for the next millisecond, so that the refunded event is an event of its own.
	for deadline := time.Now().Add(time.Second); serverMillis(t, rc.c) <= int64(before[0].Score); {
		if time.Now().After(deadline) {
			t.Fatal("the server clock did not move")
		}
	}
	hook.take()
	rc.allowRefunded(t, fw)
	// Two allow calls and a refund (EVAL too, if the refund script was not loaded yet).
	if got := hook.take(); got["evalsha"] != 3 {
		t.Fatalf("client sent %v, want two allow calls and a refund", got)
	}
	after := rollingLog(t, rc.c, rc.key)
	if len(after) != 1 || after[0] != before[0] {
		t.Fatalf("log after the refund %v, want it as before: %v", after, before)
	}
	ttl := rc.c.PTTL(ctx, rc.key).Val()
	if ttl <= 0 || ttl > time.Minute {
		t.Fatalf("PTTL after the refund %v, want the key to keep its TTL (at most the window)", ttl)
	}
	if d := rc.allow(t, 3); !d.Allowed || d.Remaining != 4 {
		t.Fatalf("after the refund: %+v; want admitted with 4 remaining", d)
	}
}

// TestRollingRefundAfterTrim: when the refunded admission trimmed events that had left
// the window, the event that becomes the newest names a window whose oldest event is
// gone; the refund drops that name (allow.lua then reads the oldest event again), keeps
// the key's TTL, and the next decision counts what is in the window.
func TestRollingRefundAfterTrim(t *testing.T) {
	rc := newRollingCase(t, 10, 10*time.Second, 3)
	fw := rc.spendRefuser(t)
	// An aged event of cost 2, then one of cost 3 in the window that still names it.
	now := serverMillis(t, rc.c)
	aged, inside := now-15000, now-5000
	rc.writeLog(t, 5*time.Second,
		event(aged, fmt.Sprintf("2:2:%d:0:%d", aged, aged)),
		event(inside, fmt.Sprintf("5:3:%d:0:%d", inside, aged)))
	rc.allowRefunded(t, fw)
	zs := rollingLog(t, rc.c, rc.key)
	if want := fmt.Sprintf("5:3:%d", inside); len(zs) != 1 || zs[0].Member != want {
		t.Fatalf("log after the refund %v, want the event in the window alone as %s", zs, want)
	}
	if ttl := rc.c.PTTL(context.Background(), rc.key).Val(); ttl <= 0 || ttl > 5*time.Second {
		t.Fatalf("PTTL after the refund %v, want the key to keep its TTL (at most 5s)", ttl)
	}
	if d := rc.allow(t, 3); !d.Allowed || d.Remaining != 4 {
		t.Fatalf("after the refund: %+v; want admitted with 4 remaining (3 in the window)", d)
	}
}

// TestRollingRefundMergedKeepsTTL: a refund that gives back part of a merged event (the
// refunded admission shared its millisecond with earlier ones) rewrites that event; when
// it is the log's only event, the key must still expire when it leaves the window, as
// allow.lua left it. (Rewriting by ZREM, then ZADD, would empty the set: Redis deletes the
// key with its TTL, and ZADD creates a key that never expires.)
func TestRollingRefundMergedKeepsTTL(t *testing.T) {
	rc := newRollingCase(t, 10, 10*time.Second, 1)
	fw := rc.spendRefuser(t)
	// An event ahead of the server's clock takes the next admission into its millisecond.
	ahead := serverMillis(t, rc.c) + 5000
	rc.writeLog(t, 15*time.Second, event(ahead, fmt.Sprintf("2:2:%d:0:%d", ahead, ahead)))
	rc.allowRefunded(t, fw)
	zs := rollingLog(t, rc.c, rc.key)
	if want := fmt.Sprintf("2:2:%d:0:%d", ahead, ahead); len(zs) != 1 || zs[0].Member != want {
		t.Fatalf("log after the refund %v, want the event given back as %s", zs, want)
	}
	if ttl := rc.c.PTTL(context.Background(), rc.key).Val(); ttl <= 0 || ttl > 15*time.Second {
		t.Fatalf("PTTL after the refund %v, want the key to keep its TTL (at most 15s)", ttl)
	}
}

// logEvent is one parsed rolling-window event.
type logEvent struct {
	ms, acc, cost  int64
	base, oldestMS int64 // -1 when the member does not name the window
}

func parseLog(t *testing.T, zs []redis.Z) []logEvent {
	t.Helper()
	evs := make([]logEvent, len(zs))
	for i, z := range zs {
		f := strings.Split(z.Member.(string), ":")
		if len(f) != 3 && len(f) != 5 {
			t.Fatalf("member %q: want 3 or 5 fields", z.Member)
		}
		n := make([]int64, len(f))
		for j := range f {
			v, err := strconv.ParseInt(f[j], 10, 64)
			if err != nil {
				t.Fatalf("member %q: %v", z.Member, err)
			}
			n[j] = v
		}
		if float64(n[2]) != z.Score {
			t.Fatalf("member %q at score %.0f: its time is not its score", z.Member, z.Score)
		}
		evs[i] = logEvent{ms: n[2], acc: n[0], cost: n[1], base: -1, oldestMS: -1}
		if len(f) == 5 {
			evs[i].base, evs[i].oldestMS = n[3], n[4]
		}
	}
	return evs
}

// TestRollingRandomWalk: random costs at random moments on a short window. After every
// admission the log must account for it exactly: the new event is the newest, the
// events in its window sum to limit - remaining, cumulative sums step by each event's
// cost, and the newest event names the window's oldest event and the sum before it.
// Every refusal's Remaining must match a sum of the log's events that were in the
// window at some moment of the call.
func TestRollingRandomWalk(t *testing.T) {
	const limit = 20
	base := newRollingCase(t, limit, time.Minute, 1)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	})
	// Every decision's checks hold whatever the timing; the walk's coverage does not: on
	// a machine so slow that the window passes between most calls, nothing is refused.
	// Such a walk is repeated on a fresh budget with the window doubled.
	window := 40 * time.Millisecond
	for run := 1; ; run++ {
		r := ratebudget.Rule{Name: fmt.Sprintf("r%d", window.Milliseconds()), Algorithm: ratebudget.RollingWindow, Limit: limit, Window: window}
		chk := []ratebudget.Check{{Rule: r, Identity: "ann", Cost: 1}}
		rc := rollingCase{c: base.c, l: base.l, chk: chk, key: base.l.Key(chk[0])}
		admitted, refused := rollingWalk(t, rc, rng, limit, window)
		if admitted >= 50 && refused >= 50 {
			return
		}
		if run == 6 {
			t.Fatalf("%d admitted and %d refused with a %v window: the walk did not exercise both", admitted, refused, window)
		}
		t.Logf("%d admitted and %d refused with a %v window: again with %v", admitted, refused, window, 2*window)
		window *= 2
	}
}

// rollingWalk is one walk of TestRollingRandomWalk; it returns how many decisions were
// admitted and refused.
func rollingWalk(t *testing.T, rc rollingCase, rng *rand.Rand, limit int64, window time.Duration) (admitted, refused int) {
	t.Helper()
	w := window.Milliseconds()
	for i := range 400 {
		cost := 1 + rng.Int64N(6)
		before := serverMillis(t, rc.c)
		d := rc.allow(t, cost)
		evs := parseLog(t, rollingLog(t, rc.c, rc.key))
		if d.Allowed {
			admitted++
			newest := evs[len(evs)-1]
			at := newest.ms
			sum, oldest := int64(0), -1
			for j, e := range evs {
				if e.ms > at-w {
					sum += e.cost
					if oldest < 0 {
						oldest = j
					}
				}
				if j > 0 && e.acc != evs[j-1].acc+e.cost {
					t.Fatalf("decision %d: event %+v does not follow %+v by its cost", i, e, evs[j-1])
				}
			}
			if got := limit - d.Remaining; got != sum {
				t.Fatalf("decision %d (cost %d): limit - remaining = %d, events in (%d, %d] sum to %d: %+v", i, cost, got, at-w, at, sum, evs)
			}
			o := evs[oldest]
			if newest.base != o.acc-o.cost || newest.oldestMS != o.ms {
				t.Fatalf("decision %d: newest %+v does not name the oldest event in its window %+v", i, newest, o)
			}
			if oldest != 0 {
				t.Fatalf("decision %d: aged events were not trimmed: %+v", i, evs)
			}
		} else {
			refused++
			if d.RetryAfter <= 0 || d.RetryAfter > window {
				t.Fatalf("decision %d: refused with retry after %v", i, d.RetryAfter)
			}
			after := serverMillis(t, rc.c)
			ok := false
			for now := before; now <= after && !ok; now++ {
				sum := int64(0)
				for _, e := range evs {
					if e.ms > now-w && e.ms <= now {
						sum += e.cost
					}
				}
				ok = limit-d.Remaining == sum && sum+cost > limit
			}
			if !ok {
				t.Fatalf("decision %d (cost %d): refused with %d remaining; no moment in [%d, %d] matches the log %+v", i, cost, d.Remaining, before, after, evs)
			}
		}
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond) // let the window slide
		}
	}
	return admitted, refused
}

// TestRollingRebase: cumulative sums about to pass 2^46 are rewritten relative to the
// window's oldest event, aged events trimmed, without changing any outcome.
func TestRollingRebase(t *testing.T) {
	const near = int64(1)<<46 - 3
	for _, tc := range []struct {
		name string
		log  func(now int64) []redis.Z
		// spent is the window's sum before the two admissions of 5; want is the log
		// after the first, bar its new event.
		spent int64
		want  func(now int64) []string
	}{
		{"near 2^46", func(now int64) []redis.Z {
			return []redis.Z{ // an aged event, then 10 and 20 units
				event(now-90000, fmt.Sprintf("%d:7:%d", near-30, now-90000)),
				event(now-20000, fmt.Sprintf("%d:10:%d", near-20, now-20000)),
				event(now-10000, fmt.Sprintf("%d:20:%d", near, now-10000)),
			}
		}, 30, func(now int64) []string {
			return []string{fmt.Sprintf("10:10:%d", now-20000), fmt.Sprintf("30:20:%d", now-10000)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := newRollingCase(t, 100, time.Minute, 5)
			now := serverMillis(t, rc.c)
			rc.writeLog(t, 50*time.Second, tc.log(now)...)
			if d := rc.allow(t, 5); !d.Allowed || d.Remaining != 95-tc.spent {
				t.Fatalf("cost 5 over %d spent of 100: %+v; want admitted with %d remaining", tc.spent, d, 95-tc.spent)
			}
			zs := rollingLog(t, rc.c, rc.key)
			want := tc.want(now)
			want = append(want, fmt.Sprintf("%d:5:%.0f:0:%d", tc.spent+5, zs[len(zs)-1].Score, now-20000))
			if len(zs) != len(want) {
				t.Fatalf("log %v, want %v", zs, want)
			}
			for i, w := range want {
				if zs[i].Member != w {
					t.Fatalf("log %v, want %v", zs, want)
				}
			}
			if zs[0].Score != float64(now-20000) || zs[1].Score != float64(now-10000) {
				t.Fatalf("log %v: the rebased events moved", zs)
			}
			if d := rc.allow(t, 5); !d.Allowed || d.Remaining != 90-tc.spent {
				t.Fatalf("after the rebase: %+v; want admitted with %d remaining", d, 90-tc.spent)
			}
		})
	}
}

// TestRollingTrimIsBounded: Redis runs nothing else while a script runs, so one decision
// must not free an unbounded number of events. A burst that wrote one event per
// millisecond, followed by a quiet spell, leaves many events that have left the window
// behind a newer one that has not: each decision trims at most 1,024 of them (freeing
// 100,000 in one script took 33 ms, blocking the server), counts exactly what is in the
// window meanwhile, and later decisions trim the rest.
func TestRollingTrimIsBounded(t *testing.T) {
	const aged, limit = 3000, 100_000
	const window = time.Minute
	rc := newRollingCase(t, limit, window, 1)
	ctx := context.Background()
	now := serverMillis(t, rc.c)
	// Events of cost 1 at t0, t0+1, ... (all aged, naming t0 as the window's oldest),
	// then one of cost 5 in the window that still names t0, a window gone by.
	t0 := now - window.Milliseconds() - 10_000 - aged
	evs := make([]redis.Z, 0, aged+1)
	for i := range int64(aged) {
		evs = append(evs, event(t0+i, fmt.Sprintf("%d:1:%d:0:%d", i+1, t0+i, t0)))
	}
	inside := now - 1000
	evs = append(evs, event(inside, fmt.Sprintf("%d:5:%d:0:%d", aged+5, inside, t0)))
	rc.writeLog(t, window, evs...)

	// The aged events left: only they have a score up to t0+aged-1.
	agedLeft := func() int64 {
		n, err := rc.c.ZCount(ctx, rc.key, "-inf", strconv.FormatInt(t0+aged-1, 10)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	left := agedLeft()
	for i := 0; left > 0; i++ {
		if i == (aged+1023)/1024 {
			t.Fatalf("after %d decisions %d aged events are left, want them trimmed", i, left)
		}
		d := rc.allow(t, 1)
		// In the window: the event of cost 5 and this test's admissions.
		if want := int64(limit - 5 - (i + 1)); !d.Allowed || d.Remaining != want {
			t.Fatalf("decision %d: %+v, want admitted with %d remaining", i, d, want)
		}
		n := agedLeft()
		if left-n > 1024 {
			t.Fatalf("decision %d trimmed %d events in one script, want at most 1024", i, left-n)
		}
		left = n
	}
	if ttl := rc.c.PTTL(ctx, rc.key).Val(); ttl <= 0 || ttl > window {
		t.Fatalf("PTTL %v, want at most the window", ttl)
	}
}
