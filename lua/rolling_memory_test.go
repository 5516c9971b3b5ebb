package lua_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// TestRollingLogBounded: a rolling-window budget's log under a flood holds at most one
// event per millisecond of its window, and at most Limit events (costs of 1), however
// many admissions merge into one millisecond's event; its members stay short, so its
// memory per event stays that of docs/MEMORY.md.
func TestRollingLogBounded(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	const window = 1000 // ms
	for _, tc := range []struct {
		name    string
		limit   int64
		callers int
		pace    time.Duration // between one caller's decisions, so that events spread over milliseconds
	}{
		{"window-bound", 1 << 30, 1, 0},
		{"window-bound-merging", 1 << 30, 8, 0},
		{"limit-bound", 300, 1, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := ratebudget.Rule{Name: "flood-" + tc.name, Algorithm: ratebudget.RollingWindow, Limit: tc.limit, Window: window * time.Millisecond}
			chk := ratebudget.Check{Rule: rule, Identity: "flooder", Cost: 1}
			key := l.Key(chk)
			var mu sync.Mutex
			var most, admitted int64
			var longest int
			stop := time.Now().Add(3 * window * time.Millisecond / 2)
			var wg sync.WaitGroup
			for range tc.callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(stop); i++ {
						if tc.pace > 0 {
							time.Sleep(tc.pace)
						}
						d, err := l.Allow(ctx, []ratebudget.Check{chk})
						if err != nil {
							t.Error(err)
							return
						}
						if i%64 != 0 {
							if d.Allowed {
								mu.Lock()
								admitted++
								mu.Unlock()
							}
							continue
						}
						n, err := c.ZCard(ctx, key).Result()
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						most = max(most, n)
						if d.Allowed {
							admitted++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			members, err := c.ZRange(ctx, key, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range members {
				longest = max(longest, len(m))
			}
			most = max(most, int64(len(members)))
			usage, err := c.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			enc := c.ObjectEncoding(ctx, key).Val()
			t.Logf("%d admitted; most events held %d, now %d: MEMORY USAGE %d bytes (%s), %.0f per event; longest member %d bytes",
				admitted, most, len(members), usage, enc, float64(usage)/float64(max(1, len(members))), longest)
			if bound := min(window, tc.limit); most > bound {
				t.Fatalf("log held %d events, want at most %d", most, bound)
			}
			if admitted <= most {
				t.Fatalf("%d admissions in %d events: no merge or slide was exercised", admitted, most)
			}
			if longest > 64 {
				t.Fatalf("member of %d bytes", longest)
			}
		})
	}
}
