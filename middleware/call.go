package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/deadline"
)

// decide asks the limiter, under the deadline and breaker when it does I/O.
func (m *mw) decide(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, time.Duration, error) {
	return m.decideWith(ctx, func(ctx context.Context) (ratebudget.Decision, error) { return m.limiter.Allow(ctx, checks) })
}

// decideWith makes one limiter call, allow, under the deadline and breaker when the
// limiter does I/O.
func (m *mw) decideWith(ctx context.Context, allow func(context.Context) (ratebudget.Decision, error)) (ratebudget.Decision, time.Duration, error) {
	if !m.io {
		if len(m.cfg.observers) == 0 {
			// Nobody reads the latency: skip the two clock reads.
			d, err := allow(ctx)
			return d, 0, err
		}
		start := time.Now()
		d, err := allow(ctx)
		return d, time.Since(start), err
	}
	var done func(error)
	if m.breaker != nil {
		var err error
		if done, err = m.breaker.allow(); err != nil {
			return ratebudget.Decision{}, 0, err
		}
		defer func() {
			if done != nil {
				// allow panicked: a half-open breaker would wait for this probe's result
				// forever, refusing every other decision. A panic says nothing about the
				// store.
				done(errNotCounted)
			}
		}()
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, m.cfg.timeout)
	d, err := allow(dctx)
	cancel()
	latency := time.Since(start)
	if err != nil && deadline.Ended(dctx) && !deadline.Ended(ctx) && !isConfigError(err) {
		// The decision's own deadline passed: whatever the limiter returned, it is a
		// store timeout, and the command may have reached the store.
		var se *ratebudget.StoreError
		if !errors.As(err, &se) {
			err = &ratebudget.StoreError{Class: ratebudget.ClassTimeout, Uncertain: true, Err: err}
		}
	}
	if done != nil {
		switch {
		case err == nil:
			done(nil)
		case deadline.Ended(ctx) || isConfigError(err):
			// A canceled request or a rejected input says nothing about the store.
			done(errNotCounted)
		default:
			done(err)
		}
		done = nil
	}
	return d, latency, err
}

// decideEach is decide, asking a limiter that can report every check's outcome to write
// them into out (len(checks) elements). The outcomes returned are out, or nil when the
// limiter reports the decision's rule only.
func (m *mw) decideEach(ctx context.Context, checks []ratebudget.Check, out []ratebudget.Outcome) (ratebudget.Decision, []ratebudget.Outcome, time.Duration, error) {
	if m.each == nil {
		d, lat, err := m.decide(ctx, checks)
		return d, nil, lat, err
	}
	d, lat, err := m.decideWith(ctx, func(ctx context.Context) (ratebudget.Decision, error) {
		return m.each.AllowEach(ctx, checks, out)
	})
	if err != nil {
		return d, nil, lat, err
	}
	return d, out, lat, nil
}

// reserveEach is decideEach through the settler's Reserve: tickets receives each check's
// ticket.
func (m *mw) reserveEach(ctx context.Context, checks []ratebudget.Check, out []ratebudget.Outcome, tickets []ratebudget.Ticket) (ratebudget.Decision, []ratebudget.Outcome, time.Duration, error) {
	d, lat, err := m.decideWith(ctx, func(ctx context.Context) (ratebudget.Decision, error) {
		return m.settler.Reserve(ctx, checks, tickets, out)
	})
	if err != nil {
		return d, nil, lat, err
	}
	return d, out, lat, nil
}

// isConfigError reports whether err is, or wraps, a *ratebudget.ConfigError: input the
// limiter rejected, which says nothing about the store.
func isConfigError(err error) bool {
	var ce *ratebudget.ConfigError
	return errors.As(err, &ce)
}
