package ratebudget

import (
	"errors"
	"fmt"
	"strconv"
)

// ConfigError reports invalid configuration, naming the field at fault. Constructors
// return it, and so do a limiter's decisions and settles for invalid arguments (see
// [ValidateChecks]): a caller's mistake, which neither waiting nor another store fixes,
// and after which nothing was spent. Recognise it, wrapped or not, with errors.As:
//
//	var ce *ratebudget.ConfigError
//	if errors.As(err, &ce) {
//		// ce.Field names the field at fault
//	}
type ConfigError struct {
	Rule    string // the rule's name, when the field belongs to a rule
	Field   string // the field or option at fault, e.g. "Limit" or "WithTimeout"
	Problem string // what is wrong, e.g. "must be positive, got 0"

	// at is where, among several rules or checks, the rule at fault is when it has no
	// name to be named by (e.g. "rules[2]"); "" otherwise.
	at string
}

// Error names the rule (if any), the field and the problem. A rule without a name, in
// [ValidateRules] or [ValidateChecks], is named by its index, as in
// "ratebudget: rules[2]: Name must not be empty".
func (e *ConfigError) Error() string {
	if e.Rule != "" {
		return fmt.Sprintf("ratebudget: rule %q: %s %s", e.Rule, e.Field, e.Problem)
	}
	if e.at != "" {
		return fmt.Sprintf("ratebudget: %s: %s %s", e.at, e.Field, e.Problem)
	}
	return fmt.Sprintf("ratebudget: %s %s", e.Field, e.Problem)
}

// locate gives err, a [Rule.Validate] error of element i of the slice named list, the
// rule's index when the rule has no name to be named by.
func locate(err error, list string, i int) error {
	if ce, ok := err.(*ConfigError); ok && ce.Rule == "" {
		ce.at = list + "[" + strconv.Itoa(i) + "]"
	}
	return err
}

// ErrStoreUnavailable matches (with errors.Is) every *[StoreError]: the budget store could
// not give a decision. It never means "the budget is empty" nor "the budget is full"; what
// is admitted then is the failure policy's choice (see package middleware).
var ErrStoreUnavailable = errors.New("ratebudget: budget store unavailable")

// ErrorClass is the class of a [StoreError]: a short, bounded label for metrics and logs,
// one of the constants below, whose string is the label's value. The zero value is no
// class; every StoreError of this module carries one of the constants.
type ErrorClass string

// The classes of [StoreError].
const (
	// ClassTimeout: the store did not answer by the decision's deadline, or no
	// connection was free in time.
	ClassTimeout ErrorClass = "timeout"
	// ClassCanceled: the caller's context was canceled.
	ClassCanceled ErrorClass = "canceled"
	// ClassConnection: the transport failed: no connection could be made (refused, a
	// TLS handshake that failed), or it broke (reset, closed).
	ClassConnection ErrorClass = "connection"
	// ClassServer: the store answered with an error reply (OOM, BUSY, a corrupt
	// budget...), so it did not spend.
	ClassServer ErrorClass = "server"
	// ClassReply: the store answered, but its reply is of an unexpected shape.
	ClassReply ErrorClass = "reply"
	// ClassBreakerOpen: the middleware's breaker is open, so the store was not asked.
	ClassBreakerOpen ErrorClass = "breaker_open"
	// ClassOther: any other failure.
	ClassOther ErrorClass = "other"
)

// StoreError wraps a failure of the budget store.
type StoreError struct {
	// Class says what failed, for metrics and logs (see [ErrorClass]).
	Class ErrorClass
	// Uncertain is true when the decision may have been applied before the failure (the
	// request reached the store and the reply was lost): budget may have been spent.
	// A server error reply (OOM, BUSY, NOSCRIPT...) is definite: nothing was spent.
	Uncertain bool
	// Err is the underlying error. Its text may name hosts and internals: log it, do not
	// send it to clients.
	Err error
}

// Error gives the class, whether the outcome is uncertain, and the underlying error.
func (e *StoreError) Error() string {
	u := ""
	if e.Uncertain {
		u = ", outcome uncertain"
	}
	return fmt.Sprintf("ratebudget: budget store unavailable (%s%s): %v", e.Class, u, e.Err)
}

// Unwrap returns [ErrStoreUnavailable] and, when set, the underlying error Err, so that
// errors.Is(err, ErrStoreUnavailable) is true and errors.Is and errors.As find Err's
// chain (a *redis.Error, a net.Error...). errors.Unwrap, which reads only a single
// wrapped error, returns nil for it: use errors.Is and errors.As.
func (e *StoreError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrStoreUnavailable}
	}
	return []error{ErrStoreUnavailable, e.Err}
}
