package lua_test

import (
	"context"
	"fmt"
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

// TestRollingLogForm: every event is named "<cumulative cost>:<cost>:<ms>:<base>:<oldest
// ms>" with the ms equal to its score and, since no event left the window, a base of 0
// and the first event's time; events of one millisecond are merged, and the key expires
// when its newest event leaves the window.
func TestRollingLogForm(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 1000, Window: time.Minute}
	key := l.Key(ratebudget.Check{Rule: rule, Identity: "ann", Cost: 1})
	spent := 0
	for i := range 50 {
		cost := int64(1 + i%4)
		d, err := l.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: cost}})
		if err != nil || !d.Allowed {
			t.Fatalf("admission %d: %+v, %v", i, d, err)
		}
		spent += int(cost)
		if d.Remaining != int64(1000-spent) {
			t.Fatalf("admission %d: remaining %d, want %d", i, d.Remaining, 1000-spent)
		}
	}
	acc, prev := 0, -1.0
	zs := rollingLog(t, c, key)
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
	if p := c.PTTL(ctx, key).Val(); p <= 0 || p > time.Minute {
		t.Fatalf("PTTL %v, want (0, 1m]", p)
	}
}

// TestRollingEarlierMembers: a log written in the earlier member form
// ("<16-digit cumulative cost>:<cost>", time only in the score) is still counted, its
// retry time is still found, and new events join it in the current form.
func TestRollingEarlierMembers(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 10, Window: time.Minute}
	chk := func(cost int64) []ratebudget.Check {
		return []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: cost}}
	}
	key := l.Key(chk(1)[0])
	now := serverMillis(t, c)
	// 6 units: 2 at now-30s, 4 at now-10s.
	if err := c.ZAdd(ctx, key,
		redis.Z{Score: float64(now - 30000), Member: fmt.Sprintf("%016d:%d", 2, 2)},
		redis.Z{Score: float64(now - 10000), Member: fmt.Sprintf("%016d:%d", 6, 4)},
	).Err(); err != nil {
		t.Fatal(err)
	}
	c.PExpire(ctx, key, 50*time.Second)
	d, err := l.Allow(ctx, chk(5))
	if err != nil || d.Allowed || d.Remaining != 4 {
		t.Fatalf("cost 5 over 6 spent of 10: %+v, %v; want refused with 4 remaining", d, err)
	}
	// 2 units leave at now-30s+1m: about 30s from now, not later.
	if d.RetryAfter <= 25*time.Second || d.RetryAfter > 30*time.Second {
		t.Fatalf("retry after %v, want about 30s (when the oldest event leaves)", d.RetryAfter)
	}
	d, err = l.Allow(ctx, chk(3))
	if err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("cost 3: %+v, %v; want admitted with 1 remaining", d, err)
	}
	zs := rollingLog(t, c, key)
	if len(zs) != 3 {
		t.Fatalf("log %v, want the two earlier events and a new one", zs)
	}
	if m := zs[2].Member.(string); m != fmt.Sprintf("9:3:%.0f:0:%d", zs[2].Score, now-30000) {
		t.Fatalf("new member %q, want 9:3:<its ms>:0:<the oldest event's ms>", m)
	}
}

// TestRollingRebase: cumulative sums close to 2^46 are rewritten relative to the
// window's oldest event, without changing any outcome.
func TestRollingRebase(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 100, Window: time.Minute}
	chk := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 5}}
	key := l.Key(chk[0])
	now := serverMillis(t, c)
	const high = int64(1)<<46 - 3
	// An aged event, then 10 and 20 units in the window, the newest one's sum 3 below 2^46.
	if err := c.ZAdd(ctx, key,
		redis.Z{Score: float64(now - 90000), Member: fmt.Sprintf("%d:7:%d", high-30, now-90000)},
		redis.Z{Score: float64(now - 20000), Member: fmt.Sprintf("%d:10:%d", high-20, now-20000)},
		redis.Z{Score: float64(now - 10000), Member: fmt.Sprintf("%d:20:%d", high, now-10000)},
	).Err(); err != nil {
		t.Fatal(err)
	}
	c.PExpire(ctx, key, 50*time.Second)
	d, err := l.Allow(ctx, chk)
	if err != nil || !d.Allowed || d.Remaining != 65 {
		t.Fatalf("cost 5 over 30 spent of 100: %+v, %v; want admitted with 65 remaining", d, err)
	}
	zs := rollingLog(t, c, key)
	want := []string{
		fmt.Sprintf("10:10:%d", now-20000),
		fmt.Sprintf("30:20:%d", now-10000),
	}
	if len(zs) != 3 {
		t.Fatalf("log %v, want two rebased events and the new one", zs)
	}
	for i, w := range want {
		if zs[i].Member != w || zs[i].Score != float64(now-20000+10000*int64(i)) {
			t.Fatalf("event %d: %v, want %s at its own score", i, zs[i], w)
		}
	}
	if m := zs[2].Member.(string); m != fmt.Sprintf("35:5:%.0f:0:%d", zs[2].Score, now-20000) {
		t.Fatalf("new event %q, want 35:5:<ms>:0:<the oldest event's ms>", m)
	}
	d, err = l.Allow(ctx, chk)
	if err != nil || !d.Allowed || d.Remaining != 60 {
		t.Fatalf("after the rebase: %+v, %v; want admitted with 60 remaining", d, err)
	}
}

// TestRollingClockAhead: an event ahead of the server's clock (the clock went back)
// takes the new event into its millisecond, and the key lives until that event leaves
// the window.
func TestRollingClockAhead(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 10, Window: 10 * time.Second}
	chk := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 2}}
	key := l.Key(chk[0])
	ahead := serverMillis(t, c) + 5000
	if err := c.ZAdd(ctx, key, redis.Z{Score: float64(ahead), Member: fmt.Sprintf("3:3:%d", ahead)}).Err(); err != nil {
		t.Fatal(err)
	}
	c.PExpire(ctx, key, 15*time.Second)
	start := time.Now()
	d, err := l.Allow(ctx, chk)
	if err != nil || !d.Allowed || d.Remaining != 5 {
		t.Fatalf("cost 2 over 3 spent of 10: %+v, %v; want admitted with 5 remaining", d, err)
	}
	zs := rollingLog(t, c, key)
	if len(zs) != 1 || zs[0].Member != fmt.Sprintf("5:5:%d:0:%d", ahead, ahead) || zs[0].Score != float64(ahead) {
		t.Fatalf("log %v, want one event 5:5:%d:0:%d", zs, ahead, ahead)
	}
	slack := time.Since(start) + 2*time.Millisecond
	if p := c.PTTL(ctx, key).Val(); p > 15*time.Second || p < 15*time.Second-slack {
		t.Fatalf("PTTL %v, want 15s (5s ahead + the window) minus at most %v", p, slack)
	}
}

// TestRollingWindowSlides: once the oldest event that the newest one names has left the
// window, the next admission trims the aged events, reads the oldest event left and
// names it, with the sum before it, in its own event.
func TestRollingWindowSlides(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 100, Window: time.Minute}
	chk := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 5}}
	key := l.Key(chk[0])
	now := serverMillis(t, c)
	a, b, d := now-70000, now-20000, now-10000
	// 7 units that have left the window, then 10 and 20 units, all naming the first event.
	if err := c.ZAdd(ctx, key,
		redis.Z{Score: float64(a), Member: fmt.Sprintf("7:7:%d:0:%d", a, a)},
		redis.Z{Score: float64(b), Member: fmt.Sprintf("17:10:%d:0:%d", b, a)},
		redis.Z{Score: float64(d), Member: fmt.Sprintf("37:20:%d:0:%d", d, a)},
	).Err(); err != nil {
		t.Fatal(err)
	}
	c.PExpire(ctx, key, 50*time.Second)
	dec, err := l.Allow(ctx, chk)
	if err != nil || !dec.Allowed || dec.Remaining != 65 {
		t.Fatalf("cost 5 over 30 spent of 100: %+v, %v; want admitted with 65 remaining", dec, err)
	}
	zs := rollingLog(t, c, key)
	if len(zs) != 3 || zs[0].Score != float64(b) {
		t.Fatalf("log %v, want the aged event trimmed", zs)
	}
	if m := zs[2].Member.(string); m != fmt.Sprintf("42:5:%.0f:7:%d", zs[2].Score, b) {
		t.Fatalf("new event %q, want 42:5:<ms>:7:%d", m, b)
	}
}

// TestRollingNewestNamesTheWindow: while the oldest event that the newest one names is
// in the window, an admission reads only the newest event: one ZRANGE, no trimming
// and no score (counted by the server, which counts commands run by scripts).
func TestRollingNewestNamesTheWindow(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rule := ratebudget.Rule{Name: "r", Algorithm: ratebudget.RollingWindow, Limit: 1000, Window: time.Minute}
	chk := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 1}}
	for range 3 {
		if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
			t.Fatalf("warm-up: %+v, %v", d, err)
		}
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for range n {
		if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	stats := commandStats(t, c)
	want := map[string]float64{"time": n, "zrange": n, "zadd": n, "pexpire": n}
	for cmd, calls := range stats.calls {
		if cmd == "evalsha" || cmd == "eval" || cmd == "zrem" || strings.HasPrefix(cmd, "config") {
			continue // zrem: events of one millisecond are merged
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
// log counting what it counted before, and the event that becomes the newest no longer
// names the window (the refunded admission may have trimmed events it named).
func TestRollingRefund(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithoutRefusalCache())
	rw := ratebudget.Check{Rule: ratebudget.Rule{Name: "rw", Algorithm: ratebudget.RollingWindow, Limit: 10, Window: time.Minute}, Identity: "ann", Cost: 3}
	fw := ratebudget.Check{Rule: ratebudget.Rule{Name: "fw", Limit: 1, Window: time.Minute}, Identity: "bob", Cost: 1}
	if l.Key(rw) == l.Key(fw) {
		t.Fatal("keys collide")
	}
	if d, err := l.Allow(ctx, []ratebudget.Check{rw}); err != nil || !d.Allowed || d.Remaining != 7 {
		t.Fatalf("first admission: %+v, %v", d, err)
	}
	if d, err := l.Allow(ctx, []ratebudget.Check{fw}); err != nil || !d.Allowed {
		t.Fatalf("spending the fixed window: %+v, %v", d, err)
	}
	before := rollingLog(t, c, l.Key(rw))
	if len(before) != 1 || strings.Count(before[0].Member.(string), ":") != 4 {
		t.Fatalf("log %v, want one event naming the window", before)
	}
	// Wait for the next millisecond, so that the refunded event is an event of its own.
	for deadline := time.Now().Add(time.Second); serverMillis(t, c) <= int64(before[0].Score); {
		if time.Now().After(deadline) {
			t.Fatal("the server clock did not move")
		}
	}
	d, err := l.Allow(ctx, []ratebudget.Check{rw, fw})
	if err != nil || d.Allowed || d.Rule != "fw" {
		t.Fatalf("decision: %+v, %v; want refused by fw", d, err)
	}
	after := rollingLog(t, c, l.Key(rw))
	want := fmt.Sprintf("3:3:%.0f", before[0].Score)
	if len(after) != 1 || after[0].Member != want || after[0].Score != before[0].Score {
		t.Fatalf("log after the refund %v, want the first event alone as %s", after, want)
	}
	if d, err := l.Allow(ctx, []ratebudget.Check{rw}); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("after the refund: %+v, %v; want admitted with 4 remaining", d, err)
	}
}
