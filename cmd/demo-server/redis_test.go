package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// Two demo servers on one Redis share every budget: 80 concurrent requests between them
// admit exactly the limit, and every key they leave expires.
func TestTwoServersShareOneRedisBudget(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr + "/0"
	// A generous deadline: this test is about exactness, not latency (cold pools, -race).
	// Both servers coalesce concurrent requests for one budget (the default -coalesce).
	a := startDemo(t, "-redis", url, "-limit", "20", "-window", "30s", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32")
	b := startDemo(t, "-redis", url, "-limit", "20", "-window", "30s", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32")

	for trial := range 3 {
		var admitted, refused atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 80 {
			base := a
			if i%2 == 1 {
				base = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				req, _ := http.NewRequest("GET", base+"/api/hello", nil)
				// A new client per trial: each trial spends a fresh budget.
				req.Header.Set("X-Forwarded-For", "203.0.113."+strconv.Itoa(trial+1))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					admitted.Add(1)
				case 429:
					refused.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}()
		}
		close(start)
		wg.Wait()
		if admitted.Load() != 20 || refused.Load() != 60 {
			t.Fatalf("trial %d: admitted %d refused %d, want 20 and 60", trial, admitted.Load(), refused.Load())
		}
		// Every key the trial left expires within the window.
		c := srv.Client(t)
		keys, err := c.Keys(context.Background(), "rb-demo:*").Result()
		if err != nil || len(keys) != trial+1 {
			t.Fatalf("keys %v %v, want %d", keys, err, trial+1)
		}
		for _, k := range keys {
			ttl, err := c.PTTL(context.Background(), k).Result()
			if err != nil || ttl <= 0 || ttl > 30*time.Second {
				t.Fatalf("key %q has PTTL %v (%v), want within (0, 30s]", k, ttl, err)
			}
		}
	}
}

func TestStoreDownPolicies(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr + "/0"
	closed := startDemo(t, "-redis", url, "-store-error", "closed")
	open := startDemo(t, "-redis", url, "-store-error", "open")
	local := startDemo(t, "-redis", url, "-store-error", "local", "-replicas", "2", "-limit", "10")
	for _, base := range []string{closed, open, local} {
		if resp := get(t, "GET", base+"/api/hello", nil); resp.StatusCode != 200 {
			t.Fatalf("with Redis up: %d", resp.StatusCode)
		}
	}
	srv.Kill(t)

	resp := get(t, "GET", closed+"/api/hello", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("closed: %d %v, want 503 with no-store and Retry-After", resp.StatusCode, resp.Header)
	}
	if resp := get(t, "GET", open+"/api/hello", nil); resp.StatusCode != 200 {
		t.Errorf("open: %d, want 200", resp.StatusCode)
	}
	var codes []int
	for range 7 {
		codes = append(codes, get(t, "GET", local+"/api/hello", nil).StatusCode)
	}
	want := []int{200, 200, 200, 200, 200, 429, 429} // 10 / 2 replicas = 5 in this process
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("local -replicas 2 -limit 10: %v, want %v", codes, want)
		}
	}
}

// A frozen Redis (SIGSTOP: connections open, nothing answers) costs a request the
// decision deadline, not the client's timeouts.
func TestFrozenRedisAnswersFast(t *testing.T) {
	srv := redistest.Start(t)
	base := startDemo(t, "-redis", "redis://"+srv.Addr+"/0", "-store-error", "closed", "-store-timeout", "50ms")
	if resp := get(t, "GET", base+"/api/hello", nil); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	srv.Freeze(t)
	client := &http.Client{Timeout: 2 * time.Second} // a bound on the test, not the assertion
	for i := range 3 {
		resp, err := client.Get(base + "/api/hello")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Fatalf("request %d: %d, want 503", i, resp.StatusCode)
		}
	}
	// Concurrent requests for one budget wait in a coalesced group behind a decision in
	// flight: each is still bounded by its own deadline.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			resp, err := client.Get(base + "/api/hello")
			if err != nil {
				t.Errorf("concurrent request %d: %v", i, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 503 {
				t.Errorf("concurrent request %d: %d, want 503", i, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	srv.Thaw(t)
}

// TestReportRouteOneCallPerRequest: on one Redis server (the default -one-server), the
// report route's per-account and route-wide budgets, in different slots, are decided
// in one script call per request; a request the route-wide budget refuses spends
// nothing, so no refund call follows.
func TestReportRouteOneCallPerRequest(t *testing.T) {
	srv := redistest.Start(t)
	base := startDemo(t, "-redis", "redis://"+srv.Addr+"/0", "-limit", "1", "-window", "1m", "-store-timeout", "2s")
	c := srv.Client(t)
	calls := func() int {
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(info, "\n") {
			if name, rest, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && (name == "cmdstat_evalsha" || name == "cmdstat_eval") {
				v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				k, _ := strconv.Atoi(v)
				n += k
			}
		}
		return n
	}
	if resp := get(t, "GET", base+"/api/hello", nil); resp.StatusCode != 200 { // loads the script
		t.Fatalf("hello: %d", resp.StatusCode)
	}
	before := calls()
	// The route admits 5 requests per minute (5 × -limit), each account 1.
	for i := range 8 {
		resp := get(t, "GET", base+"/api/accounts/"+strconv.Itoa(i)+"/report", map[string]string{"X-API-Key": "key-" + strconv.Itoa(i)})
		want := 200
		if i >= 5 {
			want = 429
		}
		if resp.StatusCode != want {
			t.Fatalf("account %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	// One call each for the first six; the route's refusal is then remembered, and the
	// last two are refused without a call. Slot by slot, the sixth would have cost three
	// (the account, the route, the account's refund).
	if n := calls() - before; n != 6 {
		t.Fatalf("%d script calls for 8 requests, want 6", n)
	}
	// The refused accounts' own budgets were never spent.
	keys, err := c.Keys(context.Background(), "rb-demo:*:report-account:*").Result()
	if err != nil || len(keys) != 5 {
		t.Fatalf("account keys %v, %v; want 5", keys, err)
	}
}

// syncBuffer is a log destination that the test reads while the server writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// metricValue is the value of the series named exactly series in base's /metrics, 0
// when it is absent.
func metricValue(t *testing.T, base, series string) float64 {
	t.Helper()
	_, body := fetch(t, base+"/metrics")
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// While Redis is down the breaker stays open and probes it off the request path: the
// log says once that the breaker opened and once that it closed again, however many
// requests and probes came between.
func TestBreakerLogIsBoundedWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	var log syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-redis", "redis://" + srv.Addr + "/0"}, &log, ready)
	}()
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("demo-server did not start: %v", err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("demo-server: %v", err)
		}
	}()
	if resp := get(t, "GET", base+"/api/hello", nil); resp.StatusCode != 200 {
		t.Fatalf("with Redis up: %d", resp.StatusCode)
	}
	srv.Freeze(t)
	waitFor(t, 60*time.Second, "the breaker open", func() bool {
		get(t, "GET", base+"/api/hello", nil)
		return metricValue(t, base, `ratebudget_breaker_state`) == 1
	})
	for range 20 {
		if resp := get(t, "GET", base+"/api/hello", nil); resp.StatusCode != 503 {
			t.Fatalf("with the breaker open: %d, want 503", resp.StatusCode)
		}
	}
	srv.Thaw(t)
	waitFor(t, 60*time.Second, "the breaker closed", func() bool {
		get(t, "GET", base+"/api/hello", nil)
		return metricValue(t, base, `ratebudget_breaker_transitions_total{to="closed"}`) >= 1
	})
	var lines []string
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "circuit breaker") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], "from=closed to=open") || !strings.Contains(lines[1], "to=closed") {
		t.Errorf("breaker log lines:\n%s\nwant two: closed to open, then back to closed", strings.Join(lines, "\n"))
	}
}
