package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mainEnv makes the test binary run main() with its arguments (see runMain).
const mainEnv = "DEMO_SERVER_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0) // main returned without exiting: not expected
	}
	os.Exit(m.Run())
}

// runMain runs the command's main with args in a child process and returns its exit
// code, stdout and stderr.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// startDemo runs the demo server on a free loopback port until the test ends.
func startDemo(t *testing.T, args ...string) string {
	t.Helper()
	return startDemoCtx(t, context.Background(), args...)
}

func get(t *testing.T, method, url string, hdr map[string]string) *http.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(mustRequest(t, method, url, hdr))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestHelloTurnsInto429(t *testing.T) {
	base := startDemo(t, "-limit", "3", "-window", "10s")
	for _, want := range []string{"2", "1", "0"} {
		resp := get(t, "GET", base+"/api/hello", nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Fatalf("got %d remaining %q, want 200 %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want)
		}
	}
	req, _ := http.NewRequest("GET", base+"/api/hello", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("4th: %d, want 429", resp.StatusCode)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 10 {
		t.Errorf("Retry-After %q, want an integer in 1..10", resp.Header.Get("Retry-After"))
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("headers %v", resp.Header)
	}
	var p struct {
		Status int    `json:"status"`
		Policy string `json:"policy"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Status != 429 || p.Policy != "hello" {
		t.Errorf("problem %+v %v", p, err)
	}
	for range 5 {
		if resp := get(t, "GET", base+"/healthz", nil); resp.StatusCode != 200 {
			t.Fatalf("/healthz: %d", resp.StatusCode)
		}
	}
}

func TestAccountsJobsAndGuide(t *testing.T) {
	base := startDemo(t, "-limit", "2", "-window", "1m", "-algorithm", "token", "-headers", "ietf")
	// Per-account budgets: two accounts, two requests each, then the account is refused.
	for _, key := range []string{"key-a", "key-b"} {
		for i, want := range []int{200, 200, 429} {
			resp := get(t, "GET", base+"/api/accounts/7/report", map[string]string{"X-API-Key": key})
			if resp.StatusCode != want {
				t.Fatalf("%s request %d: %d, want %d", key, i, resp.StatusCode, want)
			}
		}
	}
	if resp := get(t, "GET", base+"/api/accounts/7/report", nil); resp.StatusCode != 400 {
		t.Errorf("no API key: %d, want 400", resp.StatusCode)
	}
	// Weighted cost: 2 units; cost 3 can never fit.
	if resp := get(t, "POST", base+"/api/jobs?cost=3", nil); resp.StatusCode != 413 {
		t.Errorf("cost 3 > 2: %d, want 413", resp.StatusCode)
	}
	resp := get(t, "POST", base+"/api/jobs?cost=2", nil)
	if resp.StatusCode != 202 || resp.Header.Get("RateLimit-Policy") != `"jobs";q=2;w=60` {
		t.Errorf("cost 2: %d %q", resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
	}
	if resp := get(t, "POST", base+"/api/jobs?cost=1", nil); resp.StatusCode != 429 {
		t.Errorf("cost 1 after 2 of 2: %d, want 429", resp.StatusCode)
	}
	r, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(body), "/api/accounts/{id}/report") {
		t.Errorf("guide: %s", body)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-algorithm", "sliding"}, {"-headers", "X"}, {"-headers", "both"}, {"-store-error", "maybe"}, {"-limit", "0"}, {"-window", "1500us"},
		{"-trusted-proxies", "10.0.0.0/33"}, {"-coalesce", "1"}, {"-coalesce", "-1"}, {"-coalesce", "4097"},
		{"-read-header-timeout", "-1s"}, {"-read-timeout", "-1s"}, {"-write-timeout", "-1ms"}, {"-idle-timeout", "-1s"},
		{"-max-header-bytes", "0"}, {"-max-header-bytes", "-1"}, {"extra-argument"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), io.Discard, nil)
		cancel()
		if err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// Every invalid flag value stops the server before it serves, with a message that starts
// with the flag at fault, whichever part of the demo would have refused the value (the
// rules, the client-IP options, the middleware, the listener), and also when another flag
// (-no-limit, -redis) means the value would not be used.
func TestBadFlagValuesNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-limit", "0"}, "-limit"},
		{[]string{"-limit", "-3"}, "-limit"},
		{[]string{"-limit", "300000000000"}, "-limit"}, // the route-wide rule is 5×-limit
		{[]string{"-window", "0"}, "-window"},
		{[]string{"-window", "-1s"}, "-window"},
		{[]string{"-window", "1500us"}, "-window"},
		{[]string{"-window", "9000h"}, "-window"},
		{[]string{"-algorithm", "token", "-limit", "100000000000", "-window", "8000h"}, "-limit"},
		{[]string{"-algorithm", "token", "-byte-limit", "1099511627776"}, "-byte-limit"},
		{[]string{"-algorithm", "sliding"}, "-algorithm"},
		{[]string{"-store-error", "maybe"}, "-store-error"},
		{[]string{"-replicas", "0"}, "-replicas"},
		{[]string{"-store-error", "local", "-replicas", "-1"}, "-replicas"},
		{[]string{"-store-timeout", "0"}, "-store-timeout"},
		{[]string{"-store-timeout", "-1s"}, "-store-timeout"},
		{[]string{"-trusted-proxies", "10.0.0.0/33"}, "-trusted-proxies"},
		{[]string{"-trusted-proxies", "10.0.0.0/8,"}, "-trusted-proxies"},
		{[]string{"-trusted-proxies", "0.0.0.0/0"}, "-trusted-proxies"},
		{[]string{"-ipv6-prefix", "0"}, "-ipv6-prefix"},
		{[]string{"-ipv6-prefix", "129"}, "-ipv6-prefix"},
		{[]string{"-lease-ttl", "100000h"}, "-lease-ttl"},
		{[]string{"-max-budgets", "0"}, "-max-budgets"},
		{[]string{"-redis", "redis://127.0.0.1:1/0", "-max-budgets", "-5"}, "-max-budgets"},
		{[]string{"-redis", "127.0.0.1:6379"}, "-redis"},
		// go-redis's failover client panics on these; the limiter needs the primary.
		{[]string{"-redis", "redis://127.0.0.1:1?master_name=m&route_randomly=true"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1?master_name=m&route_by_latency=true"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1?master_name=m&replica_only=true"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1?master_name="}, "-redis"},
		// lua.New refuses it: the error must still name the flag.
		{[]string{"-redis", "redis://127.0.0.1:1?addr=127.0.0.1:2&max_redirects=-1"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1/3?addr=127.0.0.1:2"}, "-redis"},
		{[]string{"-no-limit", "-limit", "-5"}, "-limit"},
		{[]string{"-no-limit", "-window", "-5s"}, "-window"},
		{[]string{"-addr", "nope"}, "-addr"},
		// An empty value is no way to ask for the default (-addr "" would listen on
		// every interface; -redis "" would keep budgets in each process).
		{[]string{"-addr", ""}, "-addr"},
		{[]string{"-redis", ""}, "-redis"},
		// A port that cannot be dialled never becomes a Redis that is merely down.
		{[]string{"-redis", "redis://127.0.0.1:99999/0"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:0/0"}, "-redis"},
		{[]string{"-redis", "rediss://user:pass@127.0.0.1:70000/0"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1?addr=127.0.0.1:99999"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1?master_name=m&addr=127.0.0.1:99999"}, "-redis"},
	} {
		args := tc.args
		if args[0] != "-addr" {
			args = append([]string{"-addr", "127.0.0.1:0"}, args...)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan string, 1)
		done := make(chan error, 1)
		go func() { done <- run(ctx, args, io.Discard, ready) }()
		var err error
		select {
		case err = <-done:
		case addr := <-ready:
			cancel()
			<-done
			t.Errorf("%v: started on %s", tc.args, addr)
		}
		cancel()
		if err == nil {
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.flag+": ") && !strings.HasPrefix(err.Error(), tc.flag+" and -") {
			t.Errorf("%v: error %q, want one starting with %q", tc.args, err, tc.flag)
		}
	}
}

// Shutdown is graceful for every request the demo serves: a GET /api/slow in flight when
// the server is told to stop (here 6 s, longer than a 5 s grace, within its 10 s cap)
// gets its whole answer, and run returns no error.
func TestShutdownLetsSlowRequestFinish(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, io.Discard, ready) }()
	base := "http://" + <-ready
	resp, err := http.Get(base + "/api/slow?ms=6000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "sleeping 6000 ms\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel() // the request is running: its lease is held
	if err := <-done; err != nil {
		t.Errorf("run: %v, want a clean shutdown", err)
	}
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "slept 6000 ms\n" {
		t.Errorf("rest of the answer %q, %v; want it whole", rest, err)
	}
}

// A request still running when the shutdown grace ends (here a download to a client that
// reads nothing) is cut off: run closes its connection and says so, instead of returning
// a bare context error.
func TestShutdownGraceCutsStalledRequests(t *testing.T) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), graceKey{}, 200*time.Millisecond))
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, io.Discard, ready) }()
	c, br := rawConn(t, "http://"+<-ready)
	defer c.Close()
	// 64 MiB: more than the loopback socket buffers hold, so the handler blocks writing.
	if _, err := io.WriteString(c, "GET /api/download?bytes=67108864 HTTP/1.1\r\nHost: demo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("status line %q, %v", line, err)
	}
	cancel()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "cut off") {
		t.Fatalf("run: %v, want an error saying that running requests were cut off", err)
	}
	// The connection was closed: reading the rest of the answer ends before 64 MiB.
	n, _ := io.Copy(io.Discard, br)
	if n >= 64<<20 {
		t.Errorf("read the whole answer (%d bytes) after the grace, want it cut off", n)
	}
}

func TestMetricsCountAllowedAndDenied(t *testing.T) {
	base := startDemo(t, "-limit", "1", "-window", "1m")
	get(t, "GET", base+"/api/hello", nil)
	get(t, "GET", base+"/api/hello", nil)
	r, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`ratebudget_decisions_total{outcome="allowed",rule="hello"} 1`,
		`ratebudget_decisions_total{outcome="denied",rule="hello"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestTrustedProxiesIdentity(t *testing.T) {
	base := startDemo(t, "-limit", "2", "-trusted-proxies", "127.0.0.1/32")
	for i, tc := range []struct {
		xff  string
		want int
	}{
		{"203.0.113.7", 200},
		{"203.0.113.7", 200},
		{"198.51.100.1, 203.0.113.7", 429}, // the spoofed left entry is not read
		{"203.0.113.8", 200},               // another client has its own budget
	} {
		if resp := get(t, "GET", base+"/api/hello", map[string]string{"X-Forwarded-For": tc.xff}); resp.StatusCode != tc.want {
			t.Fatalf("request %d (XFF %q): %d, want %d", i, tc.xff, resp.StatusCode, tc.want)
		}
	}
}

func TestForwardingHeadersIgnoredWithoutTrustedProxies(t *testing.T) {
	base := startDemo(t, "-limit", "2")
	spoofs := []map[string]string{
		{"X-Forwarded-For": "203.0.113.1"},
		{"X-Real-IP": "203.0.113.2"},
		{"True-Client-IP": "203.0.113.3"},
		{"Forwarded": "for=203.0.113.4"},
		{"X-Forwarded-For": "203.0.113.5, 198.51.100.9"},
	}
	codes := []int{}
	for _, h := range spoofs {
		codes = append(codes, get(t, "GET", base+"/api/hello", h).StatusCode)
	}
	want := []int{200, 200, 429, 429, 429} // one identity: the TCP peer
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("rotating forwarding headers: %v, want %v", codes, want)
		}
	}
}

// -h prints the usage on stdout and exits 0; a bad flag prints the error and the usage on
// stderr and exits 2; a bad value exits 2 with the reason.
func TestUsageAndExitCodes(t *testing.T) {
	code, stdout, stderr := runMain(t, "-h")
	if code != 0 || !strings.HasPrefix(stdout, "Usage: demo-server") || !strings.Contains(stdout, "-idle-timeout") || stderr != "" {
		t.Errorf("-h: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", code, stdout, stderr)
	}
	code, stdout, stderr = runMain(t, "-no-such-flag")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "-no-such-flag") || !strings.Contains(stderr, "Usage: demo-server") {
		t.Errorf("unknown flag: exit %d, stdout %q, stderr %q; want 2 and the error and usage on stderr", code, stdout, stderr)
	}
	code, stdout, stderr = runMain(t, "-addr", "127.0.0.1:0", "-idle-timeout", "-1s")
	if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "demo-server: -idle-timeout") {
		t.Errorf("bad value: exit %d, stdout %q, stderr %q; want 2 and the reason", code, stdout, stderr)
	}
}

// The defaults bound every phase of a connection, and the response deadline outlasts the
// request's so that a slow request still gets its answer.
func TestDefaultServerLimits(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(http.NotFoundHandler(), o.server)
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 ||
		s.MaxHeaderBytes <= 0 || s.MaxHeaderBytes >= http.DefaultMaxHeaderBytes {
		t.Errorf("defaults: %+v", s)
	}
	if s.ReadHeaderTimeout > s.ReadTimeout || s.WriteTimeout <= s.ReadTimeout {
		t.Errorf("read header %v, read %v, write %v: want header <= read < write", s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout)
	}
}

// rawConn dials the demo at base ("http://host:port").
func rawConn(t *testing.T, base string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// waitClosed reads from the connection until the server closes it and fails the test if
// it has not within a deadline far beyond any timeout under test.
func waitClosed(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, br)
	if err != nil {
		t.Fatalf("the server did not close the connection: %v (read %d more bytes)", err, n)
	}
	if n != 0 {
		t.Errorf("%d unexpected bytes before the close", n)
	}
}

// An idle keep-alive connection is closed by the server once -idle-timeout has passed.
func TestIdleConnectionClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	base := startDemo(t, "-idle-timeout", idle.String(), "-read-timeout", "1m", "-write-timeout", "1m")
	c, br := rawConn(t, base)
	start := time.Now()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: demo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "ok\n" || resp.Close {
		t.Fatalf("got %d %q close=%v, want 200 \"ok\" on a kept-alive connection", resp.StatusCode, body, resp.Close)
	}
	waitClosed(t, c, br)
	// The idle clock starts after the response was written, which is after start.
	if d := time.Since(start); d < idle {
		t.Errorf("closed after %v, before the idle timeout %v", d, idle)
	}
}

// A request whose body stalls (10 of 1000 declared bytes) is answered, and its connection
// closed, once -read-timeout has passed, instead of holding the connection.
func TestStalledBodyAnsweredAtReadTimeout(t *testing.T) {
	base := startDemo(t, "-read-timeout", "500ms", "-write-timeout", "1m", "-idle-timeout", "1m")
	c, br := rawConn(t, base)
	if _, err := io.WriteString(c, "POST /api/jobs HTTP/1.1\r\nHost: demo\r\nContent-Length: 1000\r\n\r\n0123456789"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to the stalled request: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusAccepted || !resp.Close {
		t.Errorf("got %d close=%v, want 202 (the handler does not read the body) and Connection: close", resp.StatusCode, resp.Close)
	}
	waitClosed(t, c, br)
}

// Headers beyond -max-header-bytes (plus the 4 KiB net/http allows on top) get 431;
// headers within it are served.
func TestOversizedHeadersGet431(t *testing.T) {
	base := startDemo(t, "-max-header-bytes", "1024")
	for _, tc := range []struct {
		size int
		want int
	}{{512, 200}, {16 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		c, br := rawConn(t, base)
		req := "GET /healthz HTTP/1.1\r\nHost: demo\r\nX-Padding: " + strings.Repeat("a", tc.size) + "\r\n\r\n"
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("header of %d bytes: %v", tc.size, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("header of %d bytes: %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}

// HEAD on a GET route answers as GET does, without a body, and spends the same budget;
// HEAD on a POST-only route is still 405.
func TestHeadOnGetRoutes(t *testing.T) {
	base := startDemo(t, "-limit", "2", "-window", "1m")
	for _, path := range []string{"/", "/healthz", "/metrics", "/api/accounts/7/report"} {
		resp, err := http.DefaultClient.Do(mustRequest(t, "HEAD", base+path, map[string]string{"X-API-Key": "k"}))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(body) != 0 {
			t.Errorf("HEAD %s: %d with %d body bytes, want 200 and none", path, resp.StatusCode, len(body))
		}
	}
	for i, tc := range []struct {
		method, remaining string
		want              int
	}{{"HEAD", "1", 200}, {"GET", "0", 200}, {"HEAD", "0", 429}} {
		resp := get(t, tc.method, base+"/api/hello", nil)
		if resp.StatusCode != tc.want || resp.Header.Get("X-RateLimit-Remaining") != tc.remaining {
			t.Errorf("request %d (%s /api/hello): %d remaining %q, want %d remaining %s",
				i, tc.method, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), tc.want, tc.remaining)
		}
	}
	if resp := get(t, "HEAD", base+"/api/jobs", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("HEAD /api/jobs: %d, want 405", resp.StatusCode)
	}
}

func mustRequest(t *testing.T, method, url string, hdr map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

// -max-budgets caps the in-process budgets: after 300 rotating client addresses against
// a cap of 64, at most 64 of the first 250 clients' budgets are still held; the others
// were evicted, and a client's next request starts from a fresh budget.
func TestMaxBudgetsEvicts(t *testing.T) {
	base := startDemo(t, "-limit", "5", "-window", "1h", "-max-budgets", "64", "-trusted-proxies", "127.0.0.1/32")
	for i := range 300 {
		ip := fmt.Sprintf("198.51.100.%d", i%250)
		if i >= 250 {
			ip = fmt.Sprintf("203.0.113.%d", i-250)
		}
		if code := get(t, "GET", base+"/api/hello", map[string]string{"X-Forwarded-For": ip}).StatusCode; code != 200 {
			t.Fatalf("client %s: %d, want 200 (its first request)", ip, code)
		}
	}
	// Asking again can only evict more: at most 64 budgets are held at any time.
	evicted := 0
	for i := range 250 {
		ip := fmt.Sprintf("198.51.100.%d", i)
		resp := get(t, "GET", base+"/api/hello", map[string]string{"X-Forwarded-For": ip})
		switch rem := resp.Header.Get("X-RateLimit-Remaining"); {
		case resp.StatusCode != 200:
			t.Fatalf("client %s, second request: %d, want 200", ip, resp.StatusCode)
		case rem == "4": // a fresh budget: the first request's was evicted
			evicted++
		case rem != "3": // its budget held: both requests spent
			t.Fatalf("client %s, second request: remaining %q, want 3 (held) or 4 (evicted)", ip, rem)
		}
	}
	if evicted < 250-64 {
		t.Fatalf("%d of 250 clients' budgets evicted, want at least 186: more than the cap of 64 held", evicted)
	}
	for _, bad := range []string{"0", "63"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, []string{"-addr", "127.0.0.1:0", "-max-budgets", bad}, io.Discard, nil)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "max-budgets") {
			t.Errorf("-max-budgets %s: error %v, want one naming -max-budgets", bad, err)
		}
	}
}

// The guide's columns stay aligned whatever the flags' values: every route's rule name
// starts in one column, and no description runs into it.
func TestGuideColumnsAligned(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"-limit", "3"},
		{"-limit", "219902325555", "-byte-limit", "1099511627776", "-inflight", "1099511627776", "-ipv6-prefix", "128", "-window", "8784h", "-algorithm", "rolling"},
	} {
		base := startDemo(t, args...)
		r, err := http.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		col, rules := -1, 0
		for _, line := range strings.Split(string(body), "\n") {
			i := strings.Index(line, `rule "`)
			if i < 0 {
				continue
			}
			rules++
			if line[i-2:i] != "  " {
				t.Errorf("%v: the description runs into the rule column: %q", args, line)
			}
			if col < 0 {
				col = i
			} else if i != col {
				t.Errorf("%v: rule name in column %d, want %d like the first: %q", args, i, col, line)
			}
		}
		if rules != 7 {
			t.Errorf("%v: %d rules in the guide, want 7:\n%s", args, rules, body)
		}
	}
}

// A ?cost= that is not a positive integer is the client's fault, and the 400 says so
// (which part and why), in text and in JSON, without echoing the value.
func TestJobsBadCostSaysWhy(t *testing.T) {
	base := startDemo(t)
	for _, cost := range []string{"x", "0", "-3", "1.5", "<b>"} {
		for _, accept := range []string{"", "application/json"} {
			req := mustRequest(t, "POST", base+"/api/jobs?cost="+url.QueryEscape(cost), map[string]string{"Accept": accept})
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || !strings.Contains(string(body), "cost must be a positive integer") || strings.Contains(string(body), "<b>") {
				t.Errorf("cost %q, Accept %q: %d %q, want 400 saying the cost must be a positive integer", cost, accept, resp.StatusCode, body)
			}
		}
	}
	// The guide's list of refusals has it too.
	_, guide := fetch(t, base+"/")
	if !strings.Contains(strings.Join(strings.Fields(string(guide)), " "), "400 (no identity, or a ?cost that is not a positive integer)") {
		t.Errorf("the guide's refusals do not name a bad ?cost:\n%s", guide)
	}
}

// With -no-limit the guide says that no route is limited, and indeed none refuses.
func TestGuideWithNoLimit(t *testing.T) {
	base := startDemo(t, "-no-limit", "-limit", "1")
	for i := range 3 {
		if resp := get(t, "GET", base+"/api/hello", nil); resp.StatusCode != 200 {
			t.Fatalf("request %d with -no-limit: %d, want 200", i, resp.StatusCode)
		}
	}
	r, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(body), "-no-limit") || strings.Contains(string(body), "every limited route spends") {
		t.Errorf("guide with -no-limit:\n%s\nwant it to say that the routes are not limited", body)
	}
}

// -h says which routes -limit budgets: not /api/slow (-inflight) nor /api/download
// (-byte-limit).
func TestLimitHelpNamesItsRoutes(t *testing.T) {
	var out strings.Builder
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	_, help, _ := strings.Cut(out.String(), "  -limit int\n")
	help, _, _ = strings.Cut(help, "\n  -")
	for _, route := range []string{"/api/hello", "/api/accounts/{id}/report", "/api/jobs", "/api/flaky"} {
		if !strings.Contains(help, route) {
			t.Errorf("-limit's help %q does not name %s", help, route)
		}
	}
	if strings.Contains(help, "each limited route") {
		t.Errorf("-limit's help %q claims every limited route", help)
	}
}
