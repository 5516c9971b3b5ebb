// Package headers names the budget metadata that package middleware writes on limited
// responses, selects its style ([Style]), and writes the refusals (429 Too Many
// Requests, 503 Service Unavailable when the budget store is down) for custom refusal
// and error handlers.
//
// Its functions keep no state and are safe for concurrent use (each on its own
// response).
//
// # Metadata headers
//
// The X-RateLimit-* values describe one budget: the reported rule (the refusing rule, or
// when admitted the most restrictive one), for the identity and scope of this request.
// The IETF fields list every rule of the request as its own list member, in the order of
// the rules (of every stacked layer, outermost first).
//
//	header                  unit                         meaning
//	X-RateLimit-Limit       cost units                   the rule's capacity (Limit, or Burst for a token bucket)
//	X-RateLimit-Remaining   cost units                   units left after this request (a snapshot, not a reservation)
//	X-RateLimit-Reset       seconds, rounded up          time until the budget is whole again if nothing more is spent
//	RateLimit-Policy        structured field (list)      "<rule>";q=<capacity>[;qu="<unit>"][;w=<window seconds>]
//	                                                     [;ratebudget-plan="<plan>"]
//	                                                     (no w for a rule without a window: an in-flight limit;
//	                                                     ratebudget-plan for a rule decided under a plan,
//	                                                     middleware.Plan; receivers ignore parameters they
//	                                                     do not know)
//	RateLimit               structured field (list)      "<rule>";r=<remaining>[;t=<seconds>]
//	Retry-After             seconds, rounded up, >= 1    refusals only: earliest useful retry (RFC 9110 §10.2.3)
//
// The X-RateLimit-* names are a convention, not a standard. RateLimit-Policy and
// RateLimit follow draft-ietf-httpapi-ratelimit-headers-11 ([IETF]), still an
// Internet-Draft; draft-10 is kept selectable ([IETFDraft10]) because the drafts word t
// differently, and so round it differently:
//
//	draft  t means                                                      sent as
//	11     effective window: within t seconds the client can use no     whole seconds, rounded down,
//	       more than r; the time until more quota is made available     omitted when unknown
//	10     seconds until additional quota is made available             whole seconds, rounded up,
//	                                                                    omitted when unknown
//
// t is the end of a fixed window, or the time until a token bucket's next whole unit; a
// rolling window or an in-flight rule sends none. Neither draft's t is the time until the
// budget is whole again (X-RateLimit-Reset): for a token bucket that is much later than
// the next token. The quota unit qu is sent for a unit other than the default "requests":
// "content-bytes" for byte budgets, "concurrent-requests" for in-flight limits.
//
// # Refusal bodies
//
// The middleware's own answers (429; 413 for a cost that can never be admitted, without
// Retry-After; 400 for a request whose identity, scope, plan or cost cannot be
// determined, "Bad Request: rate-limit <part>: <reason>"; 503), [WriteTooManyRequests]
// and [WriteUnavailable] send Cache-Control: no-store and a body chosen by the
// request's Accept header: short text/plain ("Too Many Requests: rate limit \"api\"
// exhausted; retry in 42s") unless the client prefers JSON (it names application/json,
// application/problem+json or application/* with a weight at least that of text/plain),
// then an RFC 9457 application/problem+json object with the members type, title,
// status, detail, and as they apply policy (the reported rule), plan (the plan the
// reported rule decided under, in the middleware's own refusals), violated-policies
// (every refusing rule), retry_after (seconds), cost, remaining, capacity and invalid
// ("identity", "scope", "plan" or "cost"). HEAD gets the headers only.
package headers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/problem"
)

// Style selects which budget metadata headers are written: one set, the X-RateLimit-*
// fields or the IETF ones, or none. Its value is the style's name: "x", "ietf", "none"
// or "ietf10". The zero value "" selects [XRateLimit], the default, as the name "x" does.
type Style string

const (
	// XRateLimit writes X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset.
	// It is the default, which the zero value "" selects too.
	XRateLimit Style = "x"
	// IETF writes RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-11).
	IETF Style = "ietf"
	// None writes no metadata (e.g. for authentication endpoints, where remaining attempts
	// help an attacker). Refusals still carry Retry-After.
	None Style = "none"
	// IETFDraft10 writes RateLimit-Policy and RateLimit per
	// draft-ietf-httpapi-ratelimit-headers-10: t is the time until additional quota is
	// made available, rounded up.
	IETFDraft10 Style = "ietf10"
)

// WriteTooManyRequests writes the 429 refusal (RFC 6585 §4) of d, a refused decision:
// Retry-After in whole seconds from d.RetryAfter (rounded up, at least 1),
// Cache-Control: no-store, and a body naming d.Rule and the wait. It writes no budget
// metadata: package middleware has set it on w before it calls a refusal handler. It is
// the middleware's default 429 but for one case: a Decision does not carry the
// request's cost, so where the default says that a cost does not fit the units left
// (cost 3, 2 left) and adds cost and remaining to the JSON body, this says that the
// limit is exhausted.
func WriteTooManyRequests(w http.ResponseWriter, r *http.Request, d ratebudget.Decision) {
	secs := problem.RetryAfterSeconds(d.RetryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	problem.Write(w, r, problem.Problem{
		Type:             problem.QuotaExceeded,
		Title:            "Too Many Requests",
		Status:           http.StatusTooManyRequests,
		Detail:           "rate limit " + strconv.Quote(d.Rule) + " exhausted; retry in " + strconv.FormatInt(secs, 10) + "s",
		Policy:           d.Rule,
		ViolatedPolicies: []string{d.Rule},
		RetryAfter:       secs,
	})
}

// WriteUnavailable writes 503 Service Unavailable for a budget store that cannot decide,
// under a fail-closed policy: the caller exceeded nothing, so this is never a 429. The
// body names the condition without store details; retryAfter (rounded up, at least 1s)
// is sent as Retry-After, with Cache-Control: no-store.
func WriteUnavailable(w http.ResponseWriter, r *http.Request, retryAfter time.Duration) {
	secs := problem.RetryAfterSeconds(retryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	problem.Write(w, r, problem.Problem{
		Type:       problem.ReducedCapacity,
		Title:      "Service Unavailable",
		Status:     http.StatusServiceUnavailable,
		Detail:     "the rate-limit budget store is unavailable; retry in " + strconv.FormatInt(secs, 10) + "s",
		RetryAfter: secs,
	})
}
