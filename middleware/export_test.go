package middleware

import "time"

// WithBreakerTuning sets the breaker's failure ratio rule and probe interval, which are
// fixed outside tests: the ratio counts the decisions of the last window, opens at
// ratio of them failed with at least minCalls made, and an open breaker probes every
// cooldown. A zero argument keeps the fixed value.
func WithBreakerTuning(window time.Duration, minCalls int, ratio float64, cooldown time.Duration) Option {
	return func(c *config) error {
		t := defaultBreakerTuning
		if window != 0 {
			t.window = window
		}
		if minCalls != 0 {
			t.minCalls = minCalls
		}
		if ratio != 0 {
			t.failureRatio = ratio
		}
		if cooldown != 0 {
			t.cooldown = cooldown
		}
		c.tuning = t
		return nil
	}
}
