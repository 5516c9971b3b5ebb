package timerule

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/redistest"
)

// The tests in this file hold each function of the package against its twin in the
// Lua scripts, run on a real Redis (see also memory's FuzzConvertDeficitRedis, which
// holds ConvertDeficit against both scripts). A budget's state is written by the same
// script that then runs allow.lua as a function. A key's PTTL reads the clock (Redis
// 7.0 does not stop it within a script): the script reads the PTTL of a probe key
// before and after, and a run across a millisecond's tick is run again, so that every
// PTTL the script reads is the key's read before allow.lua.

// twinScript returns allow.lua run as a function after a SET of KEYS[1] to ARGV[1] with
// PX ARGV[2]: ARGV[3] is the number of arguments of the first allow call, which follow;
// the arguments of a second call, if any, come after those. It replies each call's
// reply, then the key's value ('none': no key) and PTTL after them, the key's PTTL
// before them, and 1 when the probe KEYS[2] read the same PTTL before and after all of
// it (no millisecond ticked), else 0.
func twinScript(tb testing.TB) *redis.Script {
	allow, err := os.ReadFile("../../lua/allow.lua")
	if err != nil {
		tb.Fatal(err)
	}
	return redis.NewScript("local function allow(KEYS, ARGV)\n" + string(allow) + "\nend\n" + `
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', '100000000')
local probe = redis.call('PTTL', KEYS[2])
local before = redis.call('PTTL', KEYS[1])
local keys = {KEYS[1]}
local n = tonumber(ARGV[3])
local a, b = {}, {}
for i = 4, 3 + n do a[#a + 1] = ARGV[i] end
for i = 4 + n, #ARGV do b[#b + 1] = ARGV[i] end
local out = {allow(keys, a)}
if #b > 0 then out[2] = allow(keys, b) else out[2] = {} end
out[3] = redis.call('GET', KEYS[1]) or 'none'
out[4] = redis.call('PTTL', KEYS[1])
out[5] = before
out[6] = 0
if redis.call('PTTL', KEYS[2]) == probe then out[6] = 1 end
return out`)
}

// twin is one run of twinScript: the two calls' replies, the value and PTTL after, the
// PTTL before (every PTTL the calls read).
type twin struct {
	first, second []int64
	value         string
	pttl, before  int64
}

func runTwin(tb testing.TB, c *redis.Client, s *redis.Script, value string, px int64, first, second []string) twin {
	tb.Helper()
	args := []any{value, strconv.FormatInt(px, 10), strconv.Itoa(len(first))}
	for _, a := range append(first, second...) {
		args = append(args, a)
	}
	var v []any
	for try := 0; ; try++ {
		var err error
		v, err = s.Run(context.Background(), c, []string{"twin", "twin-probe"}, args...).Slice()
		if err != nil || len(v) != 6 {
			tb.Fatalf("%q PX %d, %v then %v: %v, %v", value, px, first, second, v, err)
		}
		if v[5] == int64(1) {
			break
		}
		if try == 100 {
			tb.Fatalf("%q PX %d, %v then %v: a millisecond ticked within 100 runs", value, px, first, second)
		}
	}
	ints := func(x any) []int64 {
		xs, _ := x.([]any)
		out := make([]int64, len(xs))
		for i, e := range xs {
			n, ok := e.(int64)
			if !ok {
				tb.Fatalf("%q PX %d, %v then %v: element %d of %v is %T", value, px, first, second, i, xs, e)
			}
			out[i] = n
		}
		return out
	}
	t := twin{first: ints(v[0]), second: ints(v[1]), pttl: v[3].(int64), before: v[4].(int64)}
	t.value, _ = v[2].(string)
	return t
}

// logInt64 draws an integer of 1 to hi, spread over its bit lengths.
func logInt64(rng *rand.Rand, hi int64) int64 {
	n := 1 + rng.Int64N(1<<rng.IntN(63))
	if n <= 0 || n > hi {
		n = 1 + rng.Int64N(hi)
	}
	return n
}

// tokenCase is a token bucket as allow.lua reads it: the deficit d (scaled units of
// the window w ms) and time until full t written px ms before its expiry, decided under
// rate, capacity and w at a cost.
type tokenCase struct{ d, t, px, rate, capa, w, cost int64 }

func randomTokenCase(rng *rand.Rand) tokenCase {
	var c tokenCase
	c.w = logInt64(rng, maxWindow)
	c.capa = logInt64(rng, min(bound.MaxLimit-1, MaxScaled/c.w))
	c.rate = logInt64(rng, bound.MaxLimit)
	full := c.capa * c.w
	switch rng.IntN(4) {
	case 0:
		c.d = rng.Int64N(full + 1)
	case 1:
		c.d = min(full+rng.Int64N(full+1), MaxScaled) // debt
	case 2:
		c.d = rng.Int64N(MaxScaled + 1) // beyond debt's bound: a lowered capacity
	default:
		c.d = logInt64(rng, MaxScaled)
	}
	c.t = CeilDiv(c.d, c.rate) // as allow.lua writes it
	if rng.IntN(3) == 0 {
		c.t = rng.Int64N(c.d + 1) // written at another rate
	}
	switch rng.IntN(3) {
	case 0:
		c.px = 1 + rng.Int64N(c.t+1) // refilled some
	case 1:
		c.px = c.t + logInt64(rng, 1<<40) // the clock went back
	default:
		c.px = logInt64(rng, 1<<45)
	}
	c.cost = 1 + rng.Int64N(c.capa+1)
	if rng.IntN(4) == 0 {
		c.cost = 1 + rng.Int64N(min(c.capa, 16))
	}
	return c
}

// want is the reply of allow.lua deciding c in mode '0' (decide only) and in mode '1'
// (spend), and the value and PTTL it leaves, by this package's functions. The bucket's
// timestamp is px - t ms ahead of now (0): SinceWrite reads the lag or the refill.
func (c tokenCase) want() (decide, spend []int64, value string, pttl int64) {
	full, need := c.capa*c.w, c.cost*c.w
	elapsed, lag := SinceWrite(c.px-c.t, 0)
	level := full - RefilledDeficit(c.d, elapsed, c.rate, full)
	reset := TokenWait(full, level, lag, c.rate)
	value, pttl = fmt.Sprintf("%d:%d:%d", c.d, c.t, c.w), c.px
	switch {
	case c.cost > c.capa:
		decide = []int64{0, 1, Tokens(level, c.w), UntilExpiry(reset, c.px), 0, 0}
		spend = decide
	case level < need:
		decide = []int64{0, 0, Tokens(level, c.w), UntilExpiry(reset, c.px), UntilExpiry(TokenWait(need, level, lag, c.rate), c.px), 0}
		spend = decide
	default:
		decide = []int64{1, 0, Tokens(level-need, c.w) + c.cost, reset, 0, 0}
		after := TokenWait(full, level-need, lag, c.rate)
		spend = []int64{1, 0, Tokens(level-need, c.w), after, 0, 0}
		value, pttl = fmt.Sprintf("%d:%d:%d", full-(level-need), after-lag, c.w), after
	}
	return decide, spend, value, pttl
}

func (c tokenCase) args(mode string) []string {
	return []string{mode, "1", strconv.FormatInt(c.rate, 10), strconv.FormatInt(c.w, 10),
		strconv.FormatInt(c.capa, 10), strconv.FormatInt(c.cost, 10)}
}

// TestTokenBucketTwinRedis: allow.lua reads, refills, waits for and spends a token bucket
// as SinceWrite, RefilledDeficit, TokenWait, Tokens and CeilDiv compute it, for buckets
// refilled in part, refilled whole, in debt, beyond debt's bound, read after the clock
// went back, and written at another rate; costs that fit, wait and exceed the capacity;
// at every scale (windows of 1 ms to 366 days, rates and capacities to 2^40, deficits to
// 2^53): the reply of a decision only and of a spend, and the bucket the spend writes.
func TestTokenBucketTwinRedis(t *testing.T) {
	c := redistest.Start(t).Client(t)
	s := twinScript(t)
	rng := rand.New(rand.NewPCG(27, 3))
	cases := []tokenCase{
		{d: 0, t: 0, px: 1, rate: 1, capa: 1, w: 1, cost: 1},
		{d: 10, t: 10, px: 4, rate: 1, capa: 10, w: 1, cost: 7},                  // 6 refilled, 4 short: fits 6
		{d: 18_000, t: 5, px: 9, rate: 3600, capa: 5, w: 3600, cost: 1},          // the clock went back 4 ms
		{d: 2 * 36, t: 2, px: 2, rate: 36, capa: 1, w: 36, cost: 1},              // in debt a whole capacity
		{d: 5 * 36, t: 5, px: 1, rate: 36, capa: 1, w: 36, cost: 2},              // beyond the bound, exceeded
		{d: MaxScaled, t: 1, px: 1, rate: 1, capa: 1 << 20, w: 1 << 33, cost: 1}, // refilled at another rate
	}
	for range 3000 {
		cases = append(cases, randomTokenCase(rng))
	}
	beyond := 0
	for _, k := range cases {
		if _, lag := SinceWrite(k.px-k.t, 0); lag+CeilDiv(min(k.d, 2*k.capa*k.w), k.rate) > MaxScaled {
			// A wait beyond 2^53 ms (285,000 years, after the clock went back by years) is
			// rounded by Lua's numbers, exact below 2^53 only.
			beyond++
			continue
		}
		px := k.px
		got := runTwin(t, c, s, fmt.Sprintf("%d:%d:%d", k.d, k.t, k.w), px, k.args("0"), nil)
		k.px = got.before // the clock may have ticked since the SET
		decide, _, _, _ := k.want()
		if fmt.Sprint(got.first) != fmt.Sprint(decide) {
			t.Fatalf("%+v decided: allow.lua %v, timerule %v", k, got.first, decide)
		}
		got = runTwin(t, c, s, fmt.Sprintf("%d:%d:%d", k.d, k.t, k.w), px, k.args("1"), nil)
		k.px = got.before
		_, spend, value, pttl := k.want()
		if fmt.Sprint(got.first) != fmt.Sprint(spend) || got.value != value || got.pttl != pttl {
			t.Fatalf("%+v spent: allow.lua %v, %q PX %d; timerule %v, %q PX %d", k, got.first, got.value, got.pttl, spend, value, pttl)
		}
	}
	if beyond > len(cases)/10 {
		t.Fatalf("%d of %d cases wait beyond 2^53 ms: too few were compared", beyond, len(cases))
	}
}

// TestUnspentTwinRedis: an admission's outcome given back with Unspent, from allow.lua's
// reply in mode '4' (the spend, and each check's reset before it), is what allow.lua
// reports for the same budget when it decides without spending, under a fixed window
// and a token bucket of every state; GivenBack's, from the spend's outcome alone, too,
// within a millisecond (and 1 ns per unit) for a token bucket's reset. (A rolling window's and a lease's waits are read
// from the server's TIME, which moves within a script: TestSameOutcomesAsMemory in
// package lua holds them, through the refunds that Unspent reports.)
func TestUnspentTwinRedis(t *testing.T) {
	c := redistest.Start(t).Client(t)
	s := twinScript(t)
	rng := rand.New(rand.NewPCG(27, 4))
	checked := 0
	for i := range 3000 {
		var value string
		var px int64
		var args func(mode string) []string
		var rule ratebudget.Rule
		if i%2 == 0 {
			k := randomTokenCase(rng)
			value, px, args = fmt.Sprintf("%d:%d:%d", k.d, k.t, k.w), k.px, k.args
			rule = ratebudget.Rule{Algorithm: ratebudget.TokenBucket, Limit: k.rate, Burst: k.capa, Window: Duration(k.w)}
		} else {
			lim, w := logInt64(rng, bound.MaxLimit), logInt64(rng, maxWindow)
			count, cost := rng.Int64N(lim+1), 1+rng.Int64N(lim)
			if rng.IntN(2) == 0 {
				count = 0 // a window opened by the spend
			}
			value, px = strconv.FormatInt(count, 10), 1+rng.Int64N(w)
			rule = ratebudget.Rule{Algorithm: ratebudget.FixedWindow, Limit: lim, Window: Duration(w)}
			args = func(mode string) []string {
				l := strconv.FormatInt(lim, 10)
				return []string{mode, "0", l, strconv.FormatInt(w, 10), l, strconv.FormatInt(cost, 10)}
			}
		}
		got := runTwin(t, c, s, value, px, args("0"), args("4"))
		if got.first[0] != 1 {
			continue // refused: nothing spent, nothing given back
		}
		checked++
		if len(got.second) != 8 || got.second[0] != 1 {
			t.Fatalf("%q PX %d, %v: decided %v, spent %v", value, px, args("4"), got.first, got.second)
		}
		cost, _ := strconv.ParseInt(args("4")[5], 10, 64)
		spent := ratebudget.Outcome{Allowed: true, Remaining: got.second[2], ResetAfter: Duration(got.second[3])}
		want := ratebudget.Outcome{Allowed: true, Remaining: got.first[2], ResetAfter: Duration(got.first[3])}
		if u := Unspent(spent, cost, got.second[7]); u != want {
			t.Fatalf("%q PX %d, %v: Unspent(%+v, %d, %d) = %+v; allow.lua decided %+v", value, px, args("4"), spent, cost, got.second[7], u, want)
		}
		// GivenBack, which does not know the reset before the spend: the same remaining,
		// the same reset under a fixed window, within a millisecond under a token bucket.
		// (Window/Limit is truncated to whole ns: up to 1 ns more per unit given back. A
		// reset beyond the longest Duration, 292 years, is saturated, and not compared.)
		gb := GivenBack(&rule, cost, spent)
		if d := gb.ResetAfter - want.ResetAfter; gb.Remaining != want.Remaining ||
			rule.Algorithm == ratebudget.FixedWindow && d != 0 ||
			spent.ResetAfter < math.MaxInt64 && (d < -time.Millisecond || d > time.Millisecond+time.Duration(cost)) {
			t.Fatalf("%q PX %d, %v: GivenBack(%+v, %d) = %+v; allow.lua decided %+v", value, px, args("4"), spent, cost, gb, want)
		}
	}
	if checked < 500 {
		t.Fatalf("%d admissions given back, want at least 500", checked)
	}
}

// TestRollingWindowTwinRedis: allow.lua's waits for a rolling window are LeavesAfter's:
// the reset when the newest event in the window leaves it, the retry when the oldest
// event whose leaving frees enough does; for logs with events aged out, events ahead of
// the clock (written before it went back), costs that fit, wait and exceed the limit.
// The log is written by the script that then decides, at the server's TIME.
func TestRollingWindowTwinRedis(t *testing.T) {
	c := redistest.Start(t).Client(t)
	allow, err := os.ReadFile("../../lua/allow.lua")
	if err != nil {
		t.Fatal(err)
	}
	// ARGV: the number of events n, then each event's age (ms before now; negative:
	// ahead) and cost, oldest first; then allow.lua's arguments. It replies allow.lua's
	// reply, the server's now (ms) and 1 when no millisecond ticked meanwhile.
	s := redis.NewScript("local function allow(KEYS, ARGV)\n" + string(allow) + "\nend\n" + `
redis.call('SET', KEYS[2], '1', 'PX', '100000000')
local probe = redis.call('PTTL', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[1])
local n = tonumber(ARGV[1])
local acc = 0
for i = 1, n do
  local at, cost = now - tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  acc = acc + cost
  redis.call('ZADD', KEYS[1], at, acc .. ':' .. cost .. ':' .. at)
end
local a = {}
for i = 2 + 2 * n, #ARGV do a[#a + 1] = ARGV[i] end
local r = allow({KEYS[1]}, a)
local stable = 0
if redis.call('PTTL', KEYS[2]) == probe then stable = 1 end
return {r, now, stable}`)
	rng := rand.New(rand.NewPCG(27, 5))
	refused := 0
	for range 2000 {
		w := 1 + rng.Int64N(100_000)
		lim := 1 + rng.Int64N(200)
		cost := 1 + rng.Int64N(lim+10)
		var ages, costs []int64
		age := 2*w - rng.Int64N(w/2+1) // the oldest may have left the window
		for range rng.IntN(20) {
			ages, costs = append(ages, age), append(costs, 1+rng.Int64N(50))
			age -= 1 + rng.Int64N(w/10+1)
			if age < -5 {
				break
			}
		}
		args := []any{len(ages)}
		for i := range ages {
			args = append(args, ages[i], costs[i])
		}
		args = append(args, "0", "2", lim, w, lim, cost)
		var v []any
		for try := 0; ; try++ {
			v, err = s.Run(context.Background(), c, []string{"rolling", "rolling-probe"}, args...).Slice()
			if err != nil || len(v) != 3 {
				t.Fatalf("%v: %v, %v", args, v, err)
			}
			if v[2] == int64(1) {
				break
			}
			if try == 100 {
				t.Fatalf("%v: a millisecond ticked within 100 runs", args)
			}
		}
		now := v[1].(int64)
		got := fmt.Sprint(v[0])

		// The window (now-w, now]: its events' sum, and its newest event's time.
		var sum, last int64
		var in []int // the events in the window, oldest first
		for i, a := range ages {
			if at := now - a; at > now-w {
				in = append(in, i)
				sum += costs[i]
				last = at
			}
		}
		reset := int64(0)
		if len(in) > 0 {
			reset = LeavesAfter(last, w, now)
		}
		var want []int64
		switch {
		case cost > lim:
			want = []int64{0, 1, lim - sum, reset, 0, 0}
		case sum+cost > lim:
			refused++
			need, freed := sum+cost-lim, int64(0)
			retry := reset
			for _, i := range in {
				if freed += costs[i]; freed >= need {
					retry = LeavesAfter(now-ages[i], w, now)
					break
				}
			}
			want = []int64{0, 0, lim - sum, reset, retry, 0}
		default:
			want = []int64{1, 0, lim - sum, reset, 0, 0} // decided only: before the cost
		}
		if got != fmt.Sprint(want) {
			t.Fatalf("events aged %v costing %v, limit %d per %dms, cost %d: allow.lua %s, LeavesAfter %v", ages, costs, lim, w, cost, got, want)
		}
	}
	if refused < 200 {
		t.Fatalf("%d refusals with a wait, want at least 200", refused)
	}
}
