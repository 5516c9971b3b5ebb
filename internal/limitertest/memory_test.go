package limitertest_test

import (
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/memory"
)

// memory.Limiter resets budgets, settles decisions and reports every check's outcome, so
// the suite's cases of each run rather than skip.
var (
	_ limitertest.Resetter = (*memory.Limiter)(nil)
	_ limitertest.Settler  = (*memory.Limiter)(nil)
	_ limitertest.Reporter = (*memory.Limiter)(nil)
)

func TestMemory(t *testing.T) {
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		clock := limitertest.NewFakeClock(time.UnixMilli(1_700_000_000_000))
		m, err := memory.New(memory.WithClock(clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		return limitertest.Harness{Limiter: m, Advance: clock.Advance, Now: clock.Now}
	})
}

// TestMemoryRealTime runs the suite's real-time branches (those the Redis limiter takes)
// against the exact in-process limiter, so that their bounds are known to hold.
func TestMemoryRealTime(t *testing.T) {
	limitertest.Run(t, func(t *testing.T) limitertest.Harness {
		m, err := memory.New()
		if err != nil {
			t.Fatal(err)
		}
		return limitertest.Harness{Limiter: m}
	})
}
