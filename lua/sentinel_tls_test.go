package lua_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestSentinelOverTLS: a Sentinel set whose primary, replica and Sentinels all speak
// only TLS, through a failover client with one TLSConfig for the Sentinels and the data
// nodes (no ServerName: each connection checks the certificate of the address it
// dials). 100 concurrent decisions on a budget of 50 admit exactly 50, for a fixed
// window and a token bucket; then a failover (SENTINEL FAILOVER) is survived as
// TestSentinelFailover (integration_test) expects of a killed primary: failures while
// it runs are counted, not refused, and every identity decides again on the promoted
// replica once the old primary has become a replica.
func TestSentinelOverTLS(t *testing.T) {
	set := redistest.StartTLSSentinel(t, 1, 3, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, addr := range []string{set.Master.Addr, set.Sentinels[0].Addr} {
		plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
		if err := plain.Ping(ctx).Err(); err == nil {
			t.Fatalf("%s answered a client without TLS", addr)
		}
		plain.Close()
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: set.MasterName, SentinelAddrs: set.SentinelAddrs(), TLSConfig: set.Master.TLSConfig(),
		MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolTimeout: time.Second,
	})
	t.Cleanup(func() { c.Close() })
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	must(t, l.Load(ctx))
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket} {
		rule := ratebudget.Rule{Name: "s" + algname.Of(alg), Algorithm: alg, Limit: 50, Window: time.Hour}
		if alg == ratebudget.TokenBucket {
			rule.Burst = 50
		}
		if got := concurrentAdmits(t, l, 100, func(int) []ratebudget.Check {
			return []ratebudget.Check{{Rule: rule, Identity: "one", Cost: 1}}
		}); got != 50 {
			t.Errorf("%s: %d of 100 concurrent decisions admitted on a budget of 50, want 50", algname.Of(alg), got)
		}
	}

	// Before the failover the identities spend on rule before; once the Sentinels name
	// the promoted replica, on rule after, whose keys no server has yet: one on the new
	// primary shows that the new primary decided for that identity (the old primary
	// takes writes too until the Sentinels make it a replica, which is lost then).
	before := ratebudget.Rule{Name: "fo", Limit: 1_000_000, Window: time.Hour}
	after := ratebudget.Rule{Name: "fo-after", Limit: 1_000_000, Window: time.Hour}
	check := func(r ratebudget.Rule, i int) ratebudget.Check {
		return ratebudget.Check{Rule: r, Identity: "id-" + strconv.Itoa(i), Cost: 1}
	}
	const identities = 20
	var (
		mu       sync.Mutex
		started  time.Time // when SENTINEL FAILOVER was sent
		switched bool      // the new primary was named
		admitted = make([]int64, identities)
		failures = map[string]int{}
		ready    = make(chan struct{}, identities)
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for i := range identities {
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			first := true
			for {
				mu.Lock()
				r := before
				if switched {
					r = after
				}
				mu.Unlock()
				dctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
				d, err := l.Allow(dctx, []ratebudget.Check{check(r, i)})
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					if d.Allowed && r == before {
						admitted[i]++
					}
				case !started.IsZero():
					failures[failureClass(err)]++
				}
				mu.Unlock()
				if first && err == nil {
					first = false
					ready <- struct{}{}
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	for range identities {
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatal("not every identity decided once before the failover")
		}
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: set.Sentinels[0].Addr, MaxRetries: -1, TLSConfig: set.Sentinels[0].TLSConfig()})
	defer sc.Close()
	mu.Lock()
	started = time.Now()
	mu.Unlock()
	must(t, sc.Failover(ctx, set.MasterName).Err())
	newMaster, promoted := set.WaitNewMaster(t, set.Master.Addr, 30*time.Second)
	mu.Lock()
	switched = true
	mu.Unlock()

	nc := redis.NewClient(&redis.Options{Addr: newMaster, MaxRetries: -1, TLSConfig: set.Master.TLSConfig()})
	defer nc.Close()
	target := time.Second // as TestSentinelFailover's, without the detection time: the failover was asked for
	limit := time.NewTimer(time.Until(promoted.Add(target + 10*time.Second)))
	defer limit.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	decided := make([]time.Duration, identities) // after the naming, 0 until seen
	var worst time.Duration
	pending := identities
wait:
	for pending > 0 {
		for i := range identities {
			if decided[i] == 0 && nc.Exists(ctx, l.Key(check(after, i))).Val() == 1 {
				decided[i] = max(time.Since(promoted), time.Nanosecond)
				worst = max(worst, decided[i])
				pending--
			}
		}
		select {
		case <-poll.C: // polling the new primary's keys; no event to wait on
		case <-limit.C:
			break wait
		}
	}
	close(stop)
	wg.Wait()

	var lost, total int64
	for i := range identities {
		n, err := nc.Get(ctx, l.Key(check(before, i))).Int64()
		must(t, err)
		total += admitted[i]
		lost += max(0, admitted[i]-n)
	}
	t.Logf("new primary named %v after SENTINEL FAILOVER; slowest identity decided there %v after that (target %v, met: %v); failures %v",
		promoted.Sub(started).Round(time.Millisecond), worst.Round(time.Millisecond), target, worst <= target, failures)
	t.Logf("budget: %d admitted, %d acknowledged spends missing from the new primary's counters", total, lost)
	if pending > 0 {
		t.Errorf("%d of %d identities never decided on the new primary within %v of its naming", pending, identities, target+10*time.Second)
	}
}

// failureClass names err for a count of failures: a store error's class and whether it
// was uncertain, or the error itself.
func failureClass(err error) string {
	var se *ratebudget.StoreError
	if errors.As(err, &se) {
		return string(se.Class) + map[bool]string{true: " (uncertain)", false: ""}[se.Uncertain]
	}
	return err.Error()
}
