package middleware

import (
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
)

// policy is what the middleware admits when the budget store cannot decide (an error
// from the limiter: timeout, connection refused, server error, open circuit breaker).
// A store error is never read as an empty budget. The zero value, failClosed, is the
// default (a 503 with Retry-After: 1); [WithFailOpen] and [WithLocalFallback] choose the
// others.
type policy uint8

const (
	// failClosed refuses with 503 Service Unavailable while the store cannot decide: a
	// limiter that protects a resource should not drop its protection silently.
	failClosed policy = iota
	// failOpen admits every request while the store cannot decide; events report
	// Degraded so the lost protection is visible.
	failOpen
	// localFallback decides in process with each rule's Limit (and Burst) divided by the
	// configured number of replicas.
	localFallback
)

// unavailableRetryAfter is the Retry-After of a 503 under fail-closed, and the least
// Retry-After of the local fallback's 429 for a cost above a rule's share.
const unavailableRetryAfter = time.Second

// WithFailOpen makes the middleware admit every request while the store cannot decide,
// instead of refusing with 503 and Retry-After: 1 (the default, fail-closed). Such admissions are reported
// as [Degraded], so that the lost protection is visible. It replaces an earlier
// [WithLocalFallback], as that replaces it: the last one given decides.
func WithFailOpen() Option {
	return func(c *config) error {
		c.policy, c.replicas = failOpen, 0
		return nil
	}
}

// WithLocalFallback makes the middleware decide in process while the store cannot, for a
// service run as replicas processes (at least 1): each process admits limit/replicas per
// rule (Limit, and Burst when set, rounded down but at least 1). The sum over replicas
// never exceeds the global limit unless a limit is below the replica count; it is wrong
// (too strict for some clients) when the load balancer spreads one client unevenly. A
// cost above a rule's share is refused with 429 (Retry-After at least 1s, as a
// fail-closed 503's), not 413: the store may answer again. The metadata of
// such a response describes the local share (X-RateLimit-Limit is the rule's share of
// its Limit), since that is the budget that decided. It replaces an earlier
// [WithFailOpen], as that replaces it: the last one given decides.
func WithLocalFallback(replicas int) Option {
	return func(c *config) error {
		if replicas < 1 {
			return configErr("WithLocalFallback", "replicas must be at least 1, got "+strconv.Itoa(replicas))
		}
		c.policy, c.replicas = localFallback, replicas
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
