package middleware

import (
	"fmt"
	"strconv"

	"github.com/ratebudget/ratebudget"
)

// Policy is what the middleware admits when the budget store cannot decide (an error from
// the limiter: timeout, connection refused, server error, open circuit breaker). A store
// error is never read as an empty budget.
//
//	policy         admits                                     response
//	FailClosed     no one                                     503 + Retry-After + Cache-Control: no-store (never 429)
//	FailOpen       everyone                                   the handler's, marked degraded in events and metrics
//	LocalFallback  an in-process budget of limit/replicas     the handler's, or 429 from the local budget
type Policy uint8

const (
	// FailClosed refuses with 503 Service Unavailable while the store cannot decide. It is
	// the zero value and the default: a limiter that protects a resource should not drop
	// its protection silently.
	FailClosed Policy = iota
	// FailOpen admits every request while the store cannot decide; events report
	// OutcomeDegraded so the lost protection is visible.
	FailOpen
	// LocalFallback decides in process with each rule's Limit (and Burst) divided by the
	// configured number of replicas, rounded down but at least 1. The sum over replicas
	// never exceeds the global limit unless a limit is below the replica count; it is wrong
	// (too strict for some clients) when the load balancer spreads one client unevenly.
	// A cost above a rule's share is refused with 429 (Retry-After from
	// [WithUnavailableRetryAfter]), not 413: the store may answer again.
	LocalFallback
)

// String returns "closed", "open" or "local".
func (p Policy) String() string {
	switch p {
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	case LocalFallback:
		return "local"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// ParsePolicy maps "closed", "open" and "local" to a Policy.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	case "local":
		return LocalFallback, nil
	}
	return 0, &ratebudget.ConfigError{Field: "Policy", Problem: fmt.Sprintf("unknown store-error policy %q (want closed, open or local)", s)}
}

// WithStoreErrorPolicy sets what is admitted while the store cannot decide (default
// FailClosed). LocalFallback needs the replica count: use [WithLocalFallback]; New
// refuses LocalFallback given here alone, which would admit the whole limit in every
// replica.
func WithStoreErrorPolicy(p Policy) Option {
	return func(c *config) error {
		switch p {
		case FailClosed, FailOpen:
		case LocalFallback:
		default:
			return configErr("WithStoreErrorPolicy", "unknown policy "+p.String())
		}
		c.policy = p
		return nil
	}
}

// WithLocalFallback selects the LocalFallback policy for a service run as replicas
// processes (at least 1): while the store cannot decide, each process admits
// limit/replicas per rule (rounded down, at least 1).
func WithLocalFallback(replicas int) Option {
	return func(c *config) error {
		if replicas < 1 {
			return configErr("WithLocalFallback", "replicas must be at least 1, got "+strconv.Itoa(replicas))
		}
		c.policy, c.replicas = LocalFallback, replicas
		return nil
	}
}

// localRule scales r for one of replicas processes.
func localRule(r ratebudget.Rule, replicas int) ratebudget.Rule {
	n := int64(replicas)
	r.Limit = max(r.Limit/n, 1)
	if r.Burst > 0 {
		r.Burst = max(r.Burst/n, 1)
	}
	return r
}
