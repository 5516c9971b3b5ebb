package middleware_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/middleware"
)

// flakyRoute answers ?status=S, as the demo's /api/flaky does.
var flakyRoute = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	code, _ := strconv.Atoi(r.URL.Query().Get("status"))
	w.WriteHeader(code)
})

// TestCountSuccesses: five 500s then four 200s under a limit of 3 give 500 x5, 200 x3,
// 429 x1: server failures are not charged.
func TestCountSuccesses(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("flaky", 3, time.Minute), Identity: global, Counts: middleware.CountSuccesses(nil)}})(flakyRoute)
	var got []int
	for range 5 {
		got = append(got, do(h, "GET", "/?status=500", nil).Code)
	}
	for range 4 {
		got = append(got, do(h, "GET", "/?status=200", nil).Code)
	}
	want := []int{500, 500, 500, 500, 500, 200, 200, 200, 429}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("statuses %v, want %v", got, want)
		}
	}
	// A predicate: 4xx are not charged either.
	lim = newMemory(t, newClock())
	h = mustNew(t, lim, []middleware.Rule{{Rule: rule("ok-only", 1, time.Minute), Identity: global,
		Counts: middleware.CountSuccesses(func(s int) bool { return s < 400 })}})(flakyRoute)
	for _, s := range []string{"404", "429", "500", "201"} {
		if c := do(h, "GET", "/?status="+s, nil).Code; strconv.Itoa(c) != s {
			t.Fatalf("status %s answered %d", s, c)
		}
	}
	if c := do(h, "GET", "/?status=200", nil).Code; c != 429 {
		t.Fatalf("after one charged success: %d, want 429", c)
	}
}

// TestInFlight: at most Limit requests run at once; a refusal is 429 with Retry-After 1
// and the concurrent-requests unit; a lease is released when the handler returns, panics,
// or its client goes away.
func TestInFlight(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Minute}
	release := make(chan struct{})
	running := make(chan struct{}, 4)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		running <- struct{}{}
		switch r.URL.Path {
		case "/panic":
			panic(http.ErrAbortHandler)
		case "/gone":
			<-r.Context().Done()
			return
		}
		<-release
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: slots, Identity: byHeader("X-Client")}}, middleware.WithHeaders(headers.IETF))(slow)
	alice := map[string]string{"X-Client": "alice"}
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); codes <- do(h, "GET", "/", alice).Code }()
	}
	<-running
	<-running
	rec := do(h, "GET", "/", alice)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("third while two run: %d, Retry-After %q; want 429 and 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	if p := rec.Header().Get("RateLimit-Policy"); p != `"slots";q=2;qu="concurrent-requests"` {
		t.Errorf("RateLimit-Policy %s", p)
	}
	wg.Add(1)
	go func() { defer wg.Done(); codes <- do(h, "GET", "/", map[string]string{"X-Client": "bob"}).Code }()
	<-running // another client has slots of its own
	close(release)
	wg.Wait()
	for range 3 {
		if c := <-codes; c != 200 {
			t.Fatalf("a running request answered %d", c)
		}
	}
	// A panicking handler releases its lease, and the panic goes on.
	for range 3 {
		func() {
			defer func() {
				if p := recover(); p != http.ErrAbortHandler {
					t.Fatalf("recovered %v, want the handler's panic", p)
				}
			}()
			do(h, "GET", "/panic", alice)
		}()
		<-running
	}
	// A client that goes away releases its lease.
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		req := httptest.NewRequest("GET", "/gone", nil).WithContext(ctx)
		req.Header.Set("X-Client", "alice")
		done := make(chan struct{})
		go func() { defer close(done); h.ServeHTTP(httptest.NewRecorder(), req) }()
		<-running
		cancel()
		<-done
	}
	// Every lease is back.
	if n := left(t, lim, slots, "alice"); n != 2 {
		t.Fatalf("%d of alice's 2 slots free after every request ended, want 2", n)
	}
}

// TestInFlightIsNotChargedTheLayerCost: a request holds one lease whatever its cost, so a
// cost above an InFlight rule's Limit is no 413 when the layer's other rules can admit it.
func TestInFlightIsNotChargedTheLayerCost(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Minute}
	h := mustNew(t, lim, []middleware.Rule{{Rule: slots, Identity: global}, {Rule: rule("r", 10, time.Minute), Identity: global}},
		middleware.WithCost(func(*http.Request) (int64, error) { return 5, nil }))(ok)
	for i := range 2 {
		if rec := do(h, "GET", "/", nil); rec.Code != 200 {
			t.Fatalf("request %d of cost 5 under 2 slots and 10 units: %d, want 200", i, rec.Code)
		}
	}
	if rec := do(h, "GET", "/", nil); rec.Code != 429 {
		t.Fatalf("third request of cost 5 with 10 units spent: %d, want 429", rec.Code)
	}
}

// TestCountResponseBytes: a download budget is charged the bytes written; the response
// that goes over puts the budget into debt, and the next request is refused.
func TestCountResponseBytes(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("bytes"))
		_, _ = io.WriteString(w, strings.Repeat("x", n))
	})
	bytes := ratebudget.Rule{Name: "bytes", Limit: 100, Window: time.Minute}
	h := mustNew(t, lim, []middleware.Rule{{Rule: bytes, Identity: global, Counts: middleware.CountResponseBytes(1)}}, middleware.WithHeaders(headers.IETF))(write)
	rec := do(h, "GET", "/?bytes=60", nil)
	if rec.Code != 200 || rec.Body.Len() != 60 || !strings.Contains(rec.Header().Get("RateLimit-Policy"), `qu="content-bytes"`) {
		t.Fatalf("first: %d, %d bytes, policy %q", rec.Code, rec.Body.Len(), rec.Header().Get("RateLimit-Policy"))
	}
	if rec := do(h, "GET", "/?bytes=60", nil); rec.Code != 200 { // reserved 1 of 40, wrote 60: 20 in debt
		t.Fatalf("second: %d", rec.Code)
	}
	if rec := do(h, "GET", "/?bytes=1", nil); rec.Code != 429 {
		t.Fatalf("in debt: %d, want 429", rec.Code)
	}
}

// TestCountRequestBytes: Content-Length is charged up front (above the budget: 413, before
// anything is spent); a body without a length is charged the bytes the handler read.
func TestCountRequestBytes(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	upload := ratebudget.Rule{Name: "upload", Limit: 100, Window: time.Minute}
	read := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })
	h := mustNew(t, lim, []middleware.Rule{{Rule: upload, Identity: global, Counts: middleware.CountRequestBytes()}})(read)
	post := func(body string, chunked bool) int {
		req := httptest.NewRequest("POST", "/", strings.NewReader(body))
		if chunked {
			req.ContentLength = -1
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if c := post(strings.Repeat("a", 101), false); c != 413 {
		t.Fatalf("101 declared bytes: %d, want 413", c)
	}
	if c := post(strings.Repeat("a", 30), false); c != 200 {
		t.Fatalf("30 declared bytes: %d", c)
	}
	if c := post(strings.Repeat("a", 50), true); c != 200 {
		t.Fatalf("50 bytes without a length: %d", c)
	}
	if c := do(h, "GET", "/", nil).Code; c != 200 { // no body: nothing charged
		t.Fatalf("no body: %d", c)
	}
	if n := left(t, lim, upload, globalID); n != 20 {
		t.Fatalf("%d bytes left, want 100-30-50 = 20", n)
	}
}

// TestCountResponseHeader: a cost known after the response is read from a header the
// handler sets; the estimate is reserved meanwhile.
func TestCountResponseHeader(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	tokens := ratebudget.Rule{Name: "tokens", Limit: 100, Window: time.Minute}
	h := mustNew(t, lim, []middleware.Rule{{Rule: tokens, Identity: global, Counts: middleware.CountResponseHeader(10, "X-Tokens-Used")}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if v := r.URL.Query().Get("used"); v != "" {
				w.Header().Set("X-Tokens-Used", v)
			}
		}))
	do(h, "GET", "/?used=37", nil)
	do(h, "GET", "/", nil)            // no header: the estimate stays
	do(h, "GET", "/?used=bogus", nil) // not a count: the estimate stays
	if n := left(t, lim, tokens, globalID); n != 100-37-10-10 {
		t.Fatalf("%d tokens left, want %d", n, 100-37-10-10)
	}
}

// TestShadowMode: a shadow rule never refuses and sends no metadata, but its budget is
// spent as if enforced and events count what it would have refused.
func TestShadowMode(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	r := rule("hello", 1, time.Minute)
	var mu sync.Mutex
	refused := 0
	h := mustNew(t, lim, []middleware.Rule{{Rule: r, Identity: global, Shadow: true}}, middleware.WithObserver(func(e middleware.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Shadow.Rule != "" && !e.Shadow.Allowed {
			refused++
		}
	}))(ok)
	for i := range 3 {
		rec := do(h, "GET", "/", nil)
		if rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("request %d: %d %v, want 200 without metadata", i, rec.Code, rec.Header())
		}
	}
	if refused != 2 {
		t.Fatalf("%d shadow refusals observed, want 2", refused)
	}
	// Enforced, the same rule finds its budget spent: no restart.
	h = mustNew(t, lim, []middleware.Rule{{Rule: r, Identity: global}})(ok)
	if c := do(h, "GET", "/", nil).Code; c != 429 {
		t.Fatalf("enforced after shadow: %d, want 429", c)
	}
	// Next to an enforced rule: the enforced one decides, the shadow one is observed.
	lim = newMemory(t, newClock())
	h = mustNew(t, lim, []middleware.Rule{
		{Rule: rule("enforced", 2, time.Minute), Identity: global},
		{Rule: r, Identity: global, Shadow: true},
	})(ok)
	codes := []int{do(h, "GET", "/", nil).Code, do(h, "GET", "/", nil).Code, do(h, "GET", "/", nil).Code}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("codes %v, want 200 200 429", codes)
	}
	if n := left(t, lim, r, globalID); n != 0 {
		t.Fatalf("shadow rule has %d left, want 0", n)
	}
}

// TestSettlingNeedsASettler: a rule that settles on a limiter that cannot is refused at
// construction, naming the limiter.
func TestSettlingNeedsASettler(t *testing.T) {
	t.Parallel()
	var plain limiterOnly
	for _, r := range []middleware.Rule{
		{Rule: rule("a", 1, time.Minute), Identity: global, Counts: middleware.CountSuccesses(nil)},
		{Rule: ratebudget.Rule{Name: "b", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}, Identity: global},
	} {
		_, err := middleware.New(plain, []middleware.Rule{r})
		var ce *ratebudget.ConfigError
		if !errors.As(err, &ce) || ce.Field != "limiter" {
			t.Fatalf("New(%s) = %v, want a ConfigError naming the limiter", r.Name, err)
		}
	}
	_, err := middleware.New(newMemory(t, newClock()), []middleware.Rule{{Rule: rule("c", 5, time.Minute), Identity: global, Counts: middleware.CountResponseBytes(6)}})
	var ce *ratebudget.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Counts" {
		t.Fatalf("estimate above the capacity: %v, want a ConfigError naming Counts", err)
	}
}

type limiterOnly struct{}

func (limiterOnly) Allow(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
	return ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true}}, nil
}

// unwrapOnly is a response writer of another middleware that reaches the writer it wraps
// only through Unwrap, as http.ResponseController expects.
type unwrapOnly struct{ http.ResponseWriter }

func (u unwrapOnly) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// A handler of a settled rule flushes and hijacks through http.ResponseController as it
// would without the middleware: the writers wrapped below reach it through Unwrap.
func TestSettledResponseControllerReachesWrappedWriter(t *testing.T) {
	t.Parallel()
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 2, Window: time.Minute}
	mw := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: lease, Identity: global}})
	var flushErr error
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("part"))
		flushErr = http.NewResponseController(w).Flush()
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(unwrapOnly{rec}, httptest.NewRequest("GET", "/", nil))
	if flushErr != nil || !rec.Flushed {
		t.Errorf("flush: %v, flushed %v: want the writer below flushed", flushErr, rec.Flushed)
	}

	hijacked := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		_ = buf.Flush()
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hijacked.ServeHTTP(unwrapOnly{w}, r)
	}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hijacked" {
		t.Errorf("hijack: %d %q, want the connection hijacked through Unwrap", resp.StatusCode, body)
	}
}

// pushWriter is an HTTP/2 response writer: it can push.
type pushWriter struct {
	*httptest.ResponseRecorder
	pushed []string
}

func (p *pushWriter) Push(target string, _ *http.PushOptions) error {
	p.pushed = append(p.pushed, target)
	return nil
}

// A handler of a settled rule keeps http.Pusher on HTTP/2, as it has without the
// middleware (http.ResponseController has no Push), and does not gain it on HTTP/1.
func TestSettledHandlerKeepsPusher(t *testing.T) {
	t.Parallel()
	mw := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 10, time.Minute), Identity: global, Counts: middleware.CountSuccesses(nil)}})
	var isPusher bool
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p http.Pusher
		p, isPusher = w.(http.Pusher)
		if isPusher {
			_ = p.Push("/style.css", nil)
		}
	}))
	pw := &pushWriter{ResponseRecorder: httptest.NewRecorder()}
	h.ServeHTTP(pw, httptest.NewRequest("GET", "/", nil))
	if !isPusher || len(pw.pushed) != 1 || pw.pushed[0] != "/style.css" {
		t.Errorf("HTTP/2 writer: pusher %v, pushed %q; want /style.css pushed", isPusher, pw.pushed)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if isPusher {
		t.Error("HTTP/1 writer: the handler's writer is an http.Pusher, want not")
	}
}
