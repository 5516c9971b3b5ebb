package middleware_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/middleware"
)

// refusalRecorder is a refusal handler that answers 418 and keeps what it was given.
type refusalRecorder struct {
	calls     int
	d         ratebudget.Decision
	limitSeen string // X-RateLimit-Limit as set on w when the handler ran
}

func (rr *refusalRecorder) handle(w http.ResponseWriter, _ *http.Request, d ratebudget.Decision) {
	rr.calls++
	rr.d = d
	rr.limitSeen = w.Header().Get("X-RateLimit-Limit")
	w.WriteHeader(http.StatusTeapot)
}

func TestRefusalHandlerAnswersRefusals(t *testing.T) {
	t.Parallel()
	var rr refusalRecorder
	reached := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ })
	cost := middleware.WithCost(func(r *http.Request) (int64, error) {
		return strconv.ParseInt(r.URL.Query().Get("cost"), 10, 64)
	})
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("api", 3, time.Minute), Identity: keyfuncs.Global()}},
		middleware.WithRefusalHandler(rr.handle), middleware.WithHeaders(headers.XRateLimit), cost)(next)

	for i := range 2 {
		if rec := do(h, "GET", "/?cost=1", nil); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d, want 200", i, rec.Code)
		}
	}
	if rr.calls != 0 {
		t.Fatalf("refusal handler called %d times for admitted requests", rr.calls)
	}

	// 2 units spent, 1 left: a cost of 2 is refused, and the handler answers.
	rec := do(h, "GET", "/?cost=2", nil)
	if rec.Code != http.StatusTeapot || rr.calls != 1 {
		t.Fatalf("refusal: status %d, handler calls %d; want 418 from the handler, once", rec.Code, rr.calls)
	}
	if reached != 2 {
		t.Fatalf("next handler reached %d times, want 2 (not on the refusal)", reached)
	}
	if rr.d.Allowed || rr.d.Exceeded || rr.d.Rule != "api" || rr.d.Remaining != 1 || rr.d.RetryAfter <= 0 {
		t.Fatalf("decision given to the handler: %+v; want refused by api with 1 left and a retry time", rr.d)
	}
	if rr.limitSeen != "3" {
		t.Fatalf("X-RateLimit-Limit on w when the handler ran: %q, want 3 (metadata set before it)", rr.limitSeen)
	}
	// The handler finds the default's Retry-After (the whole minute's window, rounded
	// up) and Cache-Control already set, and none of its body.
	if got, want := rec.Header().Get("Retry-After"), strconv.FormatInt(int64((rr.d.RetryAfter+time.Second-1)/time.Second), 10); got != want {
		t.Fatalf("Retry-After %q, want %q (from the decision's %v)", got, want, rr.d.RetryAfter)
	}
	if got := rec.Header().Get("Cache-Control"); got != "no-store" {
		t.Fatalf("Cache-Control %q, want no-store", got)
	}
	if rec.Body.Len() != 0 {
		t.Fatalf("body %q: the default refusal's body was written too", rec.Body.String())
	}

	// A cost above the capacity can never be admitted: the handler answers it too, with
	// Exceeded set, instead of the default 413.
	rec = do(h, "GET", "/?cost=4", nil)
	if rec.Code != http.StatusTeapot || rr.calls != 2 || !rr.d.Exceeded || rr.d.Allowed {
		t.Fatalf("cost over capacity: status %d, calls %d, decision %+v; want 418 with Exceeded", rec.Code, rr.calls, rr.d)
	}
	if ra, cc := rec.Header().Get("Retry-After"), rec.Header().Get("Cache-Control"); ra != "" || cc != "no-store" {
		t.Fatalf("cost over capacity: Retry-After %q, Cache-Control %q; want none (waiting cannot help) and no-store", ra, cc)
	}
	// Refusals spent nothing: the unit left still admits a cost of 1.
	if rec := do(h, "GET", "/?cost=1", nil); rec.Code != http.StatusOK {
		t.Fatalf("after the refusals: %d, want 200 (a refusal spends nothing)", rec.Code)
	}
}

// A refusal handler that writes only a body answers with the default's Retry-After
// (whole seconds, rounded up: 1.5 s is 2) and Cache-Control: no-store, so a handler
// ported from one that relied on them keeps sending them; one that sets its own
// Retry-After replaces it.
func TestRefusalHandlerGetsRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		own   string // the handler's Retry-After, "" for none
		want  string
		style headers.Style
	}{
		{"body_only", "", "2", headers.XRateLimit},
		{"body_only_no_metadata", "", "2", headers.None},
		{"handler_overwrites", "7", "7", headers.XRateLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got ratebudget.Decision
			// One token every 1.5 s: once both are spent the next comes in 1.5 s.
			tb := ratebudget.Rule{Name: "api", Algorithm: ratebudget.TokenBucket, Limit: 2, Window: 3 * time.Second}
			h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: tb, Identity: keyfuncs.Global()}},
				middleware.WithHeaders(tc.style),
				middleware.WithRefusalHandler(func(w http.ResponseWriter, _ *http.Request, d ratebudget.Decision) {
					got = d
					if tc.own != "" {
						w.Header().Set("Retry-After", tc.own)
					}
					_, _ = io.WriteString(w, "slow down\n")
				}))(ok)
			for range 2 {
				if rec := do(h, "GET", "/", nil); rec.Code != http.StatusOK || rec.Header().Get("Retry-After") != "" {
					t.Fatalf("admission: %d, Retry-After %q; want 200 without one", rec.Code, rec.Header().Get("Retry-After"))
				}
			}
			rec := do(h, "GET", "/", nil)
			if got.Allowed || got.RetryAfter != 1500*time.Millisecond {
				t.Fatalf("decision %+v, want a refusal with RetryAfter 1.5s", got)
			}
			if ra := rec.Header().Get("Retry-After"); ra != tc.want {
				t.Errorf("Retry-After %q, want %q", ra, tc.want)
			}
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", cc)
			}
			if rec.Body.String() != "slow down\n" {
				t.Errorf("body %q, want the handler's only", rec.Body.String())
			}
		})
	}
}

// With stacked layers the handler of the layer whose rule refused answers, and the
// decision's Index counts the checks of every layer, outermost first.
func TestRefusalHandlerOfTheRefusingLayer(t *testing.T) {
	t.Parallel()
	var outerRR, innerRR refusalRecorder
	lim := newMemory(t, newClock())
	id := keyfuncs.Header("X-Client")
	outer := mustNew(t, lim, []middleware.Rule{
		{Rule: rule("outer-a", 10, time.Minute), Identity: id},
		{Rule: rule("outer-b", 10, time.Minute), Identity: id},
	}, middleware.WithRefusalHandler(outerRR.handle))
	inner := mustNew(t, lim, []middleware.Rule{{Rule: rule("inner", 1, time.Minute), Identity: id}},
		middleware.WithRefusalHandler(innerRR.handle))
	h := outer(inner(ok))
	alice := map[string]string{"X-Client": "alice"}

	if rec := do(h, "GET", "/", alice); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d, want 200", rec.Code)
	}
	rec := do(h, "GET", "/", alice)
	if rec.Code != http.StatusTeapot || innerRR.calls != 1 || outerRR.calls != 0 {
		t.Fatalf("inner refusal: status %d, inner handler %d, outer handler %d; want 418 from the inner handler only",
			rec.Code, innerRR.calls, outerRR.calls)
	}
	if innerRR.d.Rule != "inner" || innerRR.d.Index != 2 {
		t.Fatalf("decision: rule %q index %d; want inner at index 2 (after the outer layer's two checks)", innerRR.d.Rule, innerRR.d.Index)
	}
	// The refusal spent nothing in the outer layer either: 9 of its 10 are left.
	if n := left(t, lim, rule("outer-a", 10, time.Minute), "alice"); n != 9 {
		t.Fatalf("outer-a has %d left, want 9", n)
	}
}

func TestErrorHandlerAnswersInputErrors(t *testing.T) {
	t.Parallel()
	var got []error
	reached := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ })
	lim := newMemory(t, newClock())
	outerRule := rule("outer", 5, time.Minute)
	outer := mustNew(t, lim, []middleware.Rule{{Rule: outerRule, Identity: keyfuncs.Global()}})
	inner := mustNew(t, lim, []middleware.Rule{{Rule: rule("keyed", 5, time.Minute), Identity: keyfuncs.Header("X-Api-Key")}},
		middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			got = append(got, err)
			w.WriteHeader(http.StatusUnauthorized)
		}),
		middleware.WithCost(func(r *http.Request) (int64, error) {
			if r.URL.Query().Get("cost") == "0" {
				return 0, nil
			}
			return 1, nil
		}))
	h := outer(inner(next))

	rec := do(h, "GET", "/", nil) // no X-Api-Key
	if rec.Code != http.StatusUnauthorized || len(got) != 1 {
		t.Fatalf("missing key: status %d, handler calls %d; want 401 from the handler, once", rec.Code, len(got))
	}
	var ie *middleware.InputError
	if !errors.As(got[0], &ie) || ie.Part != "identity" || ie.Rule != "keyed" || ie.Reason == "" {
		t.Fatalf("error given to the handler: %#v; want an *InputError for the identity of rule keyed, with a reason", got[0])
	}
	if !errors.Is(got[0], keyreason.ErrEmptyKey) && !errors.Is(got[0], keyreason.ErrInvalidHeader) {
		t.Fatalf("error %v does not wrap the key function's error", got[0])
	}

	rec = do(h, "GET", "/?cost=0", map[string]string{"X-Api-Key": "k1"})
	if rec.Code != http.StatusUnauthorized || len(got) != 2 {
		t.Fatalf("cost 0: status %d, handler calls %d; want 401 from the handler", rec.Code, len(got))
	}
	if !errors.As(got[1], &ie) || ie.Part != "cost" {
		t.Fatalf("error given to the handler: %#v; want an *InputError for the cost", got[1])
	}
	if reached != 0 {
		t.Fatalf("next handler reached %d times, want 0", reached)
	}
	// Neither request was counted, by this layer or the one stacked around it.
	if n := left(t, lim, outerRule, globalID); n != 5 {
		t.Fatalf("outer has %d left, want 5 (input errors are never counted)", n)
	}
}

func TestHandlerOptionsRefuseNil(t *testing.T) {
	t.Parallel()
	rules := []middleware.Rule{{Rule: rule("api", 1, time.Minute), Identity: keyfuncs.Global()}}
	for name, opt := range map[string]middleware.Option{
		"WithRefusalHandler": middleware.WithRefusalHandler(nil),
		"WithErrorHandler":   middleware.WithErrorHandler(nil),
	} {
		_, err := middleware.New(newMemory(t, newClock()), rules, opt)
		var ce *ratebudget.ConfigError
		if !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("%s(nil): %v; want a ConfigError naming %s", name, err, name)
		}
	}
}

// TestCountActual: the callback sees the request, the status the handler wrote (500 for
// a panic) and the header it left; its result is the settled cost, a negative one keeps
// the estimate.
func TestCountActual(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	work := ratebudget.Rule{Name: "work", Limit: 100, Window: time.Minute}
	type seen struct {
		status int
		header string
	}
	var got []seen
	counts := middleware.CountActual(10, func(r *http.Request, status int, h http.Header) int64 {
		got = append(got, seen{status, h.Get("X-Units")})
		n, err := strconv.ParseInt(r.URL.Query().Get("units"), 10, 64)
		if err != nil {
			return -1
		}
		return n
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: work, Identity: global, Counts: counts}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("panic") != "" {
				panic(http.ErrAbortHandler)
			}
			w.Header().Set("X-Units", r.URL.Query().Get("units"))
			w.WriteHeader(http.StatusCreated)
		}))
	do(h, "GET", "/?units=3", nil) // settled at 3
	do(h, "GET", "/", nil)         // -1: the estimate, 10, stays
	func() {
		defer func() { _ = recover() }()
		do(h, "GET", "/?units=0&panic=1", nil) // settled at 0 after a panic
	}()
	want := []seen{{201, "3"}, {201, ""}, {500, ""}}
	if len(got) != len(want) {
		t.Fatalf("callback saw %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("callback call %d saw %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := left(t, lim, work, globalID); n != 100-3-10-0 {
		t.Fatalf("%d left, want %d", n, 100-3-10)
	}

	for name, c := range map[string]middleware.Counting{
		"nil function":         middleware.CountActual(10, nil),
		"estimate 0":           middleware.CountActual(0, func(*http.Request, int, http.Header) int64 { return 1 }),
		"estimate over limit":  middleware.CountActual(101, func(*http.Request, int, http.Header) int64 { return 1 }),
		"bytes estimate over":  middleware.CountResponseBytes(101),
		"header estimate zero": middleware.CountResponseHeader(0, "X-Units"),
		"header name empty":    middleware.CountResponseHeader(1, ""),
		"header name invalid":  middleware.CountResponseHeader(1, "X Units"),
		"header name colon":    middleware.CountResponseHeader(1, "X-Units:"),
	} {
		_, err := middleware.New(lim, []middleware.Rule{{Rule: work, Identity: global, Counts: c}})
		var ce *ratebudget.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Counts" || ce.Rule != "work" {
			t.Errorf("%s: %v; want a ConfigError naming rule work's Counts", name, err)
		}
	}
}

// TestCountAttemptsIsTheDefault: every admitted request is charged its cost, whatever
// its status, with the zero Counting.
func TestCountAttemptsIsTheDefault(t *testing.T) {
	t.Parallel()
	fail := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	for name, c := range map[string]middleware.Counting{"zero": {}} {
		lim := newMemory(t, newClock())
		r := rule("api", 5, time.Minute)
		h := mustNew(t, lim, []middleware.Rule{{Rule: r, Identity: global, Counts: c}})(fail)
		for range 2 {
			if code := do(h, "GET", "/", nil).Code; code != 500 {
				t.Fatalf("%s: %d, want the handler's 500", name, code)
			}
		}
		if n := left(t, lim, r, globalID); n != 3 {
			t.Errorf("%s: %d left, want 3 (both 500s charged)", name, n)
		}
	}
}

// TestHijackedIsChargedItsReservation: a handler that takes the connection over is
// charged what was reserved, whatever the contract: its bytes on the raw connection are
// not seen, so settling at the bytes written through the ResponseWriter (none) would
// let every upgraded connection go free.
func TestHijackedIsChargedItsReservation(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	bytesRule := ratebudget.Rule{Name: "bytes", Limit: 1000, Window: time.Minute}
	okRule := ratebudget.Rule{Name: "ok", Limit: 10, Window: time.Minute}
	mw := mustNew(t, lim, []middleware.Rule{
		{Rule: bytesRule, Identity: global, Counts: middleware.CountResponseBytes(100)},
		{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(func(status int) bool { return status < 300 })},
	})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: close\r\n\r\n" + strings.Repeat("x", 500))
		_ = buf.Flush()
	}))
	if got := upgrade(t, h); !strings.HasPrefix(got, "HTTP/1.1 101 ") || !strings.HasSuffix(got, strings.Repeat("x", 500)) {
		t.Fatalf("hijacked response: %q", got)
	}
	if n := left(t, lim, bytesRule, globalID); n != 900 {
		t.Errorf("bytes: %d left, want 900 (the 100 reserved, not the 0 written through the ResponseWriter)", n)
	}
	if n := left(t, lim, okRule, globalID); n != 9 {
		t.Errorf("ok: %d left, want 9 (a hijacked request is charged, its status not seen)", n)
	}
}

// A hijacked request without a body is charged nothing under CountRequestBytes, as
// such a request is when it is not hijacked: there is no body to charge.
func TestHijackedWithoutABodyIsNotChargedItsBytes(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	body := ratebudget.Rule{Name: "body", Limit: 10, Window: time.Minute}
	h := mustNew(t, lim, []middleware.Rule{{Rule: body, Identity: global, Counts: middleware.CountRequestBytes()}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			defer conn.Close()
			_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: close\r\n\r\n")
			_ = buf.Flush()
		}))
	if got := upgrade(t, h); !strings.HasPrefix(got, "HTTP/1.1 101 ") {
		t.Fatalf("hijacked response: %q", got)
	}
	if n := left(t, lim, body, globalID); n != 10 {
		t.Errorf("body: %d left, want 10: a request without a body is charged nothing", n)
	}
}

// A cost above a rule's capacity is refused before the limiter is asked, by the layer
// whose rule it exceeds; the decision's Index still counts the checks of every layer,
// outermost first (outer layers' checks, then this layer's enforced checks before the
// rule), for the refusal handler and for every layer's observers. Two paths: the layer's
// cost (WithCost) and a reservation of the rule's own (a Content-Length above a byte
// rule's capacity).
func TestExceededIndexCountsEveryLayer(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	id := keyfuncs.Header("X-Client")
	var observed []int
	observe := middleware.WithObserver(func(e middleware.Event) {
		if e.Result == middleware.Exceeded {
			observed = append(observed, e.Decision.Index)
		}
	})
	outer := mustNew(t, lim, []middleware.Rule{
		{Rule: rule("outer-a", 10, time.Minute), Identity: id},
		{Rule: rule("outer-b", 10, time.Minute), Identity: id},
	}, observe)
	cases := []struct {
		name  string
		inner []middleware.Rule
		opts  []middleware.Option
		body  int
		want  string
	}{
		{"layer cost", []middleware.Rule{
			{Rule: rule("inner-shadow", 10, time.Minute), Identity: id, Shadow: true},
			{Rule: rule("inner-wide", 10, time.Minute), Identity: id},
			{Rule: rule("inner-narrow", 3, time.Minute), Identity: id},
		}, []middleware.Option{middleware.WithCost(func(*http.Request) (int64, error) { return 5, nil })}, 0, "inner-narrow"},
		{"reserved bytes", []middleware.Rule{
			{Rule: rule("inner-shadow", 10, time.Minute), Identity: id, Shadow: true},
			{Rule: rule("inner-wide", 10, time.Minute), Identity: id},
			{Rule: rule("inner-bytes", 10, time.Minute), Identity: id, Counts: middleware.CountRequestBytes()},
		}, nil, 100, "inner-bytes"},
	}
	for _, c := range cases {
		observed = nil
		var rr refusalRecorder
		inner := mustNew(t, lim, c.inner, append(c.opts, observe, middleware.WithRefusalHandler(rr.handle))...)
		req := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("x", c.body)))
		req.Header.Set("X-Client", "alice")
		rec := httptest.NewRecorder()
		outer(inner(ok)).ServeHTTP(rec, req)
		if rec.Code != http.StatusTeapot || !rr.d.Exceeded || rr.d.Rule != c.want {
			t.Fatalf("%s: status %d, decision %+v; want 418 from the refusal handler, Exceeded by %s", c.name, rec.Code, rr.d, c.want)
		}
		// outer-a, outer-b, inner-wide come before it (the shadow rule is no check).
		if rr.d.Index != 3 {
			t.Errorf("%s: refusal handler's Index %d, want 3 (two outer checks, then inner-wide)", c.name, rr.d.Index)
		}
		if len(observed) != 2 || observed[0] != 3 || observed[1] != 3 {
			t.Errorf("%s: observed indexes %v, want [3 3] (inner and outer layer)", c.name, observed)
		}
	}
}

// upgrade sends h an upgrade request on a real connection and returns what came back
// until the handler closed it, once the middleware around the handler has returned
// (and settled).
func upgrade(t *testing.T, h http.Handler) string {
	t.Helper()
	served := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(served)
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
	got, _ := io.ReadAll(conn)
	<-served
	return string(got)
}

// A refusal handler is given the wait the default refusal sends: for an InFlight rule a
// slot frees when any running request of the client ends, so Retry-After is 1s, not the
// lease's time to live. A handler that answers with d.RetryAfter (as
// headers.WriteTooManyRequests does) must not tell clients to wait a whole TTL.
func TestRefusalHandlerInFlightRetryAfter(t *testing.T) {
	t.Parallel()
	var rr refusalRecorder
	lim := newMemory(t, newClock())
	in, release := make(chan struct{}), make(chan struct{})
	h := mustNew(t, lim, []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: 30 * time.Second}, Identity: keyfuncs.Global()},
		{Rule: rule("hourly", 100, time.Hour), Identity: keyfuncs.Global()},
	}, middleware.WithRefusalHandler(rr.handle))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(in)
			<-release
		}
	}))
	done := make(chan int)
	go func() { done <- do(h, "GET", "/hold", nil).Code }()
	<-in
	rec := do(h, "GET", "/", nil)
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("holding request: %d, want 200", code)
	}
	if rec.Code != http.StatusTeapot || rr.calls != 1 || rr.d.Rule != "slots" {
		t.Fatalf("refusal: status %d, calls %d, decision %+v; want 418 from the handler for slots", rec.Code, rr.calls, rr.d)
	}
	if rr.d.RetryAfter != time.Second {
		t.Fatalf("decision given to the refusal handler: RetryAfter %v, want 1s (the default's Retry-After for an in-flight refusal, not the lease TTL)", rr.d.RetryAfter)
	}
}
