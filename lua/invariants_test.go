package lua_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
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
	w := newWalk(t, c, []*redis.Client{c}, lua.WithRefusalCache(0))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 1500 {
		checks := w.checks(rng)
		d, err := w.l.Allow(context.Background(), checks)
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		w.count(d)
		if err := w.audit(); err != nil {
			t.Fatalf("decision %d (%+v → %+v): %v", i, checks, d, err)
		}
	}
	w.covered(100, 10)
}

// TestStateInvariantsConcurrent: the same invariants while 8 callers decide at once,
// through the pool, with coalescing (with few identities
// and costs, concurrent decisions for one budget may be grouped), and with that and
// WithOneServer (the demo's options). A ninth goroutine audits the keys as they change.
func TestStateInvariantsConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name    string
		opts    []lua.Option
		refunds int // refunds of each kind the walk must see
	}{
		{"pool", nil, 20},
		{"coalesced", []lua.Option{lua.WithCoalescing(64)}, 20},
		// Every slot in one call: nothing to refund.
		{"one-server-coalesced", []lua.Option{lua.WithOneServer(), lua.WithCoalescing(64)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := srv.Client(t)
			w := newWalk(t, c, []*redis.Client{c}, append([]lua.Option{lua.WithRefusalCache(0)}, tc.opts...)...)
			w.concurrently(8, 250)
			w.covered(100, tc.refunds)
		})
	}
}

// concurrently runs callers goroutines of n random decisions each, while another audits
// the keys until they are done, then audits once more.
func (w *walk) concurrently(callers, n int) {
	t := w.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	audits := make(chan error, 1)
	go func() {
		audited := 0
		for ctx.Err() == nil {
			if err := w.audit(); err != nil {
				audits <- err
				return
			}
			audited++
		}
		if audited == 0 {
			audits <- errors.New("no audit ran while the callers decided")
			return
		}
		audits <- nil
	}()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range n {
				checks := w.checks(rng)
				d, err := w.l.Allow(ctx, checks)
				if err != nil {
					errs <- fmt.Errorf("caller %d, decision %d: %v", g, i, err)
					return
				}
				w.count(d)
			}
		}()
	}
	wg.Wait()
	cancel()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-audits; err != nil {
		t.Fatal(err)
	}
	if err := w.audit(); err != nil {
		t.Fatal(err)
	}
}

// walk is a limiter with nine rules (three time rules, three windows down to 15 ms,
// limit 6) for three identities, and what its random decisions covered.
type walk struct {
	t       *testing.T
	servers []*redis.Client // every server that holds keys, audited one by one
	l       *lua.Limiter
	prefix  string // l's key prefix
	rules   []ratebudget.Rule
	ids     []string
	ruleOf  map[string]ratebudget.Rule
	refunds refundCounter
	mu      sync.Mutex
	refused int
	full    map[ratebudget.Algorithm]int // keys seen with their whole budget spent
}

// newWalk returns a walk of a limiter on c, whose keys live on servers.
func newWalk(t *testing.T, c redis.Scripter, servers []*redis.Client, opts ...lua.Option) *walk {
	prefix := uniquePrefix(t)
	w := &walk{t: t, servers: servers, l: newLimiter(t, c, append(append([]lua.Option(nil), opts...), lua.WithPrefix(prefix))...), prefix: prefix,
		ids: []string{"ann", "bob", "cy"}, ruleOf: map[string]ratebudget.Rule{}, full: map[ratebudget.Algorithm]int{}}
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for _, win := range []time.Duration{15 * time.Millisecond, 60 * time.Millisecond, time.Second} {
			r := ratebudget.Rule{Name: algname.Of(alg) + "-" + win.String(), Algorithm: alg, Limit: 6, Window: win}
			w.rules = append(w.rules, r)
			for _, id := range w.ids {
				w.ruleOf[w.l.Key(ratebudget.Check{Rule: r, Identity: id})] = r
			}
		}
	}
	w.refunds = countRefunds(t, servers)
	return w
}

// checks draws one to four distinct checks of cost 1 to 3.
func (w *walk) checks(rng *rand.Rand) []ratebudget.Check {
	n := 1 + rng.IntN(4)
	checks := make([]ratebudget.Check, 0, n)
	seen := map[string]bool{}
	for len(checks) < n {
		chk := ratebudget.Check{
			Rule:     w.rules[rng.IntN(len(w.rules))],
			Identity: w.ids[rng.IntN(len(w.ids))],
			Cost:     1 + rng.Int64N(3),
		}
		if k := w.l.Key(chk); !seen[k] {
			seen[k] = true
			checks = append(checks, chk)
		}
	}
	return checks
}

func (w *walk) count(d ratebudget.Decision) {
	if !d.Allowed {
		w.mu.Lock()
		w.refused++
		w.mu.Unlock()
	}
}

// audit checks every key under the limiter's prefix: a TTL within its rule's window,
// and no more than the rule's limit spent.
func (w *walk) audit() error {
	for _, srv := range w.servers {
		if err := w.auditServer(srv); err != nil {
			return err
		}
	}
	return nil
}

func (w *walk) auditServer(c *redis.Client) error {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, w.prefix+":*", 100).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		r, ok := w.ruleOf[key]
		if !ok {
			return fmt.Errorf("unexpected key %q", key)
		}
		spent, err := spentNow(c, r, key)
		if err != nil {
			return err
		}
		if spent > r.Limit {
			return fmt.Errorf("key %q holds %d spent units, over the limit of %d", key, spent, r.Limit)
		}
		if spent == r.Limit {
			w.mu.Lock()
			w.full[r.Algorithm]++
			w.mu.Unlock()
		}
		p, err := c.PTTL(ctx, key).Result()
		if err != nil {
			return err
		}
		if p == -2*time.Nanosecond {
			continue // expired since the scan
		}
		if p < 0 || p > r.Window { // 0: under a millisecond left
			return fmt.Errorf("key %q has PTTL %v, want (0, %v]", key, p, r.Window)
		}
	}
	return iter.Err()
}

// covered fails the test unless the walk saw at least the given number of refusals,
// refunds given back to fixed windows and to rolling windows (none at all when refunds
// is 0) (the server ran settle.lua's DECRBY and PEXPIREAT, which allow.lua never sends
// for these rules) and every time rule's budget spent in full: the audits were not
// vacuous.
func (w *walk) covered(refusals, refunds int) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	fixed, rolling := w.refunds.since(w.t)
	w.t.Logf("%d refusals; refunds: %d to fixed windows, %d to rolling windows; budgets seen spent in full: %v",
		w.refused, fixed, rolling, w.full)
	if w.refused < refusals || fixed < refunds || rolling < refunds || len(w.full) < 3 {
		w.t.Fatalf("want at least %d refusals, %d refunds of each kind, and every time rule spent in full", refusals, refunds)
	}
	if refunds == 0 && fixed+rolling > 0 {
		w.t.Fatalf("want no refunds")
	}
}

// refundCounter counts the refunds that servers ran since it was made: settle.lua's
// DECRBY (fixed windows) and PEXPIREAT (rolling windows), which allow.lua never sends
// for these rules (it sends PEXPIREAT for in-flight leases only).
// It reads INFO commandstats: the server's own count, whatever path sent the commands.
type refundCounter struct {
	servers []*redis.Client
	before  []cmdStats
}

func countRefunds(t *testing.T, servers []*redis.Client) refundCounter {
	rc := refundCounter{servers: servers}
	for _, srv := range servers {
		rc.before = append(rc.before, commandStats(t, srv))
	}
	return rc
}

// since returns the refunds of fixed and of rolling windows run since rc was made.
func (rc refundCounter) since(t *testing.T) (fixed, rolling int) {
	for i, srv := range rc.servers {
		d := commandStats(t, srv).sub(rc.before[i])
		fixed += int(d.calls["decrby"])
		rolling += int(d.calls["pexpireat"])
	}
	return fixed, rolling
}

// spentNow reads how much of r's budget key holds as spent now: a fixed window's count,
// a token bucket's deficit in tokens (rounded up), the costs of a rolling window's events
// still in the window (events are named "<sum>:<cost>:...").
func spentNow(c *redis.Client, r ratebudget.Rule, key string) (int64, error) {
	ctx := context.Background()
	if r.Algorithm == ratebudget.RollingWindow {
		// The events first, then the clock: every event counted was in the window when
		// the events were read (it is later than the window's edge at a later time), so
		// the sum is at most what the window held then, even while others admit.
		evs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			return 0, err
		}
		now, err := c.Time(ctx).Result()
		if err != nil {
			return 0, err
		}
		edge := float64(now.UnixMilli() - r.Window.Milliseconds())
		var sum int64
		for _, e := range evs {
			if e.Score <= edge {
				continue
			}
			f := strings.Split(e.Member.(string), ":")
			cost, err := strconv.ParseInt(f[min(1, len(f)-1)], 10, 64)
			if len(f) < 2 || err != nil {
				return 0, fmt.Errorf("key %q: event %q", key, e.Member)
			}
			sum += cost
		}
		return sum, nil
	}
	s, err := c.Get(ctx, key).Result()
	if err == redis.Nil {
		return 0, nil
	}
	if r.Algorithm == ratebudget.TokenBucket {
		s, _, _ = strings.Cut(s, ":") // "<deficit>:<time until full>:<window>", the rule's own
	}
	v, perr := strconv.ParseInt(s, 10, 64)
	if err == nil {
		err = perr
	}
	if err != nil {
		return 0, fmt.Errorf("key %q: %v", key, err)
	}
	if r.Algorithm == ratebudget.TokenBucket {
		w := r.Window.Milliseconds()
		return (v + w - 1) / w, nil
	}
	return v, nil
}
