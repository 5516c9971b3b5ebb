package middleware

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
)

// Option configures the middleware built by [New]. Options are validated by New, which
// returns a *ratebudget.ConfigError naming the option at fault.
type Option func(*config) error

type config struct {
	cost      func(*http.Request) (int64, error)
	style     headers.Style
	onRefusal func(http.ResponseWriter, *http.Request, ratebudget.Decision)
	onError   func(http.ResponseWriter, *http.Request, error)
	observers []func(Event)
	policy    policy
	replicas  int
	timeout   time.Duration
	breaker   Breaker
	tuning    breakerTuning // fixed at defaultBreakerTuning outside the package's tests
}

func configErr(field, problem string) error {
	return &ratebudget.ConfigError{Field: field, Problem: problem}
}

// WithCost sets the function that gives each request's cost in units (default: 1 per
// request). It is charged to every rule of the middleware. An error, or a cost below 1,
// is answered like a key-function error (see [WithErrorHandler]) and spends nothing.
// The RateLimit-Policy field names no unit for it (the default, requests): rules that
// count bytes do so with [CountRequestBytes] or [CountResponseBytes], whose unit is
// content-bytes.
func WithCost(f func(*http.Request) (int64, error)) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithCost", "function must not be nil")
		}
		c.cost = f
		return nil
	}
}

// WithHeaders selects the budget metadata headers (default headers.XRateLimit,
// X-RateLimit-*, which the zero Style "" selects too): headers.IETF sends
// RateLimit-Policy and RateLimit per draft-ietf-httpapi-ratelimit-headers-11, listing
// every rule of the request (of every stacked layer); headers.IETFDraft10 sends them per
// draft-10 (t rounded up); headers.None sends none, for routes such as authentication
// endpoints.
// RateLimit's t is the end of a fixed window, or the time until a token bucket's next
// whole unit, which the middleware derives from the bucket's reset in whole
// milliseconds: it may be 1 ms early, never late (so a draft-11 t can be one second low
// when the next unit is exactly on a second). A rolling window or an in-flight rule
// sends no t.
// With stacked layers, the style of the layer whose rule is reported applies, and the
// rules of a layer with headers.None are never disclosed: the RateLimit fields of another
// layer's style do not list them, and a refusal's violated-policies does not name them.
func WithHeaders(s headers.Style) Option {
	return func(c *config) error {
		switch s {
		case "":
			s = headers.XRateLimit
		case headers.XRateLimit, headers.IETF, headers.None, headers.IETFDraft10:
		default:
			return configErr("WithHeaders", "unknown style "+strconv.Quote(string(s))+" (want x, ietf, none or ietf10)")
		}
		c.style = s
		return nil
	}
}

// WithRefusalHandler replaces the default refusal response (429, or 413 when the cost
// can never be admitted; a handler can answer a 429 as the default does with
// headers.WriteTooManyRequests). When it is called, w
// already has Cache-Control: no-store and, for a 429, the default's Retry-After (whole
// seconds from the Decision's RetryAfter, rounded up, at least 1), which f may overwrite
// or delete; for a refusal the limiter decided, the metadata headers are set too; a cost
// above a rule's capacity (Decision.Exceeded) is refused before the limiter is asked,
// and w has no metadata and no Retry-After (waiting cannot help). The Decision's
// RetryAfter is the wait the default refusal sends as Retry-After: for an InFlight rule
// at most 1s (a slot frees as soon as any of the client's running requests ends), not
// the lease's expiry that the limiter reports (observers see that one, in
// Event.Decision). For stacked layers the
// handler of the layer whose rule is reported answers, and Decision.Index counts the
// checks of every layer, outermost first.
func WithRefusalHandler(f func(http.ResponseWriter, *http.Request, ratebudget.Decision)) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithRefusalHandler", "function must not be nil")
		}
		c.onRefusal = f
		return nil
	}
}

// WithErrorHandler replaces the response to a request whose identity, scope, plan or
// cost cannot be determined: a key, plan or the cost function failed, a key function
// returned an empty key, or the cost is below 1. The error is an [*InputError] naming the
// part and a client-facing reason. The default answers 400 Bad Request with the detail
// "rate-limit <Part>: <Reason>" ("rate-limit cost: cost must be a positive integer"; the
// body as package headers describes), never with the underlying error's text, or 500 and one log line when the error is
// that of a route scope where no route is known (keyfuncs.RoutePattern outside any
// router: a mounting mistake, not the client's; the line is logged also when f answers). Such a request is never counted, by this layer or any layer stacked
// with it, and never reaches the handler unless f calls it.
func WithErrorHandler(f func(http.ResponseWriter, *http.Request, error)) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithErrorHandler", "function must not be nil")
		}
		c.onError = f
		return nil
	}
}

// WithObserver adds a function that sees every decision, allowed and denied alike, with
// its latency (see [Event]), and every failed settle or lease renewal of an admitted
// request ([SettleFailed]). Stacked layers make one decision, whose events every
// layer's observers see: a function given to several layers of a stack is called once
// per layer for each event (a metrics.Collector counts each once). Observers run
// synchronously on the request path (a renewal's, on its timer's goroutine), in the
// order added, and concurrently for concurrent requests: keep them fast, non-blocking
// and safe for concurrent use. An observer that panics on the request path leaves no
// lease held: what the request reserved is given back when its handler has not run,
// and settled at the reservation otherwise; the panic goes on.
func WithObserver(f func(Event)) Option {
	return func(c *config) error {
		if f == nil {
			return configErr("WithObserver", "function must not be nil")
		}
		c.observers = append(c.observers, f)
		return nil
	}
}

// WithTimeout bounds each decision of a limiter that does I/O (default 50ms), whatever
// the request's own deadline: a hung store costs a request at most d, then the failure
// policy applies. The limiter is called with a context that ends after d; a
// ratebudget.Limiter returns once its context is done. A decision cut short is reported
// as an uncertain timeout (it may still reach the store and spend). d must be positive.
// The in-process memory.Limiter takes no I/O and gets no deadline.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return configErr("WithTimeout", "must be positive, got "+d.String())
		}
		c.timeout = d
		return nil
	}
}
