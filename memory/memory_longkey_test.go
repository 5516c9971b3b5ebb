package memory_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// longKey returns a fresh string of n bytes ending in i, so that the limiter is the only
// one to keep it once the call that passed it returns.
func longKey(n, i int) string {
	s := strconv.Itoa(i)
	return strings.Repeat("k", n-len(s)) + s
}

// TestMemoryLongKeysBounded: a budget costs a bounded amount of memory whatever the length
// of its identity and scope (Check.Identity: "its length and bytes are free"), so that the
// cap, which counts budgets, bounds memory. Budgets of 64 KiB identities and scopes are
// created through every path that creates one (one check, several checks, a
// reservation), and the live heap they hold after a collection must stay within 1 KiB per
// budget (the documented figure is 150 to 175 bytes), not grow with the keys' length.
func TestMemoryLongKeysBounded(t *testing.T) {
	const (
		n       = 64
		keySize = 64 << 10
	)
	fixed := ratebudget.Rule{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 10, Window: time.Hour}
	token := ratebudget.Rule{Name: "token", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Hour}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m, _ := newMemory(t)
	for i := range n {
		// One check: a long identity.
		allow(t, m, ratebudget.Check{Rule: fixed, Identity: longKey(keySize, i), Cost: 1})
		// Several checks: a long scope, and a long identity with a long scope.
		allow(t, m,
			ratebudget.Check{Rule: fixed, Identity: "203.0.113.7", Scope: longKey(keySize, i), Cost: 1},
			ratebudget.Check{Rule: token, Identity: longKey(keySize, i), Scope: longKey(keySize, i), Cost: 1})
		// A reservation.
		checks := []ratebudget.Check{{Rule: token, Identity: longKey(keySize, n+i), Cost: 1}}
		tickets := make([]ratebudget.Ticket, 1)
		if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v %v", d, err)
		}
	}
	const budgets = 4 * n
	if got := m.Len(); got != budgets {
		t.Fatalf("Len %d, want %d: distinct keys must be distinct budgets", got, budgets)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	// The limiter's own structures (64 shards, their maps) plus 1 KiB per budget.
	if limit := int64(64<<10 + budgets<<10); held > limit {
		t.Errorf("%d budgets of %d-byte keys hold %d bytes of heap (%d per budget), want at most %d",
			budgets, keySize, held, held/budgets, limit)
	}
	runtime.KeepAlive(m)
}

// TestMemoryLongKeysDistinct: keys too long to be held as they are still name their own
// budgets: keys that differ only in their last byte, or only in where the identity ends
// and the scope begins, are different budgets, and the same long key is the same budget,
// settled and renewed like any other.
func TestMemoryLongKeysDistinct(t *testing.T) {
	one := ratebudget.Rule{Name: "one", Algorithm: ratebudget.FixedWindow, Limit: 1, Window: time.Hour}
	m, _ := newMemory(t)
	long := strings.Repeat("x", 4096)
	keys := []ratebudget.Check{
		{Rule: one, Identity: long + "a", Cost: 1},
		{Rule: one, Identity: long + "b", Cost: 1},
		{Rule: one, Identity: long, Scope: "b", Cost: 1},
		{Rule: one, Identity: long[:2048], Scope: long[2048:] + "b", Cost: 1},
		{Rule: one, Identity: "b", Scope: long, Cost: 1},
		{Rule: one, Identity: "", Scope: "b" + long, Cost: 1},
		{Rule: one, Identity: long + "b" + long, Cost: 1},
		{Rule: one, Identity: long + "b" + long[1:], Cost: 1},
	}
	for i, c := range keys {
		if d := allow(t, m, c); !d.Allowed {
			t.Fatalf("key %d refused on its first request: it shares a budget with another key (%+v)", i, d)
		}
	}
	for i, c := range keys {
		c.Identity, c.Scope = strings.Clone(c.Identity), strings.Clone(c.Scope)
		if d := allow(t, m, c); d.Allowed {
			t.Fatalf("key %d admitted twice under a limit of 1: its budget was not found again", i)
		}
	}
	if got := m.Len(); got != len(keys) {
		t.Fatalf("Len %d, want %d", got, len(keys))
	}

	// Reserve, cancel, and the budget is whole again; a lease is renewed and released.
	ctx := context.Background()
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	checks := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 3, Window: time.Hour}, Identity: long, Scope: long, Cost: 3},
		{Rule: lease, Identity: long, Cost: 1},
	}
	tickets := make([]ratebudget.Ticket, len(checks))
	for range 2 {
		if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v %v", d, err)
		}
		if err := m.Renew(ctx, checks, tickets); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := m.Settle(ctx, checks, tickets, nil); err != nil {
			t.Fatalf("Settle: %v", err)
		}
	}
}

// sliced returns 32 bytes ending in i, sliced out of a fresh string of 1 MiB, as a key
// taken from a large request (one address of a long X-Forwarded-For header, a path out
// of a long request line) would be.
func sliced(i int) string {
	return longKey(1<<20, i)[1<<20-32:]
}

// TestMemoryKeysPinNothing: a budget holds a copy of its identity and scope, not the
// caller's strings, so that a short key sliced out of a large string does not keep the
// large one alive for as long as the budget lives. Budgets of 32-byte keys, each sliced
// out of its own 1 MiB string, are created through every path that creates one (one
// check, several checks, a reservation); the live heap they hold after a collection must
// stay within 1 KiB per budget, not 1 MiB.
func TestMemoryKeysPinNothing(t *testing.T) {
	const n = 16
	fixed := ratebudget.Rule{Name: "fixed", Algorithm: ratebudget.FixedWindow, Limit: 10, Window: time.Hour}
	token := ratebudget.Rule{Name: "token", Algorithm: ratebudget.TokenBucket, Limit: 10, Window: time.Hour}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m, _ := newMemory(t)
	for i := range n {
		allow(t, m, ratebudget.Check{Rule: fixed, Identity: sliced(i), Cost: 1})
		allow(t, m,
			ratebudget.Check{Rule: fixed, Identity: "203.0.113.7", Scope: sliced(i), Cost: 1},
			ratebudget.Check{Rule: token, Identity: sliced(i), Scope: sliced(n + i), Cost: 1})
		checks := []ratebudget.Check{{Rule: token, Identity: sliced(2*n + i), Cost: 1}}
		tickets := make([]ratebudget.Ticket, 1)
		if d, err := m.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v %v", d, err)
		}
	}
	const budgets = 4 * n
	if got := m.Len(); got != budgets {
		t.Fatalf("Len %d, want %d", got, budgets)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	// The limiter's own structures (64 shards, their maps) plus 1 KiB per budget.
	if limit := int64(64<<10 + budgets<<10); held > limit {
		t.Errorf("%d budgets of 32-byte keys sliced out of 1 MiB strings hold %d bytes of heap (%d per budget), want at most %d",
			budgets, held, held/budgets, limit)
	}
	runtime.KeepAlive(m)
}
