package refusal

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// scripted is an inner limiter that answers from a queue and counts its calls.
type scripted struct {
	answers []ratebudget.Decision
	eachOut []ratebudget.Outcome
	calls   int
}

func (s *scripted) Allow(_ context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	if err := ratebudget.ValidateChecks(checks); err != nil {
		return ratebudget.Decision{}, err
	}
	s.calls++
	d := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	return d, nil
}

// AllowEach answers as Allow and reports outcome eachOut[i] for check i, or when
// eachOut is shorter the decision's own for every check.
func (s *scripted) AllowEach(ctx context.Context, checks []ratebudget.Check, outs []ratebudget.Outcome) (ratebudget.Decision, error) {
	d, err := s.Allow(ctx, checks)
	for i := range outs {
		outs[i] = ratebudget.Outcome{Allowed: d.Allowed, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter}
		if i < len(s.eachOut) {
			outs[i] = s.eachOut[i]
		}
	}
	return d, err
}

func TestLayerRepeatsRefusals(t *testing.T) {
	rule := ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}
	refusal := ratebudget.Decision{Rule: "api", Limit: 5, Outcome: ratebudget.Outcome{RetryAfter: time.Hour, ResetAfter: time.Hour}}
	inner := &scripted{answers: []ratebudget.Decision{refusal}}
	l := Wrap(inner, 1024, nil)
	ctx := context.Background()
	ann := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 2}}
	for i := range 3 {
		d, err := l.Allow(ctx, ann)
		if err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("decision %d: %+v, %v; want a refusal", i, d, err)
		}
	}
	if inner.calls != 1 {
		t.Fatalf("inner limiter asked %d times for 3 refused requests, want 1", inner.calls)
	}
	// An admission forgets the budget's refusal.
	inner.answers = []ratebudget.Decision{{Outcome: ratebudget.Outcome{Allowed: true, Remaining: 3}, Rule: "api", Limit: 5}, refusal}
	if _, err := l.Allow(ctx, []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	before := inner.calls
	if _, err := l.Allow(ctx, ann); err != nil || inner.calls != before+1 {
		t.Fatalf("after an admission the refusal was repeated: %v, calls %d", err, inner.calls-before)
	}
	// A smaller cost, another identity, another rule or an Exceeded check may fit: asked.
	rule2 := rule
	rule2.Limit = 6
	for _, chk := range [][]ratebudget.Check{
		{{Rule: rule, Identity: "ann", Cost: 1}},
		{{Rule: rule, Identity: "bob", Cost: 2}},
		{{Rule: rule2, Identity: "ann", Cost: 2}},
		{{Rule: rule, Identity: "ann", Cost: 6}},
	} {
		before := inner.calls
		if _, err := l.Allow(ctx, chk); err != nil {
			t.Fatal(err)
		}
		if inner.calls != before+1 {
			t.Fatalf("%+v was answered from the cache", chk)
		}
	}
	// An invalid request is never answered from the cache.
	bad := []ratebudget.Check{ann[0], ann[0]}
	if _, err := l.Allow(ctx, bad); err == nil {
		t.Fatal("a request naming a budget twice was answered, want a ConfigError")
	}
}

// TestLayerCalendarKeys: Calendar rules that differ only in their Period, WeekStart or
// Location never share a cached refusal; the same rule does, whatever the cost (a
// period's wait is its end).
func TestLayerCalendarKeys(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	day := ratebudget.Rule{Name: "quota", Algorithm: ratebudget.Calendar, Limit: 5, Period: ratebudget.Week}
	refusal := ratebudget.Decision{Rule: "quota", Limit: 5, Outcome: ratebudget.Outcome{RetryAfter: time.Hour, ResetAfter: time.Hour}}
	inner := &scripted{answers: []ratebudget.Decision{refusal}}
	l := Wrap(inner, 1024, func() time.Duration { return 0 }) // a clock that stands still: the repeat bound never ends
	ctx := context.Background()
	month, monday, newYork, kathmandu := day, day, day, day
	month.Period, monday.WeekStart, newYork.Location = ratebudget.Month, time.Monday, ny
	kathmandu.Location = time.FixedZone("Asia/Kathmandu", 20700)
	for i, r := range []ratebudget.Rule{day, month, monday, newYork, kathmandu} {
		before := inner.calls
		for _, cost := range []int64{2, 2, 3} {
			if d, err := l.Allow(ctx, []ratebudget.Check{{Rule: r, Identity: "ann", Cost: cost}}); err != nil || d.Allowed {
				t.Fatalf("rule %d: %+v, %v; want a refusal", i, d, err)
			}
		}
		if inner.calls != before+1 {
			t.Fatalf("rule %d (%+v): the inner limiter was asked %d times for 3 refusals, want once (its own refusal, then cached)", i, r, inner.calls-before)
		}
	}
}

// TestLayerKeySize: a cache key has the same size for any identity, so a hostile
// identity cannot make the cache large.
func TestLayerKeySize(t *testing.T) {
	l := Wrap(&scripted{}, 16, nil)
	rule := ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}
	short, _ := l.key(nil, nil, &ratebudget.Check{Rule: rule, Identity: "a"})
	long, _ := l.key(nil, nil, &ratebudget.Check{Rule: rule, Identity: strings.Repeat("x", 1<<20), Scope: strings.Repeat("y", 1<<20)})
	if len(short) != keyLen || len(long) != keyLen || string(short) == string(long) {
		t.Fatalf("keys of %d and %d bytes, want %d, distinct", len(short), len(long), keyLen)
	}
}

// TestLayerRepeatsOutcomes: AllowEach repeats a refusal with the outcomes the inner
// limiter reported, only for the same checks, and asks again once one of their budgets
// was spent through the layer or a refusal was cached without outcomes.
func TestLayerRepeatsOutcomes(t *testing.T) {
	api := ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}
	site := ratebudget.Rule{Name: "site", Limit: 100, Window: time.Hour}
	refusal := ratebudget.Decision{Rule: "api", Index: 1, Limit: 5, Outcome: ratebudget.Outcome{RetryAfter: time.Hour, ResetAfter: time.Hour}}
	outs := []ratebudget.Outcome{
		{Allowed: true, Remaining: 40, ResetAfter: 30 * time.Minute},
		{RetryAfter: time.Hour, ResetAfter: time.Hour},
	}
	inner := &scripted{answers: []ratebudget.Decision{refusal}, eachOut: outs}
	l := Wrap(inner, 1024, nil)
	ctx := context.Background()
	both := []ratebudget.Check{{Rule: site, Cost: 1}, {Rule: api, Identity: "ann", Cost: 1}}
	ask := func(checks []ratebudget.Check) ([]ratebudget.Outcome, int) {
		t.Helper()
		got := make([]ratebudget.Outcome, len(checks))
		before := inner.calls
		d, err := l.AllowEach(ctx, checks, got)
		if err != nil || d.Allowed || d.Rule != "api" {
			t.Fatalf("%+v: %+v, %v; want api's refusal", checks, d, err)
		}
		return got, inner.calls - before
	}
	if _, calls := ask(both); calls != 1 {
		t.Fatalf("first refusal: %d inner calls, want 1", calls)
	}
	got, calls := ask(both)
	if calls != 0 || !got[0].Allowed || got[0].Remaining != 40 || got[1].Allowed || got[1].RetryAfter <= 59*time.Minute {
		t.Fatalf("repeated refusal: %d inner calls, outcomes %+v; want the stored ones from the cache", calls, got)
	}
	// Other checks on the refused budget: Redis is asked, not answered with the
	// stored decision's outcomes.
	for _, other := range [][]ratebudget.Check{
		{{Rule: site, Scope: "/x", Cost: 1}, both[1]},
		{{Rule: site, Cost: 2}, both[1]},
		{{Rule: site, Identity: "x", Cost: 1}, both[1]},
		{both[0], both[1], {Rule: site, Identity: "y", Cost: 1}},
	} {
		if _, calls := ask(other); calls != 1 {
			t.Fatalf("%+v answered from another decision's outcomes", other)
		}
	}
	// Allow still repeats the refusal for the budget.
	if d, err := l.Allow(ctx, []ratebudget.Check{both[1]}); err != nil || d.Allowed || inner.calls != 5 {
		t.Fatalf("Allow: %+v %v, %d calls; want the cached refusal", d, err, inner.calls)
	}
	// Restore the snapshot of both, then spend from site: the snapshot no longer holds.
	inner.eachOut = outs
	ask(both)
	if _, calls := ask(both); calls != 0 {
		t.Fatal("the refusal of both was not cached again")
	}
	inner.answers = []ratebudget.Decision{{Outcome: ratebudget.Outcome{Allowed: true, Remaining: 39}, Rule: "site", Limit: 100}, refusal}
	if d, err := l.Allow(ctx, []ratebudget.Check{{Rule: site, Cost: 1}}); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if _, calls := ask(both); calls != 1 {
		t.Fatal("after a spend from site, its stale outcome was repeated")
	}
	// A refusal stored by Allow has no outcomes: AllowEach asks.
	l2 := Wrap(&scripted{answers: []ratebudget.Decision{refusal}}, 1024, nil)
	if _, err := l2.Allow(ctx, both); err != nil {
		t.Fatal(err)
	}
	inner2 := l2.inner.(*scripted)
	if _, err := l2.AllowEach(ctx, both, make([]ratebudget.Outcome, 2)); err != nil || inner2.calls != 2 {
		t.Fatalf("AllowEach after Allow's refusal: %v, %d calls; want the inner limiter asked", err, inner2.calls)
	}
	if _, err := l2.Allow(ctx, both); err != nil || inner2.calls != 2 {
		t.Fatalf("Allow after AllowEach's refusal: %v, %d calls; want the cache", err, inner2.calls)
	}
}

// TestLayerRepeatsAtMostMaxRepeat: on the layer's clock, a refusal with an hour's wait is
// repeated without asking the inner limiter for MaxRepeat, by Allow and by AllowEach,
// and then the inner limiter is asked again.
func TestLayerRepeatsAtMostMaxRepeat(t *testing.T) {
	rule := ratebudget.Rule{Name: "api", Limit: 5, Window: 2 * time.Hour}
	refusal := ratebudget.Decision{Rule: "api", Limit: 5, Outcome: ratebudget.Outcome{RetryAfter: time.Hour, ResetAfter: time.Hour}}
	for _, each := range []bool{false, true} {
		inner := &scripted{answers: []ratebudget.Decision{refusal}}
		var clock atomic.Int64
		l := Wrap(inner, 1024, func() time.Duration { return time.Duration(clock.Load()) })
		ask := func() ratebudget.Decision {
			t.Helper()
			checks := []ratebudget.Check{{Rule: rule, Identity: "ann", Cost: 1}}
			var d ratebudget.Decision
			var err error
			if each {
				d, err = l.AllowEach(context.Background(), checks, make([]ratebudget.Outcome, 1))
			} else {
				d, err = l.Allow(context.Background(), checks)
			}
			if err != nil || d.Allowed {
				t.Fatalf("each %v: %+v, %v; want a refusal", each, d, err)
			}
			return d
		}
		ask()
		clock.Store(int64(MaxRepeat - time.Millisecond))
		if d := ask(); inner.calls != 1 || d.RetryAfter != time.Hour-MaxRepeat+time.Millisecond {
			t.Fatalf("each %v: %d inner calls, RetryAfter %v; want the cached refusal, %v", each, inner.calls, d.RetryAfter, time.Hour-MaxRepeat+time.Millisecond)
		}
		clock.Store(int64(MaxRepeat))
		if ask(); inner.calls != 2 {
			t.Fatalf("each %v: %d inner calls after %v, want the inner limiter asked again", each, inner.calls, MaxRepeat)
		}
	}
}
