package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// shadowDown is a limiter whose store fails every decision that names the rule "canary"
// and answers the others.
type shadowDown struct{ next ratebudget.Limiter }

func (s shadowDown) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	for _, c := range checks {
		if c.Rule.Name == "canary" {
			return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Uncertain: true, Err: errors.New("read: connection reset by peer")}
		}
	}
	return s.next.Allow(ctx, checks)
}

// A store failure of a shadow decision never changes the response, but it is no silent
// admission either: the event carries the store error, with the failed call's time in
// its latency, so that LogStoreErrors logs it and metrics count it. Otherwise a shadow
// rule whose store is down looks like one that would never refuse.
func TestShadowStoreFailureIsObserved(t *testing.T) {
	t.Parallel()
	canary := ratebudget.Rule{Name: "canary", Limit: 1, Window: time.Minute}
	for _, tc := range []struct {
		name  string
		rules []middleware.Rule
		rule  string // the rule the decision reports
	}{
		{"every rule in shadow mode", []middleware.Rule{{Rule: canary, Identity: global, Shadow: true}}, ""},
		{"an enforced rule and a shadow one", []middleware.Rule{
			{Rule: rule("api", 5, time.Minute), Identity: global},
			{Rule: canary, Identity: global, Shadow: true},
		}, "api"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var evs events
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			h := mustNew(t, shadowDown{newMemory(t, newClock())}, tc.rules,
				middleware.WithBreaker(middleware.Breaker{Disabled: true}),
				middleware.WithObserver(evs.observe), middleware.WithObserver(middleware.LogStoreErrors(log, 0)))(ok)
			if rec := do(h, "GET", "/", nil); rec.Code != 200 {
				t.Fatalf("%d, want 200: a shadow rule never changes a response", rec.Code)
			}
			_, all := evs.take()
			if len(all) != 1 {
				t.Fatalf("events %+v, want one", all)
			}
			e := all[0]
			var se *ratebudget.StoreError
			if e.Result != middleware.Allowed || e.Decision.Rule != tc.rule || e.Shadow != (ratebudget.Decision{}) {
				t.Errorf("event %+v, want allowed by %q with no shadow decision", e, tc.rule)
			}
			if !errors.As(e.Err, &se) || se.Class != ratebudget.ClassConnection {
				t.Errorf("event's Err %v, want the shadow decision's store error", e.Err)
			}
			if e.Latency <= 0 {
				t.Errorf("event's Latency %v, want the store calls' time", e.Latency)
			}
			if !strings.Contains(logged.String(), "rate-limit store failure") {
				t.Errorf("LogStoreErrors wrote %q, want the shadow decision's store failure", logged.String())
			}
		})
	}
}
