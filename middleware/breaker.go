package middleware

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of the circuit breaker that guards the budget store.
type BreakerState uint8

const (
	// BreakerClosed: decisions go to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the store failed repeatedly; decisions skip it and the failure policy
	// applies at once, until the cool-down ends.
	BreakerOpen
	// BreakerHalfOpen: the cool-down ended; one probe decision goes to the store, the
	// others apply the failure policy. Success closes the breaker, failure reopens it.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "BreakerState(" + strconv.Itoa(int(s)) + ")"
}

type breakerConfig struct {
	failures int
	cooldown time.Duration
	onChange []func(from, to BreakerState)
}

// WithBreaker configures the circuit breaker in front of a limiter that does I/O: after
// failures consecutive store errors it opens for cooldown (no store calls; the failure
// policy applies at once), then lets one probe through and closes on its success. The
// default is 5 failures and a 1s cool-down; failures = 0 turns the breaker off.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(c *config) error {
		if failures < 0 {
			return configErr("WithBreaker", "failures must not be negative, got "+strconv.Itoa(failures))
		}
		if failures > 0 && cooldown <= 0 {
			return configErr("WithBreaker", "cooldown must be positive, got "+cooldown.String())
		}
		c.breaker.failures, c.breaker.cooldown = failures, cooldown
		return nil
	}
}

// WithBreakerObserver adds a function called on every breaker transition, after the
// transition, outside any lock.
func WithBreakerObserver(f func(from, to BreakerState)) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithBreakerObserver", "function must not be nil")
		}
		c.breaker.onChange = append(c.breaker.onChange, f)
		return nil
	}
}

// breaker is a consecutive-failure circuit breaker. The closed state's fast path takes no
// lock.
type breaker struct {
	cfg   breakerConfig
	now   func() time.Time
	state atomic.Uint32 // BreakerState
	fails atomic.Int64

	mu        sync.Mutex
	openUntil time.Time
	probing   bool
}

func newBreaker(cfg breakerConfig, now func() time.Time) *breaker {
	return &breaker{cfg: cfg, now: now}
}

// State returns the current state.
func (b *breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// allow reports whether a decision may go to the store; probe is true when it is the
// half-open probe, which must be reported with done.
func (b *breaker) allow() (ok, probe bool) {
	if b.State() == BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	var from BreakerState
	changed := false
	switch b.State() {
	case BreakerClosed:
		ok = true
	case BreakerOpen:
		if !b.now().Before(b.openUntil) {
			from, changed = BreakerOpen, true
			b.state.Store(uint32(BreakerHalfOpen))
			b.probing = true
			ok, probe = true, true
		}
	case BreakerHalfOpen:
		if !b.probing {
			b.probing = true
			ok, probe = true, true
		}
	}
	b.mu.Unlock()
	if changed {
		b.notify(from, BreakerHalfOpen)
	}
	return ok, probe
}

// done records a store call's result: failed is true for a store error.
func (b *breaker) done(failed, probe bool) {
	if !failed {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		if probe {
			b.transition(BreakerHalfOpen, BreakerClosed)
		}
		return
	}
	n := b.fails.Add(1)
	switch {
	case probe:
		b.transition(BreakerHalfOpen, BreakerOpen)
	case n >= int64(b.cfg.failures) && b.State() == BreakerClosed:
		b.transition(BreakerClosed, BreakerOpen)
	}
}

func (b *breaker) transition(from, to BreakerState) {
	b.mu.Lock()
	if b.State() != from {
		b.mu.Unlock()
		return
	}
	b.state.Store(uint32(to))
	b.probing = false
	if to == BreakerOpen {
		b.openUntil = b.now().Add(b.cfg.cooldown)
	}
	if to == BreakerClosed {
		b.fails.Store(0)
	}
	b.mu.Unlock()
	b.notify(from, to)
}

func (b *breaker) notify(from, to BreakerState) {
	for _, f := range b.cfg.onChange {
		f(from, to)
	}
}
