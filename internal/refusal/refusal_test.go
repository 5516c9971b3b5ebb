package refusal

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

const ms = int64(time.Millisecond)

func refused(retry, reset time.Duration) ratebudget.Decision {
	return ratebudget.Decision{Rule: "r", Limit: 5, Outcome: ratebudget.Outcome{Remaining: 1, RetryAfter: retry, ResetAfter: reset}}
}

func TestLookupRepeatsRefusalUntilTheWaitEnds(t *testing.T) {
	c := New(1024)
	key := []byte("rb:{x}:r:fixed")
	c.Store(key, 2, 1000*ms, refused(300*time.Millisecond, 500*time.Millisecond))
	for _, tc := range []struct {
		now       int64
		cost      int64
		hit       bool
		wantRetry time.Duration
		wantReset time.Duration
	}{
		{1000 * ms, 2, true, 300 * time.Millisecond, 500 * time.Millisecond},
		{1000 * ms, 5, true, 300 * time.Millisecond, 500 * time.Millisecond}, // a larger cost is refused too
		{1000 * ms, 1, false, 0, 0}, // a smaller one might fit: ask the store
		{1100*ms + 1, 2, true, 200 * time.Millisecond, 400 * time.Millisecond}, // rounded up to whole ms
		{1300*ms - 1, 3, true, time.Millisecond, 201 * time.Millisecond},
		{1300 * ms, 2, false, 0, 0}, // the wait is over
	} {
		d, hit := c.Lookup(key, tc.cost, false, tc.now)
		if hit != tc.hit {
			t.Fatalf("now %d cost %d: hit %v, want %v", tc.now, tc.cost, hit, tc.hit)
		}
		if hit && (d.RetryAfter != tc.wantRetry || d.ResetAfter != tc.wantReset || d.Allowed || d.Rule != "r" || d.Remaining != 1) {
			t.Fatalf("now %d: %+v, want retry %v reset %v", tc.now, d, tc.wantRetry, tc.wantReset)
		}
	}
	if c.Len() != 0 {
		t.Fatalf("expired entry kept: %d", c.Len())
	}
}

func TestStoreIgnoresWhatCannotBeRepeated(t *testing.T) {
	c := New(1024)
	c.Store([]byte("a"), 1, 0, ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true, RetryAfter: time.Second}})
	c.Store([]byte("b"), 9, 0, ratebudget.Decision{Outcome: ratebudget.Outcome{Exceeded: true}})
	c.Store([]byte("c"), 1, 0, ratebudget.Decision{})
	if c.Len() != 0 {
		t.Fatalf("stored %d entries, want 0", c.Len())
	}
}

func TestStoreKeepsTheDominantEntry(t *testing.T) {
	c := New(1024)
	k := []byte("k")
	c.Store(k, 1, 0, refused(time.Second, time.Second))
	c.Store(k, 3, 0, refused(500*time.Millisecond, time.Second)) // dominated: kept the first
	if _, hit := c.Lookup(k, 1, false, 600*ms); !hit {
		t.Fatal("dominant entry replaced")
	}
	c.Store(k, 1, 700*ms, refused(time.Second, time.Second)) // newer and as strong: replaces
	if d, hit := c.Lookup(k, 1, false, 1500*ms); !hit || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("%+v %v", d, hit)
	}
}

func TestBounded(t *testing.T) {
	c := New(64) // 2 per shard
	for i := range 1000 {
		c.Store([]byte("k"+strconv.Itoa(i)), 1, 0, refused(time.Hour, time.Hour))
	}
	if n := c.Len(); n > 64 {
		t.Fatalf("%d entries, want at most 64", n)
	}
	// Once they expire, room is made again.
	for i := range 1000 {
		c.Store([]byte("n"+strconv.Itoa(i)), 1, int64(2*time.Hour), refused(time.Hour, time.Hour))
	}
	if n := c.Len(); n > 64 || n < 32 {
		t.Fatalf("%d entries after expiry, want 32..64", n)
	}
}

func BenchmarkLookupMiss(b *testing.B) {
	c := New(1024)
	key := []byte("rb:{AAAAAAAAAAAAAAAAAAAAAA}:api:fixed")
	b.ReportAllocs()
	for b.Loop() {
		c.Lookup(key, 1, false, 0)
	}
}

func TestForget(t *testing.T) {
	c := New(1024)
	a, b := []byte("rb:{a}:r"), []byte("rb:{b}:r")
	c.Forget(a) // nothing stored: a no-op
	c.Store(a, 2, 0, refused(time.Second, time.Second))
	c.Store(b, 2, 0, refused(time.Second, time.Second))
	c.Forget(a)
	if _, hit := c.Lookup(a, 2, false, 0); hit {
		t.Fatal("a forgotten refusal was repeated")
	}
	if _, hit := c.Lookup(b, 2, false, 0); !hit {
		t.Fatal("forgetting one key dropped another's refusal")
	}
	if c.Len() != 1 {
		t.Fatalf("Len %d, want 1", c.Len())
	}
	c.Forget(b)
	if !c.Empty() || c.n.Load() != 0 {
		t.Fatalf("%d entries counted after every key was forgotten", c.n.Load())
	}
}

// TestLookupSameCost: a rule whose wait grows with the cost repeats a refusal for its
// own cost only; a larger cost would be told the smaller one's wait.
func TestLookupSameCost(t *testing.T) {
	c := New(1024)
	key := []byte("rb:{x}:r:token")
	c.Store(key, 2, 0, refused(300*time.Millisecond, 500*time.Millisecond))
	for _, tc := range []struct {
		cost int64
		hit  bool
	}{{1, false}, {2, true}, {3, false}} {
		if d, hit := c.Lookup(key, tc.cost, true, 0); hit != tc.hit || hit && d.RetryAfter != 300*time.Millisecond {
			t.Fatalf("cost %d: %+v, hit %v; want hit %v", tc.cost, d, hit, tc.hit)
		}
	}
}

// TestLookupRepeatsAtMostMaxRepeat: a refusal with a long wait is repeated for MaxRepeat
// after its request was sent, reporting the store's wait, and then dropped, so that the
// store decides the budget again.
func TestLookupRepeatsAtMostMaxRepeat(t *testing.T) {
	c := New(1024)
	key := []byte("rb:{x}:r:fixed")
	const sent = 1000 * ms
	wait := 25 * time.Hour
	c.Store(key, 1, sent, refused(wait, wait))
	last := sent + int64(MaxRepeat) - 1
	d, hit := c.Lookup(key, 1, false, last)
	if !hit || d.RetryAfter != wait-MaxRepeat+time.Millisecond {
		t.Fatalf("%v after the request: %+v, hit %v; want the refusal, RetryAfter %v", MaxRepeat-1, d, hit, wait-MaxRepeat+time.Millisecond)
	}
	if _, hit := c.Lookup(key, 1, false, sent+int64(MaxRepeat)); hit {
		t.Fatalf("repeated %v after its request, want at most %v", MaxRepeat, MaxRepeat)
	}
	if c.Len() != 0 {
		t.Fatalf("%d entries after the repeat ended, want 0", c.Len())
	}
	// A refusal stored again later repeats for MaxRepeat from its own request.
	c.Store(key, 1, 5000*ms, refused(wait, wait))
	if _, hit := c.Lookup(key, 1, false, 5000*ms+int64(MaxRepeat)-1); !hit {
		t.Fatal("a refusal stored again was not repeated")
	}
}

// TestSweepDropsRefusalsPastMaxRepeat: a full shard makes room by dropping refusals
// whose repeat has ended, even while their waits run.
func TestSweepDropsRefusalsPastMaxRepeat(t *testing.T) {
	c := New(shards) // 1 per shard
	for i := range 200 {
		c.Store([]byte("k"+strconv.Itoa(i)), 1, 0, refused(time.Hour, time.Hour))
	}
	before := c.Len()
	for i := range 200 {
		c.Store([]byte("n"+strconv.Itoa(i)), 1, int64(MaxRepeat), refused(time.Hour, time.Hour))
	}
	for i := range 200 {
		if _, hit := c.Lookup([]byte("k"+strconv.Itoa(i)), 1, false, int64(MaxRepeat)); hit {
			t.Fatalf("k%d repeated past MaxRepeat", i)
		}
	}
	if n := c.Len(); n < before/2 {
		t.Fatalf("%d entries after the sweep (%d before), want the old ones replaced", n, before)
	}
}
