package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// slowPattern matches the Redis key of the demo's "slow" leases (one key per client IP:
// <prefix>:{<identity digest>}:<rule>:<algorithm>, see lua.Limiter.Key).
const slowPattern = "rb-demo:*:slow:inflight"

// leaseState is what Redis holds of the "slow" leases: the live leases' expiries (server
// milliseconds, in order) and the server's time when they were read.
type leaseState struct {
	now     int64
	expires []int64
}

// slowLeases reads the slow leases of the one client IP the tests use. It fails the test
// if there is more than one such key.
func slowLeases(t *testing.T, rdb *redis.Client) leaseState {
	t.Helper()
	ctx := context.Background()
	var keys []string
	iter := rdb.Scan(ctx, 0, slowPattern, 100).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	st := leaseState{now: now.UnixMilli()}
	switch len(keys) {
	case 0:
		return st
	case 1:
	default:
		t.Fatalf("lease keys %v, want one (a single client IP)", keys)
	}
	zs, err := rdb.ZRangeByScoreWithScores(ctx, keys[0], &redis.ZRangeBy{Min: "(" + strconv.FormatInt(st.now, 10), Max: "+inf"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, z := range zs {
		st.expires = append(st.expires, int64(z.Score))
	}
	return st
}

// redisNow is the Redis server's clock, in Unix milliseconds.
func redisNow(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// waitFor polls cond every few milliseconds until it holds, and fails the test with what
// if it has not within d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond) // the pace of the polling, not a synchronisation
	}
}

// slowReply is one /api/slow request's answer as soon as its headers came: an admitted
// request's body is still streaming (its handler runs) until the request's context ends.
type slowReply struct {
	server int
	resp   *http.Response
	err    error
}

// slowRequest sends GET base/api/slow?ms=N under ctx. For a 200 it reads the line the demo
// flushes on admission, so the handler is known to run, and leaves the body open (closed
// when the test ends); any other answer is read and closed.
func slowRequest(ctx context.Context, client *http.Client, base string, ms int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/slow?ms="+strconv.Itoa(ms), nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, nil
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if want := "sleeping " + strconv.Itoa(ms) + " ms\n"; err != nil || line != want {
		resp.Body.Close()
		return nil, errors.New("admitted, but the body starts " + strconv.Quote(line) + ", want " + strconv.Quote(want))
	}
	return resp, nil
}

// slowStyles are the -headers of the two demo servers of TestDemoSlowTenAcrossTwoServers,
// so that the metadata of either style is checked.
var slowStyles = [2]string{"x", "ietf"}

// slowRemaining is the number of slots left that an answer of the "slow" rule reports:
// its X-RateLimit-Remaining under -headers x, its RateLimit's r under -headers ietf.
func slowRemaining(resp *http.Response) string {
	if v := resp.Header.Get("X-RateLimit-Remaining"); v != "" {
		return v
	}
	v, _ := strings.CutPrefix(resp.Header.Get("RateLimit"), `"slow";r=`)
	v, _, _ = strings.Cut(v, ";")
	return v
}

// checkSlowRefusal checks a 429 of the "slow" rule (-inflight limit, -lease-ttl ttl,
// -headers style, x or ietf): Retry-After 1 whatever the lease TTL, no caching, and the
// budget metadata of a full in-flight rule: nothing remaining, reset within the lease
// TTL (X-RateLimit-*), or no t (the IETF fields).
func checkSlowRefusal(t *testing.T, what string, resp *http.Response, limit int, ttl time.Duration, style string) {
	t.Helper()
	h := resp.Header
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%s: %d, want 429", what, resp.StatusCode)
	}
	if h.Get("Retry-After") != "1" || h.Get("Cache-Control") != "no-store" {
		t.Errorf("%s: Retry-After %q, Cache-Control %q; want 1 and no-store", what, h.Get("Retry-After"), h.Get("Cache-Control"))
	}
	l := strconv.Itoa(limit)
	if style == "ietf" {
		if h.Get("X-RateLimit-Limit") != "" {
			t.Errorf("%s: X-RateLimit-Limit %q under -headers ietf", what, h.Get("X-RateLimit-Limit"))
		}
		if p := h.Get("RateLimit-Policy"); p != `"slow";q=`+l+`;qu="concurrent-requests"` {
			t.Errorf("%s: RateLimit-Policy %q", what, p)
		}
		// No t: an in-flight slot frees when a request ends, at no time known in advance.
		if r := h.Get("RateLimit"); r != `"slow";r=0` {
			t.Errorf("%s: RateLimit %q, want \"slow\";r=0", what, r)
		}
		return
	}
	if h.Get("RateLimit-Policy") != "" {
		t.Errorf("%s: RateLimit-Policy %q under -headers x", what, h.Get("RateLimit-Policy"))
	}
	if h.Get("X-RateLimit-Limit") != l || h.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("%s: X-RateLimit-Limit %q, -Remaining %q; want %s and 0", what, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), l)
	}
	// Reset: until the last lease expires, which is at most a lease TTL away.
	if r, err := strconv.Atoi(h.Get("X-RateLimit-Reset")); err != nil || r < 1 || time.Duration(r)*time.Second > ttl {
		t.Errorf("%s: X-RateLimit-Reset %q, want 1 to %v in seconds", what, h.Get("X-RateLimit-Reset"), ttl)
	}
}

// TestDemoSlowTenAcrossTwoServers: two demo servers on one Redis, -inflight 3. Ten
// concurrent slow requests, alternately to each server, all decided while the admitted
// ones run: exactly three are admitted and seven refused (429, Retry-After 1, the
// in-flight metadata). Once the three are over (their clients gone, Redis holding no
// lease), three more are admitted and a fourth is refused by either server.
func TestDemoSlowTenAcrossTwoServers(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	url := "redis://" + srv.Addr + "/0"
	// The default -lease-ttl, 10s: the admitted requests (10s each) are renewed once.
	const ttl = 10 * time.Second
	args := []string{"-redis", url, "-inflight", "3", "-store-timeout", "2s", "-headers"}
	servers := []string{startDemo(t, append(args, slowStyles[0])...), startDemo(t, append(args, slowStyles[1])...)}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	replies := make(chan slowReply, 10)
	start := make(chan struct{})
	for i := range 10 {
		go func() {
			<-start
			resp, err := slowRequest(ctx, client, servers[i%2], 10000)
			replies <- slowReply{i % 2, resp, err}
		}()
	}
	close(start)
	var admitted, refused []slowReply
	deadline := time.After(30 * time.Second) // far beyond ten decisions; the admitted run 10s
	for range 10 {
		select {
		case r := <-replies:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.resp.StatusCode == http.StatusOK {
				t.Cleanup(func() { r.resp.Body.Close() })
				admitted = append(admitted, r)
			} else {
				refused = append(refused, r)
			}
		case <-deadline:
			t.Fatalf("%d admitted and %d refused of 10 after 30s", len(admitted), len(refused))
		}
	}
	// Every one of the ten was decided while the admitted ones held their leases: Redis
	// still holds exactly three, none of which has expired.
	st := slowLeases(t, rdb)
	if len(admitted) != 3 || len(refused) != 7 || len(st.expires) != 3 {
		t.Fatalf("%d admitted, %d refused, %d leases live; want 3, 7 and 3", len(admitted), len(refused), len(st.expires))
	}
	var remaining []string
	perServer := [2]int{}
	for _, r := range admitted {
		remaining = append(remaining, slowRemaining(r.resp))
		perServer[r.server]++
	}
	// The three admissions were decided one after the other: each left one slot fewer.
	slices.Sort(remaining)
	if !slices.Equal(remaining, []string{"0", "1", "2"}) {
		t.Errorf("admitted with remaining %v, want 2, 1 and 0 in some order", remaining)
	}
	for i, r := range refused {
		checkSlowRefusal(t, "refusal "+strconv.Itoa(i)+" on server "+strconv.Itoa(r.server), r.resp, 3, ttl, slowStyles[r.server])
	}
	t.Logf("admitted on servers 0 and 1: %d and %d; leases expire %v ms from now", perServer[0], perServer[1],
		[]int64{st.expires[0] - st.now, st.expires[1] - st.now, st.expires[2] - st.now})

	// The three clients go away: their handlers return and release their leases, long
	// before the leases would expire.
	cancel()
	waitFor(t, 5*time.Second, "the three leases released after their clients went away", func() bool {
		return len(slowLeases(t, rdb).expires) == 0
	})
	if now := redisNow(t, rdb); now >= st.expires[0] {
		t.Fatalf("the leases were freed at %d, not before their first expiry %d: expired, not released", now, st.expires[0])
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	for i, want := range []string{"2", "1", "0"} {
		resp, err := slowRequest(ctx2, client, servers[i%2], 10000)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || slowRemaining(resp) != want {
			t.Fatalf("request %d after the release: %d, remaining %q; want 200, %s", i, resp.StatusCode, slowRemaining(resp), want)
		}
		t.Cleanup(func() { resp.Body.Close() })
	}
	for i, base := range servers {
		resp, err := slowRequest(ctx2, client, base, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkSlowRefusal(t, "a fourth on server "+strconv.Itoa(i), resp, 3, ttl, slowStyles[i])
	}
}

// demoProcess is the demo's main running in a child process of the test binary.
type demoProcess struct {
	cmd    *exec.Cmd
	base   string        // http://addr
	exited chan struct{} // closed once the process has exited and been waited for
}

// startDemoProcess runs the demo's main (as runMain does) with -addr 127.0.0.1:0 and args
// in a child process, reads the address it listens on from its "listening" log line,
// and kills it when the test ends if it still runs.
func startDemoProcess(t *testing.T, args ...string) *demoProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = w, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close() // the child holds its own copy
	p := &demoProcess{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		r.Close()
	})
	addr := make(chan string, 1)
	go func() {
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if !strings.Contains(line, "msg=listening ") {
				continue
			}
			for _, f := range strings.Fields(line) {
				if a, ok := strings.CutPrefix(f, "addr="); ok {
					addr <- a
					break
				}
			}
			_, _ = io.Copy(io.Discard, br) // the rest of its log, until it exits
			return
		}
	}()
	select {
	case a := <-addr:
		p.base = "http://" + a
	case <-p.exited:
		t.Fatalf("the demo process exited before listening: %v; stderr: %s", cmd.ProcessState, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the demo process did not report its address within 30s")
	}
	return p
}

// TestDemoKilledFreesLeases: a demo process holding a slow request's lease is killed
// (SIGKILL: it releases nothing) mid-request. Another demo on the same Redis refuses at
// first, as the lease still holds the only slot, and admits once it has expired: the
// lease's expiry in Redis is at most a lease TTL after the kill, because a running
// request's lease is renewed only while its process lives.
func TestDemoKilledFreesLeases(t *testing.T) {
	needSignals(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	url := "redis://" + srv.Addr + "/0"
	const ttl = 2 * time.Second
	args := []string{"-redis", url, "-inflight", "1", "-lease-ttl", ttl.String(), "-store-timeout", "2s"}
	victim := startDemoProcess(t, args...)
	survivor := startDemo(t, args...) // started first, so it can answer at once after the kill
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := slowRequest(ctx, client, victim.base, 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("slow request to the process: %d, want 200", resp.StatusCode)
	}
	st := slowLeases(t, rdb)
	if len(st.expires) != 1 {
		t.Fatalf("%d leases live while the request runs, want 1", len(st.expires))
	}
	taken := st.expires[0]
	// The process renews the lease while the request runs (every ttl/2): wait until it
	// has, so that the kill stops a renewing holder.
	waitFor(t, 3*ttl, "the running request's lease renewed", func() bool {
		s := slowLeases(t, rdb)
		return len(s.expires) == 1 && s.expires[0] > taken
	})

	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.exited
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the demo process ended with %v, want killed by SIGKILL", victim.cmd.ProcessState)
	}

	// The lease outlives its holder, but by no more than one TTL from the kill: Redis and
	// this process read the same machine's clock; 250ms of slack covers a renewal the
	// process sent just before it died and Redis ran just after.
	st = slowLeases(t, rdb)
	if len(st.expires) != 1 {
		t.Fatalf("%d leases live right after the kill, want the killed request's 1", len(st.expires))
	}
	expiry := st.expires[0]
	if bound := killed.Add(ttl + 250*time.Millisecond).UnixMilli(); expiry > bound {
		t.Fatalf("the lease expires %d ms after the kill, more than the TTL %v (+250ms)", expiry-killed.UnixMilli(), ttl)
	}

	// decide asks the surviving demo for a slot, reading the Redis clock before and after.
	decide := func() (code int, before, after int64) {
		before = redisNow(t, rdb)
		r, err := slowRequest(context.Background(), client, survivor, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.StatusCode == http.StatusTooManyRequests && r.Header.Get("Retry-After") != "1" {
			t.Errorf("refusal with Retry-After %q, want 1", r.Header.Get("Retry-After"))
		}
		if r.StatusCode == http.StatusOK {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		return r.StatusCode, before, redisNow(t, rdb)
	}
	// Right after the kill: refused, the dead process's lease holds the slot.
	if code, _, after := decide(); code != http.StatusTooManyRequests {
		t.Fatalf("right after the kill: %d, want 429 (Redis time %d ms before the lease's expiry)", code, expiry-after)
	}
	// Then refused while the lease lives, and admitted once it has expired. Each answer
	// is checked against the Redis clock: a refusal must have started before the expiry,
	// an admission must have ended after it.
	refusals := 1
	deadline := killed.Add(5 * ttl)
	for {
		code, before, after := decide()
		if code == http.StatusOK {
			if after < expiry {
				t.Fatalf("admitted %d ms before the dead process's lease expired", expiry-after)
			}
			t.Logf("kill to first admission: %v (%d refusals first); the lease expired %d ms after the kill",
				time.Since(killed).Round(time.Millisecond), refusals, expiry-killed.UnixMilli())
			break
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("after the kill: %d, want 429 or 200", code)
		}
		if before >= expiry {
			t.Fatalf("refused %d ms after the dead process's lease expired", before-expiry)
		}
		refusals++
		if time.Now().After(deadline) {
			t.Fatalf("still refused %v after the kill (lease TTL %v)", time.Since(killed), ttl)
		}
		time.Sleep(10 * time.Millisecond) // the pace of the polling, not a synchronisation
	}
}

// A second SIGINT while the server waits for running requests to finish stops it at
// once, as the default action of the signal does: the first only starts the graceful
// shutdown.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	needSignals(t)
	p := startDemoProcess(t)
	resp, err := slowRequest(context.Background(), http.DefaultClient, p.base, 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("slow request: %d", resp.StatusCode)
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	// The listener closes once the first signal is handled.
	addr := strings.TrimPrefix(p.base, "http://")
	waitFor(t, 30*time.Second, "the listener closed after the first SIGINT", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	// A process started with SIGINT ignored (a background job of a shell without job
	// control, as go test may be) passes that on to the demo, whose second SIGINT is
	// then ignored, as it was asked: the second signal is SIGTERM there.
	second := syscall.SIGINT
	if signal.Ignored(os.Interrupt) {
		second = syscall.SIGTERM
	}
	if err := p.cmd.Process.Signal(second); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != second {
		t.Errorf("after a second signal (%v): %v, want the process killed by it", second, p.cmd.ProcessState)
	}
}

// Shutdown on Redis: a GET /api/slow running when the server is told to stop gets its
// whole answer, and its lease is released before run returns (not left to expire).
func TestShutdownReleasesLeaseOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		// The test is about the shutdown, not the decision's deadline: a loaded machine
		// under the race detector may take more than the default 50 ms.
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-redis", "redis://" + srv.Addr + "/0", "-lease-ttl", "1h", "-store-timeout", "2s"}, io.Discard, ready)
		close(exited)
	}()
	// On a failure below, the server is stopped before the next test starts.
	t.Cleanup(func() { cancel(); <-exited })
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("demo-server did not start: %v", err)
	}
	resp, err := slowRequest(context.Background(), http.DefaultClient, base, 3000)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("slow request: %d", resp.StatusCode)
	}
	if st := slowLeases(t, rdb); len(st.expires) != 1 {
		t.Fatalf("leases while the request runs: %v, want one", st.expires)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v, want a clean shutdown", err)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "slept 3000 ms\n" {
		t.Errorf("rest of the answer %q, %v; want it whole", rest, err)
	}
	if st := slowLeases(t, rdb); len(st.expires) != 0 {
		t.Errorf("leases after the shutdown: %v, want none (a 1 h lease left behind)", st.expires)
	}
}
