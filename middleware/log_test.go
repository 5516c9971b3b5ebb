package middleware_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

func TestLogStoreErrorsIsRateLimited(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	obs := middleware.LogStoreErrors(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	fail := middleware.Event{Result: middleware.Unavailable, Err: &ratebudget.StoreError{Class: ratebudget.ClassTimeout, Err: errors.New("i/o timeout")}}
	obs(middleware.Event{Result: middleware.Allowed})
	obs(middleware.Event{Result: middleware.Invalid, Err: errors.New("no ip")})
	for range 100 {
		obs(fail)
	}
	if n := strings.Count(buf.String(), "rate-limit store failure"); n != 1 {
		t.Fatalf("%d lines for 100 failures within the interval, want 1:\n%s", n, buf.String())
	}
	buf.Reset()
	every := middleware.LogStoreErrors(slog.New(slog.NewTextHandler(&buf, nil)), 0)
	for range 3 {
		every(fail)
	}
	if n := strings.Count(buf.String(), "outcome=unavailable"); n != 3 {
		t.Fatalf("%d lines with no interval, want 3", n)
	}
}

// A nil logger is the default logger: the observer runs on the request path, where a nil
// pointer dereference would turn the first store failure into a panic.
func TestLogStoreErrorsNilLoggerDoesNotPanic(t *testing.T) {
	t.Parallel()
	obs := middleware.LogStoreErrors(nil, 0)
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("observer built with a nil logger panicked on a store failure: %v", p)
		}
	}()
	obs(middleware.Event{Result: middleware.Unavailable, Err: &ratebudget.StoreError{Class: ratebudget.ClassTimeout, Err: errors.New("i/o timeout")}})
}

// One LogStoreErrors observer given to every stacked layer (one set of options for
// every layer) logs a store failure of the stack's one decision once, as it would for
// one layer.
func TestLogStoreErrorsOnStackedLayers(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logged := middleware.LogStoreErrors(slog.New(slog.NewTextHandler(&buf, nil)), 0)
	lim := &flaky{next: newMemory(t, newClock())}
	lim.down.Store(true)
	opts := []middleware.Option{middleware.WithObserver(logged), middleware.WithFailOpen(), middleware.WithBreaker(middleware.Breaker{Disabled: true})}
	outer := mustNew(t, lim, []middleware.Rule{{Rule: rule("outer", 5, time.Minute), Identity: global}}, opts...)
	inner := mustNew(t, lim, []middleware.Rule{{Rule: rule("inner", 5, time.Minute), Identity: global}}, opts...)
	h := outer(inner(ok))
	for range 2 {
		if rec := do(h, "GET", "/", nil); rec.Code != 200 {
			t.Fatalf("%d, want 200 (FailOpen)", rec.Code)
		}
	}
	if n := strings.Count(buf.String(), "outcome=degraded"); n != 2 {
		t.Fatalf("%d lines for 2 failed decisions, want 2:\n%s", n, buf.String())
	}
}
