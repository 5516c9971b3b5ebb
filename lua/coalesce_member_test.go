package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/lua"
)

// TestCoalescedAllowResetAfter: a member of a group deciding through Allow is told the
// token bucket's ResetAfter it would have seen admitted alone, as an AllowEach member is
// (TestCoalescedOutcomes): the bucket (one token per 100ms) is full again 100ms sooner
// per unit remaining, not when the whole group's spend has refilled.
func TestCoalescedAllowResetAfter(t *testing.T) {
	srv, _, l := coalescing(t, nil)
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "bucket", Algorithm: ratebudget.TokenBucket, Limit: 600, Window: time.Minute}, Identity: "ann", Cost: 1}}
	warm := []ratebudget.Check{{Rule: chk[0].Rule, Identity: "warm", Cost: 1}}
	if _, err := l.Allow(context.Background(), warm); err != nil { // loads the script
		t.Fatal(err)
	}
	out := make(chan result, 20)
	hold(t, srv, l, chk, out)
	join(t, l, chk, 19, 19, background, out)
	srv.Thaw(t)
	var full time.Duration
	for range 20 {
		r := <-out
		if r.err != nil || !r.d.Allowed {
			t.Fatalf("decision: %+v, %v; want admitted", r.d, r.err)
		}
		if r.d.Remaining == 599 {
			continue // the first decision, alone
		}
		f := r.d.ResetAfter + time.Duration(r.d.Remaining)*100*time.Millisecond
		if full != 0 && f != full {
			t.Fatalf("member with %d remaining is told ResetAfter %v; want %v less 100ms per unit remaining", r.d.Remaining, r.d.ResetAfter, full-time.Duration(r.d.Remaining)*100*time.Millisecond)
		}
		full = f
	}
}

// TestCoalescedDecisionIndex: a member's Decision reports the rule it would have
// reported alone. Two checks tie on Remaining at every place; a single-step limiter then
// reports the one full again later. A fixed window of a minute ends after about 60s for
// everyone; a token bucket of one token per 6s is full again after 6s per unit spent:
// later than the window for the group's whole spend (11 units: 66s), sooner for a member
// that spent at most 9 of them.
func TestCoalescedDecisionIndex(t *testing.T) {
	srv, _, l := coalescing(t, nil)
	chk := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "api", Limit: 100, Window: time.Minute}, Identity: "ann", Cost: 1},
		{Rule: ratebudget.Rule{Name: "bucket", Algorithm: ratebudget.TokenBucket, Limit: 100, Window: 600 * time.Second}, Identity: "ann", Cost: 1},
	}
	warm := []ratebudget.Check{{Rule: chk[0].Rule, Identity: "warm", Cost: 1}}
	if _, err := l.Allow(context.Background(), warm); err != nil { // loads the script
		t.Fatal(err)
	}
	type each struct {
		d    ratebudget.Decision
		outs []ratebudget.Outcome
		err  error
	}
	first := make(chan result, 1)
	hold(t, srv, l, chk, first)
	out := make(chan each, 10)
	for i := range 10 {
		go func() {
			if i%2 == 0 {
				d, err := l.Allow(context.Background(), chk)
				out <- each{d, nil, err}
				return
			}
			outs := make([]ratebudget.Outcome, len(chk))
			d, err := l.AllowEach(context.Background(), chk, outs)
			out <- each{d, outs, err}
		}()
	}
	waitFor(t, "decisions to join a group", func() bool { m, _ := lua.Waiting(l); return m == 10 })
	srv.Thaw(t)
	if r := <-first; r.err != nil || !r.d.Allowed {
		t.Fatalf("first decision: %+v, %v", r.d, r.err)
	}
	for range 10 {
		r := <-out
		if r.err != nil || !r.d.Allowed {
			t.Fatalf("decision: %+v, %v; want admitted", r.d, r.err)
		}
		spent := 100 - r.d.Remaining
		if r.outs != nil {
			if want := ratebudget.Combine(chk, r.outs); r.d != want {
				t.Errorf("member with outcomes %+v is told %+v; alone it would have been told %+v", r.outs, r.d, want)
			}
		}
		if spent <= 9 && (r.d.Index != 0 || r.d.Rule != "api" || r.d.ResetAfter < 50*time.Second) {
			t.Errorf("member that spent unit %d: %+v; want the window's rule (index 0, ResetAfter about 60s): the bucket is full again after %v", spent, r.d, time.Duration(spent)*6*time.Second)
		}
		if f := time.Duration(spent) * 6 * time.Second; spent > 10 && (r.d.Index != 1 || r.d.ResetAfter > f || r.d.ResetAfter < f-time.Second) {
			t.Errorf("member that spent unit %d: %+v; want the bucket's rule, full again after %v", spent, r.d, time.Duration(spent)*6*time.Second)
		}
	}
}
