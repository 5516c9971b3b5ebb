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

// TestRollingLogForm: every event is named "<cumulative cost>:<cost>:<ms>" with the ms
// equal to its score, events of one millisecond are merged, and the key expires when
// its newest event leaves the window.
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
	for _, z := range rollingLog(t, c, key) {
		f := strings.Split(z.Member.(string), ":")
		if len(f) != 3 {
			t.Fatalf("member %q: want three fields", z.Member)
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
	if m := zs[2].Member.(string); m != fmt.Sprintf("9:3:%.0f", zs[2].Score) {
		t.Fatalf("new member %q, want 9:3:<its ms>", m)
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
	if m := zs[2].Member.(string); m != fmt.Sprintf("35:5:%.0f", zs[2].Score) {
		t.Fatalf("new event %q, want 35:5:<ms>", m)
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
	if len(zs) != 1 || zs[0].Member != fmt.Sprintf("5:5:%d", ahead) || zs[0].Score != float64(ahead) {
		t.Fatalf("log %v, want one event 5:5:%d", zs, ahead)
	}
	slack := time.Since(start) + 2*time.Millisecond
	if p := c.PTTL(ctx, key).Val(); p > 15*time.Second || p < 15*time.Second-slack {
		t.Fatalf("PTTL %v, want 15s (5s ahead + the window) minus at most %v", p, slack)
	}
}
