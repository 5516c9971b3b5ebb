package integration_test

// Failure behaviour on real Redis, through the real middleware, lua.Limiter and go-redis
// client. Faults that stop, pause or restart Redis, or change its memory limit, get a
// container of their own (startFaultRedis) so the shared one is never disturbed; faults
// on the wire (a lost reply) use an in-process proxy in front of the shared container.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/metrics"
)

// failClosed stands for the default policy, fail-closed, in tables of policies: it
// needs no option, and this one changes nothing.
var failClosed = middleware.WithObserver(func(middleware.Event) {})

const (
	// faultDeadline is the decision deadline (middleware.WithTimeout) of the fault tests.
	faultDeadline = 250 * time.Millisecond
	// faultBound is what any request may take under a fault: the deadline plus a margin
	// for a loaded 2-core machine under -race. go-redis's defaults would take seconds
	// (5s dial and read timeouts, 3 retries).
	faultBound = faultDeadline + time.Second
)

type clientVariant struct {
	name string
	opts *redis.Options
}

// clientVariants: the recommended settings, and go-redis's defaults (no context
// deadline on the socket, 3 retries) under which the middleware's deadline must hold all
// the same.
func clientVariants() []clientVariant {
	return []clientVariant{
		{"recommended", recommendedOptions()},
		{"defaults", defaultOptions()},
	}
}

// transportVariants: clientVariants (every decision goes through the client).
func transportVariants() []clientVariant {
	return clientVariants()
}

// TestStoppedRedisPolicies: with the container stopped (connection refused), every
// policy answers within the decision deadline, with either client configuration:
// closed → 503 with no-store and Retry-After, never 429, no error text in the body;
// open → 200, degraded; local with 2 replicas and limit 10 → exactly 5 admitted, then 429.
func TestStoppedRedisPolicies(t *testing.T) {
	t.Parallel()
	fr := startFaultRedis(t)
	addr := fr.Addr()
	type arm struct {
		variant, policy string
		h               *events
		serve           func() (*httptest.ResponseRecorder, time.Duration)
	}
	var arms []arm
	for _, v := range transportVariants() {
		c := fr.client(t, v.opts)
		for _, p := range []struct {
			name string
			opt  middleware.Option
		}{
			{"closed", failClosed},
			{"open", middleware.WithFailOpen()},
			{"local", middleware.WithLocalFallback(2)},
		} {
			// No breaker: every request goes to the stopped server and must still be fast.
			h, ev, _ := faultHandler(t, c, 10, faultDeadline, p.opt, middleware.WithBreaker(middleware.Breaker{Disabled: true}))
			warm(t, h, ev)
			arms = append(arms, arm{v.name, p.name, ev, func() (*httptest.ResponseRecorder, time.Duration) { return serve(t, h, faultBound) }})
		}
	}
	fr.stop(t)

	for _, a := range arms {
		t.Run(a.variant+"/"+a.policy, func(t *testing.T) {
			var want []int
			switch a.policy {
			case "closed":
				want = []int{503, 503, 503}
			case "open":
				want = []int{200, 200, 200}
			case "local": // 10 / 2 replicas = 5 in this process
				want = []int{200, 200, 200, 200, 200, 429, 429}
			}
			n := a.h.len()
			var codes []int
			var worst time.Duration
			for range want {
				rec, el := a.serve()
				worst = max(worst, el)
				codes = append(codes, rec.Code)
				body := rec.Body.String()
				if rec.Code >= 400 {
					if rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("Retry-After") == "" {
						t.Errorf("%d without Cache-Control: no-store and Retry-After: %v", rec.Code, rec.Header())
					}
				}
				for _, leak := range []string{addr, "refused", "dial", "EOF", "i/o timeout", "redis"} {
					if strings.Contains(body, leak) {
						t.Errorf("body %q leaks %q", body, leak)
					}
				}
			}
			if !slices.Equal(codes, want) {
				t.Fatalf("codes %v, want %v", codes, want)
			}
			classes := map[string]int{}
			for i, e := range a.h.since(n) {
				se := storeErr(t, e)
				classes[fmt.Sprintf("%s/uncertain=%t", se.Class, se.Uncertain)]++
				switch a.policy {
				case "closed":
					if e.Result != middleware.Unavailable {
						t.Errorf("event %d: %v, want unavailable", i, e.Result)
					}
				case "open":
					if e.Result != middleware.Degraded {
						t.Errorf("event %d: %v, want degraded", i, e.Result)
					}
				case "local":
					if !e.Fallback {
						t.Errorf("event %d not decided by the local fallback", i)
					}
				}
			}
			if a.variant != "defaults" && classes["connection/uncertain=false"] == 0 {
				// One dial attempt: the refusal itself is reported, at once.
				t.Errorf("store errors %v, want refused connections reported as definite connection errors", classes)
			}
			t.Logf("slowest request %v (deadline %v); store errors %v", worst, faultDeadline, classes)
		})
	}
}

// TestPausedRedisBreaker: a paused container (connections accepted, nothing answers)
// costs no request more than the deadline, with either client configuration; after at
// most 3 failures (the first call left without a reply for Stall, 100ms, opens it: the
// deadline is longer) the breaker opens and the client sends nothing more (counted with
// a hook); after unpausing, decisions go back to Redis within the breaker's probe
// interval (25ms) and one probe. The
// scripts of the timed-out requests may still run when the server wakes up (with
// go-redis's defaults every one that was sent does): a timeout is an uncertain result.
func TestPausedRedisBreaker(t *testing.T) {
	t.Parallel()
	const failures, cooldown = 3, 25 * time.Millisecond // cooldown: the breaker's probe interval
	fr := startFaultRedis(t)
	type arm struct {
		name   string
		h      *events
		tr     *transitions
		calls  *scriptCalls
		prefix string
		serve  func() (*httptest.ResponseRecorder, time.Duration)
	}
	var arms []*arm
	for _, v := range clientVariants() {
		c := fr.client(t, v.opts)
		a := &arm{name: v.name, tr: &transitions{}, calls: countScripts(c)}
		h, ev, prefix := faultHandler(t, c, 1000, faultDeadline,
			middleware.WithBreaker(middleware.Breaker{OnChange: a.tr.observe}))
		warm(t, h, ev)
		a.h, a.prefix, a.serve = ev, prefix, func() (*httptest.ResponseRecorder, time.Duration) { return serve(t, h, faultBound) }
		arms = append(arms, a)
	}
	control := fr.control(t)
	if err := control.Ping(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}

	fr.pause(t)
	for _, a := range arms {
		before, n := a.calls.total(), a.h.len()
		var worst time.Duration
		for i := range 10 {
			rec, el := a.serve()
			worst = max(worst, el)
			if rec.Code != 503 {
				t.Fatalf("%s: request %d: %d, want 503", a.name, i, rec.Code)
			}
		}
		// At most one call per failure before the breaker opens (fewer when a call waiting
		// for a pipeline behind a hung one ran out of time before it was sent), none after.
		if got := a.calls.total() - before; got < 1 || got > failures {
			t.Errorf("%s: %d script calls while paused, want 1..%d: the breaker must stop calling", a.name, got, failures)
		}
		// Timeouts until the breaker opens, then only breaker_open.
		evs := a.h.since(n)
		timeouts := 0
		for i, e := range evs {
			se := storeErr(t, e)
			want := ratebudget.ClassBreakerOpen
			if i == timeouts && se.Class == ratebudget.ClassTimeout {
				want = ratebudget.ClassTimeout
				timeouts++
			}
			if se.Class != want || se.Uncertain != (want == ratebudget.ClassTimeout) {
				t.Errorf("%s: event %d: class %q uncertain %t, want %q uncertain %t", a.name, i, se.Class, se.Uncertain, want, want == ratebudget.ClassTimeout)
			}
		}
		if timeouts < 1 || timeouts > failures {
			t.Errorf("%s: %d timeouts before the breaker opened, want 1..%d", a.name, timeouts, failures)
		}
		if got := a.tr.get(); !slices.Equal(got, []string{"closed>open"}) {
			t.Errorf("%s: transitions %v, want [closed>open]", a.name, got)
		}
		t.Logf("%s: slowest request while paused %v (deadline %v)", a.name, worst, faultDeadline)
	}

	fr.unpause(t)
	for _, a := range arms {
		// The time to recover is logged, not asserted (a loaded machine may take longer
		// than the cool-down and a probe); that one probe closed the breaker is asserted
		// by the transitions below. The deadline only stops a breaker that never closes.
		start := time.Now()
		tries := 0
		for {
			tries++
			rec, _ := a.serve()
			if rec.Code == 200 {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("%s: no decision from Redis %v after unpausing (cool-down %v)", a.name, time.Since(start), cooldown)
			}
			time.Sleep(10 * time.Millisecond) // pacing, not synchronisation: the loop has a deadline
		}
		if got := a.tr.get(); !slices.Equal(got, []string{"closed>open", "open>closed"}) {
			t.Errorf("%s: transitions %v, want closed>open, open>closed: a probe closes it", a.name, got)
		}
		t.Logf("%s: decisions back on Redis %v after unpausing, %d requests", a.name, time.Since(start), tries)
	}

	// The scripts of the timed-out requests were sent; the server ran them when it woke
	// up, unless the connection was gone by then. With go-redis's defaults the client
	// keeps the connection and reads the late reply, so every one of them spent: a
	// timeout is an uncertain result, not a refusal that cost nothing.
	for _, a := range arms {
		var allowed, timeouts int
		for _, e := range a.h.since(0) {
			if e.Result == middleware.Allowed {
				allowed++
			} else if se := storeErr(t, e); se.Class == ratebudget.ClassTimeout {
				timeouts++
			}
		}
		key := faultKey(t, a.prefix, 1000)
		deadline := time.Now().Add(5 * time.Second)
		for {
			spent, err := control.Get(ctxT(t), key).Int()
			if err != nil {
				t.Fatal(err)
			}
			// Each timed-out decision may or may not have run: it was sent, or dropped
			// unsent when its deadline passed while it waited behind a hung pipeline.
			if spent >= allowed && spent <= allowed+timeouts {
				t.Logf("%s: %d admitted, %d timed out; the server spent %d", a.name, allowed, timeouts, spent)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d admitted, %d timed out; the server spent %d", a.name, allowed, timeouts, spent)
			}
			time.Sleep(20 * time.Millisecond) // polling with a deadline
		}
	}
}

// TestRestartedRedisResumes: after Stop and Start the server is empty (no budgets, no
// script cache). Decisions resume without any action (EVALSHA → NOSCRIPT → EVAL heals
// the cache) and the budget starts afresh: a restart loses budget state.
func TestRestartedRedisResumes(t *testing.T) {
	t.Parallel()
	testRestartedRedisResumes(t)
}

func testRestartedRedisResumes(t *testing.T) {
	const limit = 5
	fr := startFaultRedis(t)
	opts := recommendedOptions()
	opts.Dialer = fr.dialer(opts.DialTimeout) // the mapped port changes on restart
	c := fr.client(t, opts)
	calls := countScripts(c)
	h, ev, prefix := faultHandler(t, c, limit, faultDeadline) // with the default breaker
	warm(t, h, ev)
	for range 2 {
		if rec, _ := serve(t, h, faultBound); rec.Code != 200 {
			t.Fatalf("before restart: %d", rec.Code)
		}
	}
	control := fr.client(t, opts)
	key := faultKey(t, prefix, limit)
	if v, err := control.Get(ctxT(t), key).Result(); err != nil || v != "3" {
		t.Fatalf("budget before restart: %q %v, want 3 spent", v, err)
	}

	fr.stop(t)
	fr.start(t)

	start := time.Now()
	var rec *httptest.ResponseRecorder
	tries := 0
	for {
		tries++
		rec, _ = serve(t, h, faultBound)
		if rec.Code == 200 {
			break
		}
		if rec.Code != 503 || time.Since(start) > 10*time.Second {
			t.Fatalf("after restart: %d after %v, want 200 within 10s", rec.Code, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond) // pacing; the loop has a deadline
	}
	t.Logf("decisions resumed %v after the restart, on request %d", time.Since(start), tries)
	if got := rec.Header().Get("X-RateLimit-Remaining"); got != strconv.Itoa(limit-1) {
		t.Errorf("first admission after restart: remaining %q, want %d: the budget starts afresh", got, limit-1)
	}
	sha, eval := serverScriptCalls(t, control)
	if eval < 1 || sha < 1 {
		t.Errorf("server saw evalsha=%d eval=%d, want the NOSCRIPT → EVAL path", sha, eval)
	}
	t.Logf("after restart the server saw evalsha=%d eval=%d; the client's hooks saw %d+%d in all", sha, eval, calls.evalsha.Load(), calls.eval.Load())
	codes := []int{200}
	for range limit {
		r, _ := serve(t, h, faultBound)
		codes = append(codes, r.Code)
	}
	if want := []int{200, 200, 200, 200, 200, 429}; !slices.Equal(codes, want) {
		t.Errorf("after restart: %v, want %v: exactly the limit, from zero", codes, want)
	}
}

// TestOOMIsDefinite: a server over maxmemory with noeviction answers every script with
// an OOM error. It is definite (class "server", not uncertain, nothing spent), the
// policy applies, and there is exactly one script call per request: no retry storm, even
// with go-redis's default retries.
func TestOOMIsDefinite(t *testing.T) {
	t.Parallel()
	fr := startFaultRedis(t)
	control := fr.control(t)
	ctx := ctxT(t)
	type arm struct {
		name   string
		h      *events
		calls  *scriptCalls
		prefix string
		serve  func() (*httptest.ResponseRecorder, time.Duration)
	}
	var arms []*arm
	for _, v := range clientVariants() {
		c := fr.client(t, v.opts)
		a := &arm{name: v.name, calls: countScripts(c)}
		h, ev, prefix := faultHandler(t, c, 100, faultDeadline, middleware.WithBreaker(middleware.Breaker{Disabled: true}))
		warm(t, h, ev) // also loads the script: later calls are one EVALSHA each
		a.h, a.prefix = ev, prefix
		a.serve = func() (*httptest.ResponseRecorder, time.Duration) { return serve(t, h, faultBound) }
		arms = append(arms, a)
	}
	// Some data, then a limit below what is used.
	filler := strings.Repeat("x", 64<<10)
	for i := range 32 {
		if err := control.Set(ctx, "filler:"+strconv.Itoa(i), filler, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	used := usedMemory(t, control)
	if err := control.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := control.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used/2, 10)).Err(); err != nil {
		t.Fatal(err)
	}

	const requests = 5
	for _, a := range arms {
		sha0, eval0 := serverScriptCalls(t, control)
		before, n := a.calls.total(), a.h.len()
		for i := range requests {
			if rec, _ := a.serve(); rec.Code != 503 {
				t.Fatalf("%s: request %d: %d, want 503 (fail closed)", a.name, i, rec.Code)
			}
		}
		for i, e := range a.h.since(n) {
			se := storeErr(t, e)
			var rerr redis.Error
			if se.Class != ratebudget.ClassServer || se.Uncertain || !errors.As(se, &rerr) || !strings.HasPrefix(rerr.Error(), "OOM") {
				t.Errorf("%s: event %d: %v, want a definite server error (OOM)", a.name, i, se)
			}
		}
		if got := a.calls.total() - before; got != requests {
			t.Errorf("%s: %d script calls for %d requests, want exactly one each", a.name, got, requests)
		}
		sha1, eval1 := serverScriptCalls(t, control)
		if sha1-sha0 != requests || eval1 != eval0 {
			t.Errorf("%s: server saw %d EVALSHA and %d EVAL for %d requests, want one EVALSHA each", a.name, sha1-sha0, eval1-eval0, requests)
		}
		// Nothing was spent: the warm-up's admission is all the budget holds.
		if v, err := control.Get(ctx, faultKey(t, a.prefix, 100)).Result(); err != nil || v != "1" {
			t.Errorf("%s: budget %q %v, want 1 (the warm-up only)", a.name, v, err)
		}
	}
}

// TestLostReplyIsUncertain: the script reaches Redis and runs, but its reply is lost
// (a proxy drops it and closes the connection). The error is classified uncertain, and
// the budget WAS spent on the server. Whatever the client's retry settings, the script
// is not sent again: spent once.
func TestLostReplyIsUncertain(t *testing.T) {
	t.Parallel()
	requireRedis(t)
	control := newClient(t, 2)
	p := startProxy(t, redisAddr)
	const limit = 100
	for _, v := range transportVariants() {
		t.Run(v.name, func(t *testing.T) {
			opts := *v.opts
			opts.Addr = p.Addr()
			c := redis.NewClient(&opts)
			t.Cleanup(func() { c.Close() })
			// A deadline long enough for go-redis's retries: this test is about counts.
			h, ev, prefix := faultHandler(t, c, limit, 3*time.Second, middleware.WithBreaker(middleware.Breaker{Disabled: true}))
			warm(t, h, ev)
			key := faultKey(t, prefix, limit)
			spent := func() int {
				v, err := control.Get(ctxT(t), key).Int()
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			if got := spent(); got != 1 {
				t.Fatalf("after warm-up: %d spent, want 1", got)
			}
			p.drop.Store(true)
			defer p.drop.Store(false)
			dropped0, n := p.dropped.Load(), ev.len()
			rec, _ := serve(t, h, 3*time.Second+time.Second)
			if rec.Code != 503 {
				t.Fatalf("lost reply: %d, want 503", rec.Code)
			}
			evs := ev.since(n)
			se := storeErr(t, evs[0])
			if !se.Uncertain || se.Class != ratebudget.ClassConnection {
				t.Errorf("lost reply classified %q uncertain=%t, want connection, uncertain", se.Class, se.Uncertain)
			}
			dropped := p.dropped.Load() - dropped0
			got := spent() - 1
			// Sent once, spent once, with go-redis's default retries too: the limiter marks
			// its script calls as never to be re-sent (with the defaults and no mark, go-redis
			// re-sent after the EOF and spent 2 to 4 times).
			if got != 1 || dropped != 1 {
				t.Errorf("one request with a lost reply spent %d (replies dropped %d), want exactly 1", got, dropped)
			}
			t.Logf("%s: one request whose reply was lost: 503, %v, spent %d on the server", v.name, se, got)
		})
	}
}

// TestCanceledMidDecision: a request canceled while its script is in flight is not
// served and nothing is written; the middleware returns at once (not at the deadline);
// the cancellation does not count against the store in the breaker. The script still ran
// on the server: a canceled decision may have spent.
func TestCanceledMidDecision(t *testing.T) {
	t.Parallel()
	requireRedis(t)
	control := newClient(t, 2)
	p := startProxy(t, redisAddr)
	opts := recommendedOptions()
	opts.Addr = p.Addr()
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	const limit, deadline = 100, 5 * time.Second
	h, ev, prefix := faultHandler(t, c, limit, deadline) // with the default breaker
	warm(t, h, ev)
	for len(p.sent) > 0 { // forget the warm-up's scripts
		<-p.sent
	}
	p.hold.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	done := make(chan time.Duration)
	go func() {
		start := time.Now()
		h.ServeHTTP(rec, req)
		done <- time.Since(start)
	}()
	select {
	case <-p.sent: // the script is on its way to Redis
	case <-time.After(5 * time.Second):
		t.Fatal("the script never reached the proxy")
	}
	cancel()
	el := <-done
	if el > deadline/2 {
		t.Errorf("canceled request returned after %v; want well before the %v deadline", el, deadline)
	}
	close(p.release)
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 { // the handler would have written "ok"
		t.Errorf("canceled request: body %q headers %v, want nothing written and the handler not called", rec.Body.String(), rec.Header())
	}
	if evs := ev.since(ev.len() - 1); evs[0].Result != middleware.Canceled {
		t.Errorf("event %v, want canceled", evs[0].Result)
	}
	p.hold.Store(false)
	// Had the cancellation counted, its call would be one left without a reply for
	// longer than Stall (100ms) by now, and the breaker would open at the next request.
	time.Sleep(150 * time.Millisecond)
	if rec, _ := serve(t, h, faultBound); rec.Code != 200 {
		t.Errorf("after a canceled request: %d, want 200 from Redis", rec.Code)
	}
	// The released script of the canceled request may reach Redis after the last one
	// (it travels on another connection): wait for it, with a deadline.
	var v int
	var err error
	for end := time.Now().Add(2 * time.Second); ; {
		v, err = control.Get(ctxT(t), faultKey(t, prefix, limit)).Int()
		if err != nil || v >= 3 || time.Now().After(end) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err != nil || v != 3 {
		t.Errorf("budget %d %v, want 3: warm-up, the canceled request (it ran), the last one", v, err)
	}
}

// TestMetricsUnderFaults: after a scripted sequence on real Redis — admitted, denied,
// then Redis stopped under FailOpen and FailClosed — the Prometheus counters equal what
// was sent, and store errors are counted by class.
func TestMetricsUnderFaults(t *testing.T) {
	t.Parallel()
	fr := startFaultRedis(t)
	c := fr.client(t, recommendedOptions())
	col := metrics.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	obs := []middleware.Option{
		middleware.WithObserver(col.Observe),
		middleware.WithBreaker(middleware.Breaker{OnChange: col.BreakerChanged}),
	}
	// Three budgets: one spent while Redis is up, two asked only once it is stopped (a
	// refusal the limiter remembers would otherwise be repeated without a store call).
	up, upEv, _ := faultHandler(t, c, 3, faultDeadline, obs...)
	open, openEv, _ := faultHandler(t, c, 3, faultDeadline, append(obs, middleware.WithFailOpen())...)
	closed, closedEv, _ := faultHandler(t, c, 3, faultDeadline, obs...) // the default policy, fail-closed
	// Load the script and open a connection outside the counted sequence.
	hw, evw, _ := faultHandler(t, c, 3, faultDeadline)
	warm(t, hw, evw)

	var codes []int
	for range 5 { // limit 3: 3 admitted, 2 denied
		rec, _ := serve(t, up, faultBound)
		codes = append(codes, rec.Code)
	}
	if want := []int{200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
		t.Fatalf("with Redis up: %v, want %v", codes, want)
	}
	fr.stop(t)
	// Each breaker opens after at most 3 store errors (3 refused connections in a row, or
	// one call left without a reply for Stall), then answers breaker_open.
	const stopped = 5
	for range stopped {
		if rec, _ := serve(t, open, faultBound); rec.Code != 200 {
			t.Fatalf("fail open, Redis stopped: %d", rec.Code)
		}
	}
	for range stopped {
		if rec, _ := serve(t, closed, faultBound); rec.Code != 503 {
			t.Fatalf("fail closed, Redis stopped: %d", rec.Code)
		}
	}

	// What the test saw, by class, from the events.
	wantErrs := map[string]float64{}
	var calls [2]float64 // store calls while Redis was stopped, of open and closed
	for i, evs := range [][]middleware.Event{upEv.since(0), openEv.since(0), closedEv.since(0)} {
		for _, e := range evs {
			if e.Err == nil {
				continue
			}
			se := storeErr(t, e)
			wantErrs[string(se.Class)+"/"+strconv.FormatBool(se.Uncertain)]++
			if i > 0 && se.Class != ratebudget.ClassBreakerOpen {
				calls[i-1]++
			}
		}
	}
	for i, n := range calls {
		if n < 1 || n > 3 {
			t.Errorf("handler %d: %v store calls to the stopped server, want 1..3 before the breaker opens", i, n)
		}
	}
	got := gather(t, reg)
	for k, want := range map[string]float64{
		`ratebudget_decisions_total{outcome="allowed",rule="fault"}`:            3,
		`ratebudget_decisions_total{outcome="denied",rule="fault"}`:             2,
		`ratebudget_decisions_total{outcome="degraded",rule="none"}`:            stopped,
		`ratebudget_decisions_total{outcome="unavailable",rule="none"}`:         stopped,
		`ratebudget_breaker_transitions_total{to="open"}`:                       2,
		`ratebudget_breaker_state`:                                              1, // the last transition was to open
		`ratebudget_decision_duration_seconds_count{result="ok"}`:               5,
		`ratebudget_decision_duration_seconds_count{result="error"}`:            calls[0] + calls[1],
		`ratebudget_store_errors_total{class="breaker_open",uncertain="false"}`: 2*stopped - calls[0] - calls[1],
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	var allErrs float64
	for k, v := range wantErrs {
		allErrs += v
		class, unc, _ := strings.Cut(k, "/")
		if class != "connection" && class != "breaker_open" && class != "timeout" {
			t.Errorf("store error class %q from a stopped server", class)
		}
		name := fmt.Sprintf(`ratebudget_store_errors_total{class=%q,uncertain=%q}`, class, unc)
		if got[name] != v {
			t.Errorf("%s = %v, the events say %v", name, got[name], v)
		}
	}
	if allErrs != 2*stopped {
		t.Errorf("events: %v store errors, want %d (calls to the stopped server, and those skipped by the breaker)", allErrs, 2*stopped)
	}
	t.Logf("store errors by class: %v", wantErrs)
}

// gather returns every sample of reg as `name{label="value",...}` → value (counters,
// gauges, and histogram counts as name_count).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			ls := ""
			if len(labels) > 0 {
				ls = "{" + strings.Join(labels, ",") + "}"
			}
			switch mf.GetType().String() {
			case "COUNTER":
				out[mf.GetName()+ls] = m.GetCounter().GetValue()
			case "GAUGE":
				out[mf.GetName()+ls] = m.GetGauge().GetValue()
			case "HISTOGRAM":
				out[mf.GetName()+"_count"+ls] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestBlackholedDialIsDefinite: a dial that times out (a blackholed address: no answer
// to SYN) never sent the script, so the error is a definite connection error, not an
// uncertain timeout. The dialer waits for its deadline and then dials, which yields
// exactly the error the standard library returns for a dial past its deadline.
func TestBlackholedDialIsDefinite(t *testing.T) {
	t.Parallel()
	opts := recommendedOptions()
	opts.Addr = "127.0.0.1:1" // never dialled for real (the dialer returns past its deadline)
	opts.DialTimeout = 100 * time.Millisecond
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done() // the SYN is never answered
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	lim, err := luaNew(c, uniquePrefix(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = lim.Allow(ctxT(t), []ratebudget.Check{{Rule: faultRule(10), Cost: 1}})
	var se *ratebudget.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("error %v, want a *ratebudget.StoreError", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" || !op.Timeout() {
		t.Fatalf("error %v, want a dial timeout underneath", err)
	}
	if se.Class != ratebudget.ClassConnection || se.Uncertain {
		t.Errorf("dial timeout classified %q uncertain=%t, want connection, definite: nothing was sent", se.Class, se.Uncertain)
	}
}
