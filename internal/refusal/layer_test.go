package refusal

import (
	"context"
	"strings"
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
	refusal := ratebudget.Decision{Rule: "api", Limit: 5, RetryAfter: time.Hour, ResetAfter: time.Hour}
	inner := &scripted{answers: []ratebudget.Decision{refusal}}
	l := Wrap(inner, 1024)
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
	inner.answers = []ratebudget.Decision{{Allowed: true, Rule: "api", Limit: 5, Remaining: 3}, refusal}
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

// TestLayerKeySize: a cache key has the same size for any identity, so a hostile
// identity cannot make the cache large.
func TestLayerKeySize(t *testing.T) {
	l := Wrap(&scripted{}, 16)
	rule := ratebudget.Rule{Name: "api", Limit: 5, Window: time.Minute}
	short, _ := l.key(nil, nil, &ratebudget.Check{Rule: rule, Identity: "a"})
	long, _ := l.key(nil, nil, &ratebudget.Check{Rule: rule, Identity: strings.Repeat("x", 1<<20), Scope: strings.Repeat("y", 1<<20)})
	if len(short) != keyLen || len(long) != keyLen || string(short) == string(long) {
		t.Fatalf("keys of %d and %d bytes, want %d, distinct", len(short), len(long), keyLen)
	}
}
