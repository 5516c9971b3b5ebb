package keyfuncs

import "errors"

// ClientError is an error whose Reason may be shown to the client, for key and cost
// functions that know why a request cannot be counted: "cost must be a positive
// integer", "header X-Tenant is missing". The middleware puts Reason in its 400 answer
// (see [Reason]); errors of any other type are answered with a generic reason, because
// their text may hold internal details.
type ClientError struct {
	// Reason is a short, client-facing explanation without request data that could be
	// reflected at other users (quote no header values).
	Reason string
	// Err is the underlying error, for logs; it may be nil.
	Err error
}

// Error returns "keyfuncs: " and Reason, followed by Err when there is one.
func (e *ClientError) Error() string {
	if e.Err != nil {
		return "keyfuncs: " + e.Reason + ": " + e.Err.Error()
	}
	return "keyfuncs: " + e.Reason
}

// Unwrap returns Err.
func (e *ClientError) Unwrap() error { return e.Err }

// Reason returns a client-facing explanation of err and true when one is known: the
// Reason of a [*ClientError] in err's chain, or a fixed text for this package's errors
// ("header X-Api-Key is missing or empty", "the client address could not be
// determined"). Header names come from the configuration, never from the request. It
// returns false for [ErrNoRoutePattern] (a mounting mistake, not the client's fault) and
// for errors it does not know. errors.As into a *ClientError finds the reasons of other
// key and cost functions only: this package's own errors are not ClientErrors, so that
// their texts stay those of the sentinels they wrap. Callers of KeyFuncs that write
// their own 400 take its reason from here, as the middleware
// does.
func Reason(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	var ce *ClientError
	if errors.As(err, &ce) && ce.Reason != "" {
		return ce.Reason, true
	}
	var he *headerError
	if errors.As(err, &he) {
		switch he.kind {
		case ErrEmptyKey:
			return "header " + he.name + " is missing or empty", true
		case ErrInvalidHeader:
			return "header " + he.name + " is malformed", true
		}
	}
	switch {
	case errors.Is(err, ErrNoRoutePattern):
		return "", false
	case errors.Is(err, ErrNoClientIP):
		return "the client address could not be determined", true
	case errors.Is(err, ErrInvalidHeader):
		return "a forwarding header is malformed", true
	case errors.Is(err, ErrEmptyKey):
		return "identity could not be determined", true
	}
	return "", false
}

// headerError is one of this package's sentinels for a named header. Its text is the
// sentinel's followed by the header's name, as fmt.Errorf("%w: %s") gave before.
type headerError struct {
	kind Error
	name string
}

func (e *headerError) Error() string { return string(e.kind) + ": " + e.name }
func (e *headerError) Unwrap() error { return e.kind }
