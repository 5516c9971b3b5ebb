package middleware

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ratebudget/ratebudget/internal/delivery"
)

// LogStoreErrors returns an observer ([WithObserver]) that logs budget-store failures at
// level Warn, failed settles and lease renewals ([SettleFailed]) included, at most
// once per every: a failing store would otherwise write a line per request. Each line
// carries the outcome the policy produced, the error (for operators, never for clients)
// and how many failures were suppressed since the previous line. A non-positive every
// logs every failure. A nil log is slog.Default(), read when LogStoreErrors is called.
// The observer given to several layers of a stack (one set of options for every layer)
// takes each failure once; each call of LogStoreErrors returns an observer of its own.
// It is safe for concurrent use.
func LogStoreErrors(log *slog.Logger, every time.Duration) func(Event) {
	if log == nil {
		log = slog.Default()
	}
	var mu sync.Mutex
	var last time.Time
	var suppressed int
	return func(e Event) {
		if e.Err == nil || e.Result == Invalid || e.Result == Canceled {
			return
		}
		if !delivery.First(e.Request, &mu) {
			return // the same failure, shown to another stacked layer that has this observer
		}
		now := time.Now()
		mu.Lock()
		if every > 0 && !last.IsZero() && now.Sub(last) < every {
			suppressed++
			mu.Unlock()
			return
		}
		n := suppressed
		suppressed, last = 0, now
		mu.Unlock()
		log.LogAttrs(context.Background(), slog.LevelWarn, "rate-limit store failure",
			slog.String("outcome", string(e.Result)),
			slog.Bool("fallback", e.Fallback),
			slog.String("err", e.Err.Error()),
			slog.Int("suppressed", n))
	}
}
