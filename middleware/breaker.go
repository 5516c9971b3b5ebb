package middleware

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/ratebudget/ratebudget"
)

// BreakerState is the state of the circuit breaker that guards the budget store.
type BreakerState uint8

const (
	// BreakerClosed: decisions go to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: too many recent decisions failed; decisions skip the store and the
	// failure policy applies at once, until the cool-down ends.
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

// Breaker configures the circuit breaker in front of a limiter that does I/O (see
// [WithBreaker]). The breaker opens when, over the last Window, at least MinCalls
// decisions were made and at least FailureRatio of them failed; while open, decisions
// skip the store for Cooldown and the failure policy applies at once; then one probe
// decision goes to the store, and its success closes the breaker.
//
// A ratio over a minimum number of calls, not a run of consecutive failures, keeps a
// healthy store's breaker closed when a starved host misses a few deadlines; a store that
// is down or hung fails every call and opens it after MinCalls decisions, each bounded
// by the decision deadline ([WithTimeout]). Every zero field takes its default.
type Breaker struct {
	// Window is the rolling interval over which calls are counted, in steps of a tenth
	// of it. Default 10s; at least 10ms.
	Window time.Duration
	// MinCalls is the number of decisions within Window below which the breaker never
	// opens. Default 20; at least 1.
	MinCalls int
	// FailureRatio is the share of failed decisions within Window, in (0, 1], at which
	// the breaker opens. Default 0.5.
	FailureRatio float64
	// Cooldown is how long the breaker stays open before a probe. Default 100ms: a store
	// that answers again is used again within about Cooldown, and a store still down sees
	// one probe per Cooldown.
	Cooldown time.Duration
	// Disabled turns the breaker off: every decision goes to the store.
	Disabled bool
}

// Defaults of [Breaker], as its field documentation states them.
const (
	defaultBreakerWindow       = 10 * time.Second
	defaultBreakerMinCalls     = 20
	defaultBreakerFailureRatio = 0.5
	defaultBreakerCooldown     = 100 * time.Millisecond
)

// withDefaults fills b's zero fields and validates the rest.
func (b Breaker) withDefaults() (Breaker, error) {
	if b.Window == 0 {
		b.Window = defaultBreakerWindow
	}
	if b.MinCalls == 0 {
		b.MinCalls = defaultBreakerMinCalls
	}
	if b.FailureRatio == 0 {
		b.FailureRatio = defaultBreakerFailureRatio
	}
	if b.Cooldown == 0 {
		b.Cooldown = defaultBreakerCooldown
	}
	switch {
	case b.Window < 10*time.Millisecond:
		return b, configErr("WithBreaker", "Window must be at least 10ms, got "+b.Window.String())
	case b.MinCalls < 1:
		return b, configErr("WithBreaker", "MinCalls must be at least 1, got "+strconv.Itoa(b.MinCalls))
	case !(b.FailureRatio > 0 && b.FailureRatio <= 1):
		return b, configErr("WithBreaker", fmt.Sprintf("FailureRatio must be in (0, 1], got %v", b.FailureRatio))
	case b.Cooldown < 0:
		return b, configErr("WithBreaker", "Cooldown must be positive, got "+b.Cooldown.String())
	}
	return b, nil
}

// WithBreaker configures the circuit breaker in front of a limiter that does I/O (see
// [Breaker]; the zero value gives every default). The in-process memory.Limiter has
// no breaker.
func WithBreaker(b Breaker) Option {
	return func(c *config) error {
		b, err := b.withDefaults()
		if err != nil {
			return err
		}
		c.breaker = b
		return nil
	}
}

// WithBreakerObserver adds a function called on every breaker transition. It runs while
// the breaker holds its lock: keep it fast, and do not call back into the middleware.
func WithBreakerObserver(f func(from, to BreakerState)) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithBreakerObserver", "function must not be nil")
		}
		c.onBreaker = append(c.onBreaker, f)
		return nil
	}
}

// breaker adapts a gobreaker circuit breaker to the middleware: store failures count,
// canceled requests and errors that are not the store's do not.
type breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

// errNotCounted marks a call whose result says nothing about the store's health.
var errNotCounted = errors.New("not counted")

func newBreaker(b Breaker, observers []func(from, to BreakerState)) *breaker {
	st := gobreaker.Settings{
		Name:         "ratebudget",
		MaxRequests:  1,
		Interval:     b.Window,
		BucketPeriod: b.Window / 10,
		Timeout:      b.Cooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			done := c.TotalSuccesses + c.TotalFailures
			return done >= uint32(b.MinCalls) && float64(c.TotalFailures) >= b.FailureRatio*float64(done)
		},
		IsExcluded: func(err error) bool { return err == errNotCounted },
	}
	if len(observers) > 0 {
		st.OnStateChange = func(_ string, from, to gobreaker.State) {
			for _, f := range observers {
				f(stateOf(from), stateOf(to))
			}
		}
	}
	return &breaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](st)}
}

func stateOf(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// allow reports whether a decision may go to the store; when it may, done must be
// called with the call's health: nil for an answer, a non-nil error for a store failure,
// errNotCounted for a call that says nothing about the store.
func (b *breaker) allow() (done func(error), err error) {
	done, err = b.cb.Allow()
	if err != nil {
		return nil, &ratebudget.StoreError{Class: "breaker_open", Err: errBreakerOpen}
	}
	return done, nil
}

var errBreakerOpen = errors.New("circuit breaker open: store not called")
