package integration_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// failoverNodeTimeout is the test clusters' cluster-node-timeout: short, for a quick
// failover, yet long enough that a loaded machine does not fail nodes over by itself.
const failoverNodeTimeout = 2 * time.Second

// errClass is a failed decision's class for the failover figures: what the error says
// about the cluster, finer than StoreError's Class.
func errClass(err error) string {
	s := err.Error()
	for _, c := range []string{"MOVED", "ASK", "CLUSTERDOWN", "READONLY", "TRYAGAIN", "connection refused", "connection reset", "EOF", "i/o timeout", "context deadline exceeded", "pool timeout"} {
		if strings.Contains(s, c) {
			return c
		}
	}
	var se *ratebudget.StoreError
	if errors.As(err, &se) {
		return string(se.Class) + ": " + s
	}
	return s
}

// identityLoad is one identity's caller's record.
type identityLoad struct {
	id        string
	key       string
	master    int // index of the master that served its slot at the start
	mu        sync.Mutex
	admitted  int64 // decisions admitted
	before    int   // decisions answered before the kill
	uncertain int   // failed decisions whose spend is uncertain
	failures  map[string]int
	lastOK    time.Time // latest answer
	maxGap    time.Duration
	// recovered is the first answer after the kill; recoveredCh closes then.
	recovered   time.Time
	recoveredCh chan struct{}
}

// failoverRun is a load on many identities through one limiter across a master's kill.
type failoverRun struct {
	cl     *redistest.Cluster
	c      *redis.ClusterClient
	l      *lua.Limiter
	rule   ratebudget.Rule
	ids    []*identityLoad
	mu     sync.Mutex // guards killed and timeline
	killed time.Time
	// timeline counts answers and failures after the kill by 250 ms step, for the
	// failed master's identities [0] and the others [1].
	timeline [2][][2]int
}

const step = 250 * time.Millisecond

func (r *failoverRun) record(affected, ok bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed.IsZero() {
		return
	}
	a, o := 1, 1
	if affected {
		a = 0
	}
	if ok {
		o = 0
	}
	i := int(now.Sub(r.killed) / step)
	for len(r.timeline[a]) <= i {
		r.timeline[a] = append(r.timeline[a], [2]int{})
	}
	r.timeline[a][i][o]++
}

// timelineText is the timeline as "step: answers/failures" for both groups.
func (r *failoverRun) timelineText() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for i := 0; i < max(len(r.timeline[0]), len(r.timeline[1])); i++ {
		fmt.Fprintf(&b, "\n  %5.2fs", (time.Duration(i) * step).Seconds())
		for a := range 2 {
			if i < len(r.timeline[a]) {
				fmt.Fprintf(&b, "  %4d/%-4d", r.timeline[a][i][0], r.timeline[a][i][1])
			} else {
				b.WriteString("  -")
			}
		}
	}
	return b.String()
}

// startFailoverLoad starts perMaster identities on each master's slots, each with one
// caller deciding every pace with a deadline of deadline, until stop closes.
func startFailoverLoad(t *testing.T, cl *redistest.Cluster, c *redis.ClusterClient, l *lua.Limiter, prefix string, perMaster int, pace, deadline time.Duration, stop <-chan struct{}, wg *sync.WaitGroup) *failoverRun {
	t.Helper()
	ctx := ctxT(t)
	r := &failoverRun{cl: cl, c: c, l: l, rule: ratebudget.Rule{Name: "fo", Limit: 1_000_000, Window: time.Hour}}
	masters := cl.Masters()
	count := make([]int, len(masters))
	for i := 0; len(r.ids) < perMaster*len(masters); i++ {
		id := "id-" + strconv.Itoa(i)
		key := keyOf(prefix, ratebudget.Check{Rule: r.rule, Identity: id, Cost: 1})
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		owner := cl.SlotOwner(int(slot))
		m := -1
		for j, mm := range masters {
			if mm == owner {
				m = j
			}
		}
		if count[m] == perMaster {
			continue
		}
		count[m]++
		r.ids = append(r.ids, &identityLoad{id: id, key: key, master: m, failures: map[string]int{}, recoveredCh: make(chan struct{})})
	}
	ready := make(chan struct{}, len(r.ids))
	for _, il := range r.ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			checks := []ratebudget.Check{{Rule: r.rule, Identity: il.id, Cost: 1}}
			tick := time.NewTicker(pace)
			defer tick.Stop()
			first := true
			for {
				dctx, cancel := context.WithTimeout(context.Background(), deadline)
				d, err := l.Allow(dctx, checks)
				cancel()
				now := time.Now()
				r.record(il.master == 0, err == nil, now)
				il.mu.Lock()
				if err == nil {
					if d.Allowed {
						il.admitted++
					}
					if !il.lastOK.IsZero() && now.Sub(il.lastOK) > il.maxGap {
						il.maxGap = now.Sub(il.lastOK)
					}
					il.lastOK = now
					if r.killedAt().IsZero() {
						il.before++
					} else if il.recovered.IsZero() {
						il.recovered = now
						close(il.recoveredCh)
					}
				} else if !r.killedAt().IsZero() {
					il.failures[errClass(err)]++
					var se *ratebudget.StoreError
					if errors.As(err, &se) && se.Uncertain {
						il.uncertain++
					}
				} else {
					il.failures["before the kill: "+errClass(err)]++
				}
				il.mu.Unlock()
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
		}()
	}
	for range r.ids {
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatal("not every identity decided once before the kill")
		}
	}
	return r
}

func (r *failoverRun) killedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killed
}

func (r *failoverRun) kill(t *testing.T, m *redistest.Node) {
	r.mu.Lock()
	m.Kill(t)
	r.killed = time.Now()
	r.mu.Unlock()
}

// TestClusterFailover kills one of three masters (each with a replica) in the middle of
// a load on 60 identities through *redis.ClusterClient with the limiter's recommended
// settings: decisions on the failed master's slots succeed again after the replica's
// promotion (the time is logged against its target, the node timeout plus one second),
// and identities on the other masters' slots keep deciding throughout. It logs the figures of docs/CLUSTER.md:
// time to recover, errors by class, and spends acknowledged but lost with the master.
func TestClusterFailover(t *testing.T) {
	for _, mode := range []struct {
		name string
		// fullCoverage is cluster-require-full-coverage: yes, Redis's default, stops
		// every slot while one is uncovered; no, as docs/CLUSTER.md recommends, only
		// the uncovered ones.
		fullCoverage bool
		// graceful hands the master's slots over with CLUSTER FAILOVER on its replica
		// instead of killing it: no decision may fail but by a timeout (MOVED is
		// followed).
		graceful bool
	}{
		{"default", false, false},
		{"FullCoverage", true, false},
		{"Graceful", false, true},
	} {
		t.Run(mode.name, func(t *testing.T) { testClusterFailover(t, mode.fullCoverage, mode.graceful) })
	}
}

func testClusterFailover(t *testing.T, fullCoverage, graceful bool) {
	coverage := "no"
	if fullCoverage {
		coverage = "yes"
	}
	cl := redistest.StartClusterWithReplicas(t, 3, 1, failoverNodeTimeout, "--cluster-require-full-coverage", coverage)
	c := cl.Client(t, readmeSettings)
	prefix := uniquePrefix(t)
	l, err := lua.New(c, lua.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const perMaster = 20
	r := startFailoverLoad(t, cl, c, l, prefix, perMaster, 20*time.Millisecond, 250*time.Millisecond, stop, &wg)
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()

	victim := cl.Masters()[0]
	slotsCalls := func() (n int64) {
		for _, nd := range cl.Nodes {
			if nd != victim {
				n += nd.Calls(t, "cluster|slots")
			}
		}
		return n
	}
	reloadsBefore := slotsCalls()
	if graceful {
		r.mu.Lock()
		err := cl.ReplicasOf(victim)[0].Client(t).Do(ctxT(t), "CLUSTER", "FAILOVER").Err()
		r.killed = time.Now()
		r.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	} else {
		r.kill(t, victim)
	}
	promoted := cl.WaitPromoted(t, cl.ReplicasOf(victim)[0], 10*failoverNodeTimeout)
	target := failoverNodeTimeout + time.Second
	// Wait for every identity's first answer after the kill, measuring beyond the target.
	limit := time.NewTimer(time.Until(promoted.Add(target + 10*time.Second)))
	defer limit.Stop()
wait:
	for _, il := range r.ids {
		select {
		case <-il.recoveredCh:
		case <-limit.C:
			break wait
		}
	}
	// A little more load after the last recovery, for the other identities' gaps to
	// cover the whole failover.
	last := time.Now()
	for time.Since(last) < 500*time.Millisecond {
		time.Sleep(50 * time.Millisecond) // the load's duration, not a synchronisation
	}
	halt()
	reloads := slotsCalls() - reloadsBefore
	loadTime := time.Since(r.killed)

	ctx := ctxT(t)
	promotedClient := cl.ReplicasOf(victim)[0].Client(t)
	failures := map[bool]map[string]int{true: {}, false: {}}
	var worst time.Duration
	var notRecovered, lost, admitted, uncertain int64
	var otherGaps []time.Duration
	for _, il := range r.ids {
		affected := il.master == 0
		for k, v := range il.failures {
			failures[affected][k] += v
		}
		if !affected {
			otherGaps = append(otherGaps, il.maxGap)
			continue
		}
		if il.recovered.IsZero() {
			notRecovered++
			continue
		}
		if d := il.recovered.Sub(promoted); d > worst {
			worst = d
		}
		n, err := promotedClient.Get(ctx, il.key).Int64()
		if err != nil {
			t.Fatalf("identity %s's counter: %v", il.id, err)
		}
		admitted += il.admitted
		uncertain += int64(il.uncertain)
		if il.admitted > n {
			lost += il.admitted - n
		}
	}
	sort.Slice(otherGaps, func(i, j int) bool { return otherGaps[i] < otherGaps[j] })
	t.Logf("promotion %v after the kill (node timeout %v); affected identities: slowest first answer %v after the promotion, %d never answered; failures on the failed master's slots: %v",
		promoted.Sub(r.killed).Round(time.Millisecond), failoverNodeTimeout, worst.Round(time.Millisecond), notRecovered, failures[true])
	t.Logf("other masters' identities: failures %v, longest gap between answers %v (median %v)",
		failures[false], otherGaps[len(otherGaps)-1].Round(time.Millisecond), otherGaps[len(otherGaps)/2].Round(time.Millisecond))
	t.Logf("answers/failures after the kill by %v, failed master's identities then the others:%s", step, r.timelineText())
	t.Logf("budget: %d admitted on the failed master's identities, %d acknowledged spends missing from the promoted replica's counters, %d uncertain failures",
		admitted, lost, uncertain)
	// The client reloads its slot map at most once per 200 ms (its LazyReload's
	// cooldown), whatever the errors; Load and the test's own reads add a few.
	t.Logf("slot map reloads (CLUSTER SLOTS) in the %v after the kill: %d", loadTime.Round(time.Millisecond), reloads)
	if most := int64(loadTime/(200*time.Millisecond)) + 10; reloads > most {
		t.Errorf("%d slot map reloads in %v: a reload storm (want at most %d)", reloads, loadTime, most)
	}
	// The time to recover is a figure for docs/CLUSTER.md, logged against its target, not
	// asserted: a loaded machine can miss a one-second window. Recovering at all is.
	t.Logf("slowest first answer after the promotion %v: target (node timeout + 1s) %v, met: %v", worst.Round(time.Millisecond), target, worst <= target)
	if notRecovered > 0 {
		t.Errorf("decisions on the failed-over slots: %d identities never answered again within %v of the promotion", notRecovered, target+10*time.Second)
	}
	decisions := [2]int{} // after the kill: the failed master's identities, the others
	r.mu.Lock()
	for a := range decisions {
		for _, st := range r.timeline[a] {
			decisions[a] += st[0] + st[1]
		}
	}
	r.mu.Unlock()
	if graceful {
		// MOVED is followed: no decision fails but by a timeout. The handover pauses the
		// old master's clients until its replica has taken over (Redis's manual
		// failover), which on a loaded machine can outlast the 200 ms read timeout, and
		// any caller can be stalled past its deadline there: timeouts are figures of the
		// load, logged, and bounded only where a stuck handover would show, most
		// decisions timing out.
		onlyTimeouts(t, "the failed-over master's identities", failures[true], decisions[0])
		onlyTimeouts(t, "the other masters' identities", failures[false], decisions[1])
		return
	}
	if fullCoverage {
		return // the other slots stop too until the promotion: Redis refuses them with CLUSTERDOWN
	}
	// The other masters' identities are unaffected: no error says the dead master held
	// them up. Timeouts and the longest wait for an answer are figures of the machine's
	// load (the 250 ms deadline is tight for a shared 2-core runner, which can stall a
	// caller for a second): logged above, and bounded only where a dead master holding
	// them up would show, most decisions timing out and a wait as long as the failover.
	onlyTimeouts(t, "the other masters' identities", failures[false], decisions[1])
	if g, outage := otherGaps[len(otherGaps)-1], promoted.Sub(r.killed); g >= outage {
		t.Errorf("an identity on another master's slots went %v without an answer, as long as the failover (%v): held up by the dead master", g, outage)
	}
}

// onlyTimeouts fails the test if failures, of who's decisions after the kill, has a
// class other than a timeout, or if they timed out in more than half of them.
func onlyTimeouts(t *testing.T, who string, failures map[string]int, decisions int) {
	t.Helper()
	timeouts := 0
	for k, v := range failures {
		switch {
		case strings.HasPrefix(k, "before"):
		case k == "context deadline exceeded" || k == "i/o timeout":
			timeouts += v
		default:
			t.Errorf("%s failed %d times with %s; want no failure but a timeout", who, v, k)
		}
	}
	t.Logf("%s timed out %d times in %d decisions", who, timeouts, decisions)
	if timeouts*2 > decisions {
		t.Errorf("%s timed out %d times in %d decisions; want them unaffected", who, timeouts, decisions)
	}
}
