package middleware_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/problem"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/middleware"
)

// An identity function that returns "" for a missing header must not put every such
// client in one budget: the request is refused with 400 and nothing is counted.
func TestEmptyIdentityIsRefused(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	var events []middleware.Event
	h := mustNew(t, lim, []middleware.Rule{{
		Rule:     rule("per-client", 2, time.Minute),
		Identity: func(r *http.Request) (string, error) { return r.Header.Get("X-Client-Id"), nil },
	}}, middleware.WithObserver(func(e middleware.Event) { events = append(events, e) }))(ok)
	for i := range 3 {
		rec := do(h, "GET", "/", nil)
		if rec.Code != 400 || rec.Body.String() != "Bad Request: rate-limit identity: identity could not be determined\n" {
			t.Fatalf("client %d without the header: %d %q", i, rec.Code, rec.Body)
		}
	}
	var ie *middleware.InputError
	if len(events) != 3 || events[0].Result != middleware.Invalid || !errors.As(events[0].Err, &ie) || ie.Part != "identity" || ie.Rule != "per-client" {
		t.Fatalf("events %+v", events)
	}
	// An empty scope is refused the same way; a service-wide budget is explicit.
	h = mustNew(t, lim, []middleware.Rule{{Rule: rule("s", 2, time.Minute), Identity: keyfuncs.Global(),
		Scope: func(*http.Request) (string, error) { return "", nil }}})(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 400 || !strings.Contains(rec.Body.String(), "rate-limit scope: scope could not be determined") {
		t.Fatalf("empty scope: %d %q", rec.Code, rec.Body)
	}
	h = mustNew(t, lim, []middleware.Rule{{Rule: rule("service", 2, time.Minute), Identity: keyfuncs.Global()}})(ok)
	for i, want := range []int{200, 200, 429} {
		if rec := do(h, "GET", "/", nil); rec.Code != want {
			t.Fatalf("service-wide request %d: %d, want %d", i, rec.Code, want)
		}
	}
}

// A 400 says which of identity, scope or cost failed, with a reason fit for the client.
func TestBadRequestNamesThePart(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	cost := middleware.WithCost(func(r *http.Request) (int64, error) {
		v := r.URL.Query().Get("cost")
		if v == "" {
			return 1, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, &middleware.InputError{Reason: "cost must be a positive integer", Err: err}
		}
		return n, nil
	})
	opaque := middleware.WithCost(func(*http.Request) (int64, error) { return 0, errors.New("db: connection refused at 10.0.0.7") })
	// A reason anywhere in the function's error chain is the client's; an InputError
	// without one is answered with the generic reason.
	wrapped := middleware.WithCost(func(*http.Request) (int64, error) {
		return 0, fmt.Errorf("wrapped: %w", &middleware.InputError{Reason: "tenant unknown"})
	})
	noReason := middleware.WithCost(func(*http.Request) (int64, error) {
		return 0, &middleware.InputError{Err: errors.New("db: connection refused at 10.0.0.7")}
	})
	h := mustNew(t, lim, []middleware.Rule{{Rule: rule("api", 10, time.Minute), Identity: keyfuncs.HashedHeader("X-API-Key", nil),
		Scope: keyfuncs.Header("X-Tenant")}}, cost)(ok)
	h2 := mustNew(t, lim, []middleware.Rule{{Rule: rule("api2", 10, time.Minute), Identity: keyfuncs.Global()}}, opaque)(ok)
	h3 := mustNew(t, lim, []middleware.Rule{{Rule: rule("api3", 10, time.Minute), Identity: keyfuncs.Global()}}, wrapped)(ok)
	h4 := mustNew(t, lim, []middleware.Rule{{Rule: rule("api4", 10, time.Minute), Identity: keyfuncs.Global()}}, noReason)(ok)
	for _, tc := range []struct {
		h      http.Handler
		target string
		hdr    map[string]string
		part   string
		body   string
	}{
		{h, "/", map[string]string{"X-Tenant": "t1"}, "identity", "rate-limit identity: header X-Api-Key is missing or empty"},
		{h, "/", map[string]string{"X-API-Key": "k"}, "scope", "rate-limit scope: header X-Tenant is missing or empty"},
		{h, "/?cost=abc", map[string]string{"X-API-Key": "k", "X-Tenant": "t1"}, "cost", "rate-limit cost: cost must be a positive integer"},
		{h, "/?cost=0", map[string]string{"X-API-Key": "k", "X-Tenant": "t1"}, "cost", "rate-limit cost: cost must be a positive integer"},
		{h, "/?cost=-3", map[string]string{"X-API-Key": "k", "X-Tenant": "t1"}, "cost", "rate-limit cost: cost must be a positive integer"},
		{h2, "/", nil, "cost", "rate-limit cost: cost could not be determined"}, // an internal error's text is never sent
		{h3, "/", nil, "cost", "rate-limit cost: tenant unknown"},
		{h4, "/", nil, "cost", "rate-limit cost: cost could not be determined"},
	} {
		rec := do(tc.h, "GET", tc.target, tc.hdr)
		if rec.Code != 400 || rec.Body.String() != "Bad Request: "+tc.body+"\n" {
			t.Errorf("%s %v: %d %q, want %q", tc.target, tc.hdr, rec.Code, rec.Body, tc.body)
		}
		hdr := map[string]string{"Accept": "application/json"}
		for k, v := range tc.hdr {
			hdr[k] = v
		}
		var p problem.Problem
		if err := json.Unmarshal(do(tc.h, "GET", tc.target, hdr).Body.Bytes(), &p); err != nil || p.Invalid != tc.part || p.Detail != tc.body {
			t.Errorf("%s %v: problem %+v %v", tc.target, tc.hdr, p, err)
		}
	}
	if rec := do(h, "GET", "/?cost=3", map[string]string{"X-API-Key": "k", "X-Tenant": "t1"}); rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "7" {
		t.Fatalf("nothing was counted for the 400s: %d %v", rec.Code, rec.Header())
	}
}

// A cost that does not fit what remains is not "exhausted".
func TestRefusalOfACostThatDoesNotFit(t *testing.T) {
	t.Parallel()
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("api", 5, time.Minute), Identity: global}},
		middleware.WithCost(func(r *http.Request) (int64, error) { return strconv.ParseInt(r.URL.Query().Get("cost"), 10, 64) }))(ok)
	if rec := do(h, "GET", "/?cost=3", nil); rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	rec := do(h, "GET", "/?cost=3", nil)
	if rec.Code != 429 || rec.Header().Get("X-RateLimit-Remaining") != "2" ||
		rec.Body.String() != "Too Many Requests: the cost 3 of this request does not fit the 2 units left in rate limit \"api\"; retry in 60s\n" {
		t.Fatalf("%d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	if rec := do(h, "GET", "/?cost=2", nil); rec.Code != 200 {
		t.Fatalf("cost 2 fits: %d", rec.Code)
	}
	rec = do(h, "GET", "/?cost=1", map[string]string{"Accept": "application/json;q=0, text/plain"})
	if rec.Code != 429 || rec.Body.String() != "Too Many Requests: rate limit \"api\" exhausted; retry in 60s\n" {
		t.Fatalf("exhausted, text preferred: %d %q", rec.Code, rec.Body)
	}
	rec = do(h, "GET", "/?cost=1", map[string]string{"Accept": "application/x-ndjson"})
	if rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("x-ndjson is not problem+json: %q", rec.Header().Get("Content-Type"))
	}
}

// An InputError a key function returns gets the part and rule the middleware was
// computing, in the middleware's own InputError, which wraps the function's.
func TestFunctionsInputErrorIsWrapped(t *testing.T) {
	t.Parallel()
	returned := &middleware.InputError{Reason: "tenant unknown", Err: errors.New("no row")}
	var events []middleware.Event
	h := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("tenants", 10, time.Minute),
		Identity: func(*http.Request) (string, error) { return "", returned }}},
		middleware.WithObserver(func(e middleware.Event) { events = append(events, e) }))(ok)
	if rec := do(h, "GET", "/", nil); rec.Code != 400 || rec.Body.String() != "Bad Request: rate-limit identity: tenant unknown\n" {
		t.Fatalf("%d %q", rec.Code, rec.Body)
	}
	var ie *middleware.InputError
	if len(events) != 1 || events[0].Result != middleware.Invalid || !errors.As(events[0].Err, &ie) {
		t.Fatalf("events %+v", events)
	}
	if ie.Part != "identity" || ie.Rule != "tenants" || ie.Reason != "tenant unknown" || ie.Err != returned || !errors.Is(events[0].Err, returned) {
		t.Errorf("event's error %+v, want identity of rule tenants wrapping the function's", ie)
	}
	if got, want := ie.Error(), "ratebudget: rule tenants: identity: tenant unknown: ratebudget: tenant unknown: no row"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
