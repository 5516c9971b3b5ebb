package policy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// frozen is an in-process limiter whose clock stands still: no window ends during a test.
func frozen(t *testing.T) *memory.Limiter {
	t.Helper()
	at := time.Date(2026, 12, 5, 15, 0, 0, 0, time.UTC)
	lim, err := memory.New(memory.WithClock(func() time.Time { return at }))
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

// statuses sends n copies of the request made by mk through h and returns their status
// codes, space-separated.
func statuses(h http.Handler, n int, mk func() *http.Request) string {
	var out []string
	for range n {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, mk())
		out = append(out, strconv.Itoa(rec.Code))
	}
	return strings.Join(out, " ")
}

// times is s repeated n times, space-separated.
func times(n int, s string) string { return strings.TrimSpace(strings.Repeat(s+" ", n)) }

func mustMiddleware(t *testing.T, p *Policy, lim ratebudget.Limiter, opts ...middleware.Option) http.Handler {
	t.Helper()
	mw, err := p.Middleware(lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw(okHandler)
}

func hello(key string) func() *http.Request {
	return func() *http.Request { return request("192.0.2.1:1234", "/api/hello", "X-API-Key", key) }
}

// The example's tenants on the in-process limiter: each plan's limit, the override's,
// the plan's name in the metadata.
func TestMiddlewarePlans(t *testing.T) {
	p, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := mustMiddleware(t, p, frozen(t), middleware.WithHeaders(headers.IETF))
	if got, want := statuses(h, 6, hello("demo-free")), times(5, "200")+" 429"; got != want {
		t.Errorf("demo-free: %s, want %s", got, want)
	}
	if got, want := statuses(h, 6, hello("demo-pro")), times(6, "200"); got != want {
		t.Errorf("demo-pro while demo-free is refused: %s, want %s", got, want)
	}
	// An unknown key is on the default plan, free: a budget of its own.
	if got, want := statuses(h, 6, hello("someone")), times(5, "200")+" 429"; got != want {
		t.Errorf("an unknown key: %s, want %s", got, want)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, hello("demo-acme")())
	pol := rec.Header().Get("RateLimit-Policy")
	if rec.Code != 200 || !strings.Contains(pol, `"hello";q=500;w=60;ratebudget-plan="pro.acme"`) {
		t.Errorf("demo-acme: %d RateLimit-Policy %q, want hello at the override's 500 named pro.acme", rec.Code, pol)
	}
	// daily is unlimited on pro: not in the metadata.
	if strings.Contains(pol, "daily") {
		t.Errorf("RateLimit-Policy %q lists daily, which is unlimited on pro", pol)
	}
}

// envoy's Example 7 on the in-process limiter: a request both rules match spends the
// replacing rule's budget only; the replaced rule's budget is untouched.
func TestMiddlewareReplacedBudgetUntouched(t *testing.T) {
	p, err := Load("testdata/envoy-7-replaces.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := mustMiddleware(t, p, frozen(t))
	both := func() *http.Request {
		return request("192.0.2.1:1", "/", "key_1", "value_1", "key_2", "value_2", "user", "bkthomps")
	}
	key1 := func() *http.Request { return request("192.0.2.1:1", "/", "key_1", "value_1", "user", "bkthomps") }
	if got, want := statuses(h, 11, both), times(10, "200")+" 429"; got != want {
		t.Errorf("both: %s, want %s", got, want)
	}
	if got, want := statuses(h, 6, key1), times(5, "200")+" 429"; got != want {
		t.Errorf("key_1 after both: %s, want %s (specific_limit untouched)", got, want)
	}
}

// counting is a limiter that counts its calls.
type counting struct {
	ratebudget.Limiter
	calls atomic.Int64
}

func (c *counting) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	c.calls.Add(1)
	return c.Limiter.Allow(ctx, checks)
}

// envoy's Example 5: an unlimited rule is answered without a call to the store.
func TestMiddlewareUnlimitedNoStoreCall(t *testing.T) {
	p, err := Load("testdata/envoy-5-unlimited.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim := &counting{Limiter: frozen(t)}
	h := mustMiddleware(t, p, lim)
	ldap := func() *http.Request { return request("192.0.2.1:1", "/", "ldap", "x") }
	if got, want := statuses(h, 200, ldap), times(200, "200"); got != want || lim.calls.Load() != 0 {
		t.Errorf("ldap: %s with %d limiter calls, want every request admitted without a call", got, lim.calls.Load())
	}
	azure := func() *http.Request { return request("192.0.2.1:1", "/", "azure", "x") }
	if got, want := statuses(h, 101, azure), times(100, "200")+" 429"; got != want || lim.calls.Load() != 101 {
		t.Errorf("azure: %s with %d limiter calls, want 100 admitted, one call each", got, lim.calls.Load())
	}
}

// envoy's Example 6: the shadowed rule never refuses; the other does.
func TestMiddlewareShadow(t *testing.T) {
	p, err := Load("testdata/envoy-6-shadow.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var shadowed atomic.Int64
	h := mustMiddleware(t, p, frozen(t), middleware.WithObserver(func(e middleware.Event) {
		if !e.Shadow.Allowed && e.Shadow.Rule != "" {
			shadowed.Add(1)
		}
	}))
	a := func() *http.Request { return request("192.0.2.1:1", "/", "service", "s", "user", "user-a") }
	b := func() *http.Request { return request("192.0.2.1:1", "/", "service", "s", "user", "user-b") }
	if got, want := statuses(h, 12, a), times(12, "200"); got != want || shadowed.Load() != 2 {
		t.Errorf("user-a: %s with %d shadow refusals observed, want every request admitted and 2", got, shadowed.Load())
	}
	if got, want := statuses(h, 21, b), times(20, "200")+" 429"; got != want {
		t.Errorf("user-b: %s, want %s", got, want)
	}
}

const reloadV1 = `rules:
  - {name: per-ip, identity: ip, time: {limit: 1000, window: 1m}}
  - {name: hello, identity: header:X-API-Key, match: {path: /api/hello}, time: {limit: 5, window: 1m}}
`

// reloadSteps runs a reload through h, a Watcher's middleware over lim: a limit raised
// keeps what was spent; a rule removed and brought back finds its budget.
func reloadSteps(t *testing.T, newLim func() ratebudget.Limiter) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, []byte(reloadV1))
	w, ch := watched(t, path, time.Hour)
	mw, err := w.Middleware(newLim(), middleware.WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(okHandler)
	reload := func(src string) {
		t.Helper()
		writeAtomic(t, path, []byte(src))
		if err := w.Reload(); err != nil {
			t.Fatal(err)
		}
		<-ch
	}
	if got, want := statuses(h, 6, hello("k")), times(5, "200")+" 429"; got != want {
		t.Fatalf("at 5: %s, want %s", got, want)
	}
	reload(strings.Replace(reloadV1, "limit: 5,", "limit: 7,", 1))
	if got, want := statuses(h, 3, hello("k")), "200 200 429"; got != want {
		t.Fatalf("raised to 7: %s, want %s (the 5 spent are kept)", got, want)
	}
	reload(strings.SplitAfter(reloadV1, "window: 1m}}\n")[0]) // hello removed
	if got, want := statuses(h, 2, hello("k")), "200 200"; got != want {
		t.Fatalf("without hello: %s, want %s", got, want)
	}
	reload(strings.Replace(reloadV1, "limit: 5,", "limit: 7,", 1))
	if got, want := statuses(h, 1, hello("k")), "429"; got != want {
		t.Fatalf("hello back at 7: %s, want %s (its 7 spent are kept)", got, want)
	}
}

func TestWatcherMiddlewareReloadKeepsBudgets(t *testing.T) {
	reloadSteps(t, func() ratebudget.Limiter { return frozen(t) })
}

func TestWatcherMiddlewareReloadKeepsBudgetsRedis(t *testing.T) {
	srv := redistest.Start(t)
	reloadSteps(t, func() ratebudget.Limiter {
		lim, err := lua.New(srv.Client(t), lua.WithPrefix("policy-reload"))
		if err != nil {
			t.Fatal(err)
		}
		return lim
	})
}

// A request is decided under one version of the policy: with reloads racing requests,
// the two rules a response lists always come from one version.
func TestWatcherMiddlewareOneVersionPerRequest(t *testing.T) {
	version := func(n int) []byte {
		return fmt.Appendf(nil, "rules:\n  - {name: a, identity: ip, time: {limit: %d, window: 1m}}\n  - {name: b, identity: ip, time: {limit: %d, window: 1m}}\n", 1000+n, 2000+n)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, version(0))
	w, err := watch(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mw, err := w.Middleware(frozen(t), middleware.WithHeaders(headers.IETF))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(okHandler)
	limits := regexp.MustCompile(`"a";q=(\d+);w=60, "b";q=(\d+);w=60`)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, request(fmt.Sprintf("192.0.2.%d:1", g*100+i%100), "/"))
				m := limits.FindStringSubmatch(rec.Header().Get("RateLimit-Policy"))
				if m == nil {
					t.Errorf("RateLimit-Policy %q", rec.Header().Get("RateLimit-Policy"))
					return
				}
				a, _ := strconv.Atoi(m[1])
				b, _ := strconv.Atoi(m[2])
				if b-a != 1000 {
					t.Errorf("a at %d with b at %d: two versions in one request", a, b)
					return
				}
			}
		}()
	}
	for n := 1; n <= 30; n++ {
		writeAtomic(t, path, version(n))
		if err := w.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

// Scope method_route gives each method of a route a budget of its own, except that HEAD
// on a GET route spends GET's and every method outside RFC 9110 and RFC 5789 spends one
// shared "OTHER" budget: a client gets no fresh budget by switching to HEAD or by
// inventing methods.
func TestMethodRouteScope(t *testing.T) {
	p := mustParse(t, `rules:
  - {name: per-route, identity: ip, scope: method_route, time: {limit: 2, window: 1m}}
`)
	mw, err := p.Middleware(frozen(t))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", mw(okHandler))
	mux.Handle("POST /items/{id}", mw(okHandler))
	mux.Handle("/any", mw(okHandler))
	send := func(method, path string) func() *http.Request {
		return func() *http.Request {
			r := request("192.0.2.1:1", path)
			r.Method = method
			return r
		}
	}
	got := strings.Join([]string{
		statuses(mux, 1, send(http.MethodGet, "/items/1")),
		statuses(mux, 1, send(http.MethodHead, "/items/2")),
		statuses(mux, 1, send(http.MethodGet, "/items/3")),
		statuses(mux, 1, send(http.MethodPost, "/items/1")),
		statuses(mux, 1, send("BREW", "/any")),
		statuses(mux, 1, send("FOO", "/any")),
		statuses(mux, 1, send("BAR", "/any")),
		statuses(mux, 1, send(http.MethodGet, "/any")),
	}, " ")
	if want := "200 200 429 200 200 200 429 200"; got != want {
		t.Errorf("GET, HEAD, GET /items; POST /items; BREW, FOO, BAR, GET /any: %s, want %s", got, want)
	}
}
