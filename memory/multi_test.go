package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/timerule"
	"github.com/ratebudget/ratebudget/memory"
)

var (
	perIP   = ratebudget.Rule{Name: "per-ip", Algorithm: ratebudget.FixedWindow, Limit: 3, Window: time.Second}
	global  = ratebudget.Rule{Name: "global", Algorithm: ratebudget.TokenBucket, Limit: 2, Window: time.Second}
	account = ratebudget.Rule{Name: "account", Algorithm: ratebudget.RollingWindow, Limit: 10, Window: time.Second}
)

// budgetRef names one budget: a rule for an identity (scope empty).
type budgetRef struct {
	rule     ratebudget.Rule
	identity string
}

// snapshot probes each budget without spending.
func snapshot(t *testing.T, m *memory.Limiter, refs []budgetRef) []ratebudget.Decision {
	t.Helper()
	out := make([]ratebudget.Decision, len(refs))
	for i, r := range refs {
		out[i] = probe(t, m, r.rule, r.identity, "")
	}
	return out
}

// permutations returns every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 1 {
		return [][]int{{0}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// TestAllOrNothing: a request of three checks (three time rules, three identities) that one
// rule refuses changes no budget, whatever the checks' order; the decision reports the
// refusing rule.
func TestAllOrNothing(t *testing.T) {
	refs := []budgetRef{{perIP, "10.0.0.1"}, {global, ""}, {account, "acct-1"}}
	for _, perm := range permutations(len(refs)) {
		t.Run(fmt.Sprint(perm), func(t *testing.T) {
			m, clk := newMemory(t)
			checks := make([]ratebudget.Check, len(refs))
			indexOf := map[string]int{}
			for i, p := range perm {
				checks[i] = ratebudget.Check{Rule: refs[p].rule, Identity: refs[p].identity, Cost: 1}
				indexOf[refs[p].rule.Name] = i
			}
			// Two admissions 100ms apart: the token bucket (2 per second, one per 500ms) has
			// the fewest left; 100ms refilled 0.2 token before the second.
			resets := []time.Duration{500 * ms, 900 * ms}
			for n, wantRem := range []int64{1, 0} {
				d := allow(t, m, checks...)
				want := ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: true, Remaining: wantRem, ResetAfter: resets[n]},
					Rule: "global", Index: indexOf["global"], Limit: 2}
				if d != want {
					t.Fatalf("admission %d: got %+v, want %+v", n, d, want)
				}
				clk.Advance(100 * ms)
			}
			before := snapshot(t, m, refs)
			if before[0].Remaining != 1 || before[1].Remaining != 0 || before[2].Remaining != 8 {
				t.Fatalf("remaining before the refusal: %d %d %d, want 1 0 8",
					before[0].Remaining, before[1].Remaining, before[2].Remaining)
			}
			d := allow(t, m, checks...)
			want := ratebudget.Decision{Outcome: ratebudget.Outcome{Remaining: 0, ResetAfter: 800 * ms, RetryAfter: 300 * ms},
				Rule: "global", Index: indexOf["global"], Limit: 2}
			if d != want {
				t.Fatalf("refusal: got %+v, want %+v", d, want)
			}
			if after := snapshot(t, m, refs); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("the refusal changed budgets:\nbefore %+v\nafter  %+v", before, after)
			}
			if n := m.Len(); n != 3 {
				t.Fatalf("Len %d, want 3", n)
			}
			// At RetryAfter the same request is admitted, and the other budgets show exactly
			// the spends of the admissions.
			clk.Advance(d.RetryAfter)
			if d := allow(t, m, checks...); !d.Allowed {
				t.Fatalf("at RetryAfter: %+v", d)
			}
			after := snapshot(t, m, refs)
			if after[0].Remaining != 0 || after[2].Remaining != 7 {
				t.Fatalf("after the third admission: per-ip %d account %d, want 0 7", after[0].Remaining, after[2].Remaining)
			}
		})
	}
}

// TestRefusalCreatesNoState: budgets that another check refused are neither created nor
// anchored: a fixed window opens at its first admitted request, not at a refused one.
func TestRefusalCreatesNoState(t *testing.T) {
	m, clk := newMemory(t)
	user := ratebudget.Rule{Name: "user", Limit: 3, Window: time.Second}
	if d := allow(t, m, ratebudget.Check{Rule: user, Identity: "alice", Cost: 3}); !d.Allowed {
		t.Fatalf("alice: %+v", d)
	}
	// Same rule, two identities: alice refuses, so bob is not charged, not even created.
	for _, order := range [][2]string{{"alice", "bob"}, {"bob", "alice"}} {
		d := allow(t, m,
			ratebudget.Check{Rule: user, Identity: order[0], Cost: 1},
			ratebudget.Check{Rule: user, Identity: order[1], Cost: 1})
		if d.Allowed || d.Rule != "user" || d.Index != map[bool]int{true: 0, false: 1}[order[0] == "alice"] || d.RetryAfter != time.Second {
			t.Fatalf("%v: got %+v", order, d)
		}
	}
	if n := m.Len(); n != 1 {
		t.Fatalf("Len %d after refusals, want 1 (alice only)", n)
	}
	if p := probe(t, m, user, "bob", ""); p.Remaining != 3 || p.ResetAfter != 0 {
		t.Fatalf("bob: %+v", p)
	}

	// A fixed window and a token bucket for a fresh identity, refused by the bucket.
	bucket := ratebudget.Rule{Name: "bucket", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: time.Second}
	if d := allow(t, m, ratebudget.Check{Rule: bucket, Cost: 1}); !d.Allowed {
		t.Fatalf("bucket: %+v", d)
	}
	d := allow(t, m, ratebudget.Check{Rule: user, Identity: "carol", Cost: 1}, ratebudget.Check{Rule: bucket, Cost: 1})
	if d.Allowed || d.Rule != "bucket" || d.RetryAfter != time.Second {
		t.Fatalf("refused by the bucket: %+v", d)
	}
	clk.Advance(600 * ms)
	// carol's window opens now, not 600ms ago.
	d = allow(t, m, ratebudget.Check{Rule: user, Identity: "carol", Cost: 1})
	if !d.Allowed || d.Remaining != 2 || d.ResetAfter != time.Second {
		t.Fatalf("carol's first admission: %+v", d)
	}
	// The bucket's refill was not restarted by the refusal: 400ms more fill it.
	clk.Advance(400 * ms)
	if p := probe(t, m, bucket, "", ""); p.Remaining != 1 || p.ResetAfter != 0 {
		t.Fatalf("bucket after 1s: %+v", p)
	}
}

// TestReportedRule: which rule a multi-check decision reports.
func TestReportedRule(t *testing.T) {
	slow := ratebudget.Rule{Name: "slow", Limit: 1, Window: time.Second}                                      // refuses for up to 1s
	fast := ratebudget.Rule{Name: "fast", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: 100 * ms}      // refuses for up to 100ms
	wide := ratebudget.Rule{Name: "wide", Algorithm: ratebudget.RollingWindow, Limit: 100, Window: time.Hour} // never refuses here
	long := ratebudget.Rule{Name: "long", Limit: 5, Window: time.Minute}
	short := ratebudget.Rule{Name: "short", Algorithm: ratebudget.RollingWindow, Limit: 5, Window: time.Second}

	t.Run("refusal: longest RetryAfter", func(t *testing.T) {
		m, _ := newMemory(t)
		checks := []ratebudget.Check{{Rule: fast, Cost: 1}, {Rule: wide, Cost: 1}, {Rule: slow, Cost: 1}}
		allow(t, m, checks...)
		d := allow(t, m, checks...)
		if d.Allowed || d.Rule != "slow" || d.Index != 2 || d.RetryAfter != time.Second || d.Limit != 1 {
			t.Fatalf("got %+v, want slow refusing for 1s", d)
		}
	})
	t.Run("refusal: Exceeded wins over a longer wait", func(t *testing.T) {
		m, _ := newMemory(t)
		allow(t, m, ratebudget.Check{Rule: slow, Cost: 1})
		d := allow(t, m, ratebudget.Check{Rule: slow, Cost: 1}, ratebudget.Check{Rule: fast, Cost: 2})
		want := ratebudget.Decision{Outcome: ratebudget.Outcome{Exceeded: true, Remaining: 1}, Rule: "fast", Index: 1, Limit: 1}
		if d != want {
			t.Fatalf("got %+v, want %+v", d, want)
		}
		// Nothing spent: slow is still refusing for 1s, fast still full.
		if p := probe(t, m, fast, "", ""); p.Remaining != 1 {
			t.Fatalf("fast after Exceeded: %+v", p)
		}
	})
	t.Run("refusal beats fewer remaining", func(t *testing.T) {
		m, _ := newMemory(t)
		allow(t, m, ratebudget.Check{Rule: wide, Cost: 100})
		allow(t, m, ratebudget.Check{Rule: long, Cost: 5})
		d := allow(t, m, ratebudget.Check{Rule: wide, Identity: "x", Cost: 100}, ratebudget.Check{Rule: long, Cost: 1})
		if d.Allowed || d.Rule != "long" || d.Index != 1 || d.Remaining != 0 || d.RetryAfter != time.Minute {
			t.Fatalf("got %+v", d)
		}
	})
	t.Run("admission: fewest remaining", func(t *testing.T) {
		m, _ := newMemory(t)
		d := allow(t, m, ratebudget.Check{Rule: wide, Cost: 3}, ratebudget.Check{Rule: long, Cost: 3}, ratebudget.Check{Rule: short, Cost: 1})
		if !d.Allowed || d.Rule != "long" || d.Index != 1 || d.Remaining != 2 || d.ResetAfter != time.Minute {
			t.Fatalf("got %+v", d)
		}
	})
	t.Run("admission: tie on remaining, longest reset", func(t *testing.T) {
		for _, order := range [][2]ratebudget.Rule{{long, short}, {short, long}} {
			m, _ := newMemory(t)
			d := allow(t, m, ratebudget.Check{Rule: order[0], Cost: 2}, ratebudget.Check{Rule: order[1], Cost: 2})
			if !d.Allowed || d.Rule != "long" || d.Remaining != 3 || d.ResetAfter != time.Minute || order[d.Index].Window != time.Minute {
				t.Fatalf("%s,%s: got %+v", order[0].Name, order[1].Name, d)
			}
		}
	})
}

func TestCombine(t *testing.T) {
	a := ratebudget.Rule{Name: "a", Limit: 10, Window: time.Second}
	b := ratebudget.Rule{Name: "b", Algorithm: ratebudget.TokenBucket, Limit: 5, Window: time.Minute, Burst: 20}
	c := ratebudget.Rule{Name: "c", Algorithm: ratebudget.RollingWindow, Limit: 7, Window: time.Hour}
	checks := []ratebudget.Check{{Rule: a, Cost: 1}, {Rule: b, Cost: 1}, {Rule: c, Cost: 1}}
	ok := func(rem int64, reset time.Duration) ratebudget.Outcome {
		return ratebudget.Outcome{Allowed: true, Remaining: rem, ResetAfter: reset}
	}
	no := func(rem int64, retry time.Duration) ratebudget.Outcome {
		return ratebudget.Outcome{Remaining: rem, ResetAfter: 2 * retry, RetryAfter: retry}
	}
	exceeded := ratebudget.Outcome{Exceeded: true, Remaining: 4, ResetAfter: 9 * ms}
	dec := func(allowed, exceeded bool, i int, rem int64, reset, retry time.Duration) ratebudget.Decision {
		r := checks[i].Rule
		return ratebudget.Decision{Outcome: ratebudget.Outcome{Allowed: allowed, Exceeded: exceeded, Remaining: rem, ResetAfter: reset, RetryAfter: retry},
			Rule: r.Name, Index: i, Limit: timerule.Capacity(&r)}
	}
	tests := []struct {
		name     string
		outcomes []ratebudget.Outcome
		want     ratebudget.Decision
	}{
		{"no outcomes", nil, ratebudget.Decision{}},
		{"one admitted", []ratebudget.Outcome{ok(3, ms)}, dec(true, false, 0, 3, ms, 0)},
		{"admitted: fewest remaining", []ratebudget.Outcome{ok(3, ms), ok(1, ms), ok(2, time.Hour)}, dec(true, false, 1, 1, ms, 0)},
		{"admitted: tie, longest reset", []ratebudget.Outcome{ok(1, ms), ok(1, 3*ms), ok(1, 2*ms)}, dec(true, false, 1, 1, 3*ms, 0)},
		{"admitted: full tie, first", []ratebudget.Outcome{ok(2, ms), ok(1, ms), ok(1, ms)}, dec(true, false, 1, 1, ms, 0)},
		{"admitted: limit is the capacity", []ratebudget.Outcome{ok(9, ms), ok(0, ms)}, dec(true, false, 1, 0, ms, 0)},
		{"admitted: RetryAfter dropped", []ratebudget.Outcome{{Allowed: true, Remaining: 1, RetryAfter: time.Second}}, dec(true, false, 0, 1, 0, 0)},
		{"admitted: negative remaining clamped", []ratebudget.Outcome{ok(-3, ms)}, dec(true, false, 0, 0, ms, 0)},
		{"refused after admitted", []ratebudget.Outcome{ok(0, ms), ok(0, ms), no(5, 7*ms)}, dec(false, false, 2, 5, 14*ms, 7*ms)},
		{"refused first", []ratebudget.Outcome{no(5, 7*ms), ok(0, ms), ok(0, ms)}, dec(false, false, 0, 5, 14*ms, 7*ms)},
		{"refusals: longest RetryAfter", []ratebudget.Outcome{no(1, 2*ms), no(0, 3*ms), no(0, ms)}, dec(false, false, 1, 0, 6*ms, 3*ms)},
		{"refusals: tie, first", []ratebudget.Outcome{ok(0, ms), no(1, 3*ms), no(0, 3*ms)}, dec(false, false, 1, 1, 6*ms, 3*ms)},
		{"Exceeded beats longer wait", []ratebudget.Outcome{no(0, time.Hour), exceeded, no(0, time.Minute)}, dec(false, true, 1, 4, 9*ms, 0)},
		{"Exceeded after admitted", []ratebudget.Outcome{ok(0, ms), ok(0, ms), exceeded}, dec(false, true, 2, 4, 9*ms, 0)},
		{"Exceeded: RetryAfter dropped", []ratebudget.Outcome{{Exceeded: true, RetryAfter: time.Second}}, dec(false, true, 0, 0, 0, 0)},
		{"refused: negative remaining clamped", []ratebudget.Outcome{no(-1, ms)}, dec(false, false, 0, 0, 2*ms, ms)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ratebudget.Combine(checks[:len(tt.outcomes)], tt.outcomes); got != tt.want {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestBudgetsAreDistinct: a budget is one rule name, identity and scope; budgets that
// differ in any of them, or whose identity and scope only join to the same string, are
// spent independently.
func TestBudgetsAreDistinct(t *testing.T) {
	m, _ := newMemory(t)
	r := ratebudget.Rule{Name: "r", Limit: 1, Window: time.Second}
	other := ratebudget.Rule{Name: "r2", Limit: 1, Window: time.Second}
	budgets := []ratebudget.Check{
		{Rule: r, Cost: 1},
		{Rule: other, Cost: 1},
		{Rule: r, Identity: "a", Cost: 1},
		{Rule: r, Scope: "a", Cost: 1},
		{Rule: r, Identity: "a:b", Scope: "c", Cost: 1},
		{Rule: r, Identity: "a", Scope: "b:c", Cost: 1},
		{Rule: r, Identity: "a:b:c", Cost: 1},
		{Rule: r, Scope: "a:b:c", Cost: 1},
		{Rule: r, Identity: "a\x00b", Scope: "c", Cost: 1},
	}
	for i, c := range budgets {
		if d := allow(t, m, c); !d.Allowed {
			t.Fatalf("budget %d (%q/%q/%q) already spent: %+v", i, c.Rule.Name, c.Identity, c.Scope, d)
		}
	}
	for i, c := range budgets {
		if d := allow(t, m, c); d.Allowed {
			t.Fatalf("budget %d (%q/%q/%q) admitted twice", i, c.Rule.Name, c.Identity, c.Scope)
		}
	}
	if n := m.Len(); n != len(budgets) {
		t.Fatalf("Len %d, want %d", n, len(budgets))
	}
}

// TestManyChecks: more checks than the limiter's inline buffers, one of them refusing.
func TestManyChecks(t *testing.T) {
	m, _ := newMemory(t)
	var checks []ratebudget.Check
	for i := range 20 {
		checks = append(checks, ratebudget.Check{Rule: algorithmRule(algorithms[i%3], 2), Identity: fmt.Sprint("id", i), Cost: 1})
	}
	if d := allow(t, m, checks...); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("first: %+v", d)
	}
	last := checks[len(checks)-1]
	if d := allow(t, m, ratebudget.Check{Rule: last.Rule, Identity: last.Identity, Cost: 1}); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("spending the last check's budget: %+v", d)
	}
	d := allow(t, m, checks...)
	if d.Allowed || d.Index != len(checks)-1 || d.Rule != last.Rule.Name {
		t.Fatalf("refusal: %+v", d)
	}
	for i, c := range checks[:len(checks)-1] {
		if p := probe(t, m, c.Rule, c.Identity, ""); p.Remaining != 1 {
			t.Fatalf("check %d charged by a refused request: %+v", i, p)
		}
	}
}

func algorithmRule(a ratebudget.Algorithm, limit int64) ratebudget.Rule {
	return ratebudget.Rule{Name: algname.Of(a), Algorithm: a, Limit: limit, Window: time.Minute}
}

// TestRefusedOutcomesUnspent: in a decision that another check refused, a check that
// fits is reported admitted with its budget as it is, which the refusal did not spend
// from: an untouched fixed window whole (ResetAfter 0), as a probe right after reports
// it; through AllowEach and Reserve alike.
func TestRefusedOutcomesUnspent(t *testing.T) {
	m, _ := newMemory(t)
	a := ratebudget.Rule{Name: "a", Algorithm: ratebudget.FixedWindow, Limit: 10, Window: time.Minute}
	b := ratebudget.Rule{Name: "b", Algorithm: ratebudget.FixedWindow, Limit: 1, Window: time.Minute}
	allow(t, m, ratebudget.Check{Rule: b, Cost: 1}) // b is now full
	checks := []ratebudget.Check{{Rule: a, Cost: 1}, {Rule: b, Cost: 1}}
	want := ratebudget.Outcome{Allowed: true, Remaining: 10}
	for _, reserve := range []bool{false, true} {
		out := make([]ratebudget.Outcome, 2)
		var d ratebudget.Decision
		var err error
		if reserve {
			d, err = m.Reserve(context.Background(), checks, make([]ratebudget.Ticket, 2), out)
		} else {
			d, err = m.AllowEach(context.Background(), checks, out)
		}
		if err != nil || d.Allowed || d.Rule != "b" {
			t.Fatalf("reserve %v: %+v, %v; want refused by b", reserve, d, err)
		}
		if out[0] != want {
			t.Errorf("reserve %v: a's outcome %+v, want %+v: the refusal spent nothing", reserve, out[0], want)
		}
	}
	if p := probe(t, m, a, "", ""); p.Remaining != 10 || p.ResetAfter != 0 {
		t.Errorf("probe of a: %+v, want 10 remaining and ResetAfter 0", p)
	}
}
