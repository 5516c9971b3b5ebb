package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/israce"
	"github.com/ratebudget/ratebudget/lua"
)

// TestAllowAllocs pins the allocations of an admitted one-check decision on a store
// that answers at once (fakeScripter, whose reply command is one of them): the key's
// digest, the arguments and the command, and nothing on the way back for an answer
// without an error. docs/PERFORMANCE.md quotes the count.
func TestAllowAllocs(t *testing.T) {
	if israce.Enabled {
		t.Skip("the race detector allocates; make test runs this without it")
	}
	chk := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "api", Limit: 1 << 30, Window: time.Second}, Identity: "203.0.113.7", Cost: 1}}
	reply := []any{int64(1), int64(0), int64(0), int64(1000), int64(0), int64(0)}
	for _, cache := range []int{0, 1 << 16} {
		l, err := lua.New(fakeScripter{reply: reply}, lua.WithRefusalCache(cache))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		allocs := testing.AllocsPerRun(200, func() {
			if d, err := l.Allow(ctx, chk); err != nil || !d.Allowed {
				t.Fatalf("Allow: %+v, %v", d, err)
			}
		})
		if allocs > 13 {
			t.Errorf("refusal cache %d: %v allocations per decision, want at most 13", cache, allocs)
		}
	}
}
