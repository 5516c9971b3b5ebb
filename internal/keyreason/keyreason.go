// Package keyreason gives the client-facing reasons of package keyfuncs's errors, which
// package middleware puts in its 400 answers ("rate-limit identity: header X-Api-Key is
// missing or empty"). Its function keeps no state and is safe for concurrent use.
package keyreason

import (
	"errors"

	"github.com/ratebudget/ratebudget/keyfuncs"
)

// namedHeader is keyfuncs's error for a named header: it unwraps to ErrEmptyKey or
// ErrInvalidHeader and names the header as configured, never as the request sent it.
type namedHeader interface {
	error
	HeaderName() string
}

// Of returns a client-facing explanation of err and true when err is, or wraps, one of
// package keyfuncs's errors: "header X-Api-Key is missing or empty", "header
// X-Forwarded-For is malformed", "the client address could not be determined", "a
// forwarding header is malformed", "identity could not be determined". Header names
// come from the configuration, never from the request. It returns false for nil, for
// keyfuncs.ErrNoRoutePattern (a mounting mistake, not the client's fault) and for errors
// it does not know, whose text may hold internal details.
func Of(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	var he namedHeader
	if errors.As(err, &he) {
		switch {
		case errors.Is(he, keyfuncs.ErrEmptyKey):
			return "header " + he.HeaderName() + " is missing or empty", true
		case errors.Is(he, keyfuncs.ErrInvalidHeader):
			return "header " + he.HeaderName() + " is malformed", true
		}
	}
	switch {
	case errors.Is(err, keyfuncs.ErrNoRoutePattern):
		return "", false
	case errors.Is(err, keyfuncs.ErrNoClientIP):
		return "the client address could not be determined", true
	case errors.Is(err, keyfuncs.ErrInvalidHeader):
		return "a forwarding header is malformed", true
	case errors.Is(err, keyfuncs.ErrEmptyKey):
		return "identity could not be determined", true
	}
	return "", false
}
