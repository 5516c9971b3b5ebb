package memory

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/redis/go-redis/v9"
)

// FuzzConvertDeficitRedis: allow.lua converts a token bucket's deficit written under
// another Window exactly as convertDeficit does, for every deficit (0 to 2^53, debt
// included) and pair of windows (1 ms to 366 days). The bucket is written by hand
// without a TTL (so nothing refills) and decided on a real redis-server under a rule of
// rate 1 unit per ms, in decide-only mode with a cost above capacity: its reset is then
// the converted deficit in ms (cut at 2 x full, as decideToken cuts debt), and its
// Remaining is decideToken's for the same budget. settle.lua, which has its own copy of
// the conversion, then gives back give units of a reservation under that rule: the
// bucket it writes (deleted when full) is the one refund writes into the same budget.
func FuzzConvertDeficitRedis(f *testing.F) {
	maxW := maxWindow.Milliseconds()
	for _, s := range [][3]int64{
		{0, 1, maxW}, {1, 1, maxW}, {1, maxW, 1}, {timerule.MaxScaled, 1, maxW}, {timerule.MaxScaled, maxW, 1},
		{timerule.MaxScaled, maxW, maxW - 1}, {timerule.MaxScaled - 1, maxW - 1, maxW}, {timerule.MaxScaled - 1, maxW, maxW - 1},
		{7_200_000, 3_600_000, 60_000}, {maxW - 1, maxW, maxW - 1}, {1 << 43, maxW - 1, maxW},
		{7, 3, 2}, {timerule.MaxScaled, 131072, 131073}, {timerule.MaxScaled - 131071, 131071, 131072},
		{1<<53 - 1, 3, 1<<17 + 1}, {86_400_000 * 200, 3_600_000, 86_400_000}, {5, 2, 1},
		{timerule.MaxScaled / 2, maxW / 2, maxW}, {timerule.MaxScaled/3 + 1, 1 << 34, 3 << 33},
	} {
		f.Add(s[0], s[1], s[2], int64(1))
	}
	f.Add(int64(timerule.MaxScaled), int64(1), maxW, int64(1<<30))
	f.Add(int64(1<<52+3), int64(3), int64(1<<17+1), int64(7))
	allow, err := os.ReadFile("../lua/allow.lua")
	if err != nil {
		f.Fatal(err)
	}
	settleBody, err := os.ReadFile("../lua/settle.lua")
	if err != nil {
		f.Fatal(err)
	}
	c := redistest.Start(f).Client(f)
	ctx := context.Background()
	script := redis.NewScript(string(allow))
	// As the Redis limiter runs it: after allow.lua as a function. Run as a function
	// itself, followed by a GET of what it wrote in the same script: a bucket written
	// with a TTL of a few ms could expire before a later GET (time stands still within a
	// script).
	settle := redis.NewScript("local function allow(KEYS, ARGV)\n" + string(allow) + "\nend\n" +
		"local function settle(KEYS, ARGV)\n" + string(settleBody) + "\nend\n" +
		"local done = settle(KEYS, ARGV)\nreturn {done, redis.call('GET', KEYS[1]) or 'none'}")
	f.Fuzz(func(t *testing.T, d, from, to, give int64) {
		d = int64(uint64(d) % (timerule.MaxScaled + 1))
		from = 1 + int64(uint64(from-1)%uint64(maxW))
		to = 1 + int64(uint64(to-1)%uint64(maxW))
		capacity := min(bound.MaxLimit-1, timerule.MaxScaled/to) // a cost of capacity + 1 is exceeded
		r := ratebudget.Rule{Name: "conv", Algorithm: ratebudget.TokenBucket, Limit: 1, Burst: capacity, Window: timerule.Duration(to)}
		full := capacity * to
		give = 1 + int64(uint64(give-1)%uint64(capacity))

		stored := fmt.Sprintf("%d:%d:%d", d, min(d, 1), from)
		if err := c.Set(ctx, "conv", stored, 0).Err(); err != nil {
			t.Fatal(err)
		}
		v, err := script.Run(ctx, c, []string{"conv"}, "0", "1", "1", strconv.FormatInt(to, 10),
			strconv.FormatInt(capacity, 10), strconv.FormatInt(capacity+1, 10)).Int64Slice()
		if err != nil {
			t.Fatalf("%q read under %dms: %v", stored, to, err)
		}
		want := d
		if from != to && d > 0 {
			want = timerule.ConvertDeficit(d, from, to)
		}
		want = min(want, 2*full)
		if v[3] != want {
			t.Fatalf("%q read under %dms: allow.lua's deficit %d, convertDeficit's %d (cut at 2 x full %d)", stored, to, v[3], want, 2*full)
		}
		const now = 1_700_000_000_000
		b := &budget{algo: ratebudget.TokenBucket, count: d, end: now, expires: now + 1<<60}
		b.setWindow(from)
		if o := decideToken(b, &r, capacity+1, now, false); v[1] != 1 || v[2] != o.Remaining {
			t.Fatalf("%q read under %dms: allow.lua's exceeded %d, remaining %d; decideToken's %+v", stored, to, v[1], v[2], o)
		}

		if err := c.Set(ctx, "conv", stored, 0).Err(); err != nil {
			t.Fatal(err)
		}
		reply, err := settle.Run(ctx, c, []string{"conv"}, "settle", "1", "1", strconv.FormatInt(to, 10),
			strconv.FormatInt(capacity, 10), strconv.FormatInt(give, 10), "0", "0", "0", "-").Slice()
		if err != nil || len(reply) != 2 {
			t.Fatalf("%q given back %d under %dms: %v, %v", stored, give, to, reply, err)
		}
		done, _ := reply[0].([]any)
		got, _ := reply[1].(string)
		if len(done) != 1 || done[0] != int64(1) {
			t.Fatalf("%q given back %d under %dms: %v", stored, give, to, reply[0])
		}
		refund(b, &r, ratebudget.Ticket{}, give, now)
		want = b.count
		if w := fmt.Sprintf("%d:%d:%d", want, want, to); want > 0 && got != w || want == 0 && got != "none" {
			t.Fatalf("%q given back %d under %dms: settle.lua wrote %q, refund a deficit of %d", stored, give, to, got, want)
		}
	})
}
