package memory_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/memory"
)

// benchRule never refuses in a benchmark's lifetime, so every call is a full admission.
var benchRule = ratebudget.Rule{Name: "bench", Algorithm: ratebudget.FixedWindow, Limit: bound.MaxLimit, Window: time.Hour}

// BenchmarkMemoryAllow: one check, one identity, the real clock. The calendar case is a
// daily quota in America/New_York: its period is cached, so it costs what a fixed window
// does.
func BenchmarkMemoryAllow(b *testing.B) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	for _, algo := range append(algorithms, ratebudget.Calendar) {
		b.Run(algname.Of(algo), func(b *testing.B) {
			m, err := memory.New()
			if err != nil {
				b.Fatal(err)
			}
			r := benchRule
			r.Algorithm = algo
			switch algo {
			case ratebudget.TokenBucket:
				r.Limit, r.Window = 1<<30, time.Millisecond // capacity × window within 2^53
			case ratebudget.Calendar:
				r.Window, r.Period, r.Location = 0, ratebudget.Day, ny
			}
			checks := []ratebudget.Check{{Rule: r, Identity: "203.0.113.7", Cost: 1}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
		})
	}
}

// BenchmarkMemoryAllowParallel: one check per request from all Ps, one identity per
// goroutine (spread over shards), the real clock.
func BenchmarkMemoryAllowParallel(b *testing.B) {
	m, err := memory.New()
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		checks := []ratebudget.Check{{Rule: benchRule, Identity: "client-" + strconv.FormatInt(next.Add(1), 10), Cost: 1}}
		for pb.Next() {
			if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
				b.Errorf("%+v %v", d, err)
				return
			}
		}
	})
}

// BenchmarkMemoryAllow3Checks: a request checked against a per-client fixed window, a
// service-wide token bucket and a per-account rolling window.
func BenchmarkMemoryAllow3Checks(b *testing.B) {
	m, err := memory.New()
	if err != nil {
		b.Fatal(err)
	}
	checks := []ratebudget.Check{
		{Rule: benchRule, Identity: "203.0.113.7", Cost: 1},
		{Rule: ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 1 << 30, Window: time.Millisecond}, Cost: 1},
		{Rule: ratebudget.Rule{Name: "account", Algorithm: ratebudget.RollingWindow, Limit: bound.MaxLimit, Window: 10 * time.Millisecond}, Identity: "acct-42", Scope: "/orders", Cost: 1},
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
			b.Fatalf("%+v %v", d, err)
		}
	}
}

// BenchmarkMemorySettle: what settling adds to a decision of one check: Allow alone,
// Reserve alone (a ticket recorded, never settled), Reserve then Settle at a lower cost,
// and for an InFlight rule a lease taken and released.
func BenchmarkMemorySettle(b *testing.B) {
	ctx := context.Background()
	lease := ratebudget.Rule{Name: "running", Algorithm: ratebudget.InFlight, Limit: 1 << 20, Window: time.Minute}
	for _, bc := range []struct {
		name   string
		rule   ratebudget.Rule
		settle bool
	}{
		{"allow", benchRule, false},
		{"reserve", benchRule, false},
		{"reserve+settle", benchRule, true},
		{"lease+release", lease, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m, err := memory.New()
			if err != nil {
				b.Fatal(err)
			}
			checks := []ratebudget.Check{{Rule: bc.rule, Identity: "203.0.113.7", Cost: 1}}
			if !bc.settle && bc.name == "reserve" || bc.settle && bc.rule.Algorithm != ratebudget.InFlight {
				checks[0].Cost = 2
			}
			tickets := make([]ratebudget.Ticket, 1)
			costs := []int64{1}
			b.ReportAllocs()
			for b.Loop() {
				var d ratebudget.Decision
				if bc.name == "allow" {
					d, err = m.Allow(ctx, checks)
				} else {
					d, err = m.Reserve(ctx, checks, tickets, nil)
				}
				if err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
				if bc.settle {
					if err := m.Settle(ctx, checks, tickets, costs); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
