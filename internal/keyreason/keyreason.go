// Package keyreason holds the errors of package keyfuncs's key functions and their
// client-facing reasons, which package middleware puts in its 400 answers ("rate-limit
// identity: header X-Api-Key is missing or empty"). Its values and its function keep no
// state and are safe for concurrent use.
package keyreason

import "errors"

// Error is the type of package keyfuncs's sentinel errors. They are constants, so no one
// can replace them. Errors of its key functions may wrap them with the name of the header
// at fault; they never quote request data, so they are safe to log. They are not meant
// for clients: [Of] gives the reason a client is told.
type Error string

// Error returns the message, which starts with "keyfuncs: ".
func (e Error) Error() string { return string(e) }

const (
	// ErrNoClientIP means that the client address cannot be known: the TCP peer is not
	// an IP address (a unix socket), a trusted proxy reported the client as "unknown" or
	// by an obfuscated identifier, or the chi client-IP middleware stored no address.
	ErrNoClientIP Error = "keyfuncs: no client IP"
	// ErrEmptyKey means that the identity is empty or missing (no header, no value in the
	// context).
	ErrEmptyKey Error = "keyfuncs: empty key"
	// ErrInvalidHeader means that a header a key function reads is malformed: an address
	// that does not parse in a forwarding header, a broken RFC 7239 Forwarded syntax, an
	// identifier that is too long or holds bytes outside printable ASCII, or a secret
	// sent on several lines that differ.
	ErrInvalidHeader Error = "keyfuncs: invalid header"
	// ErrNoRoutePattern means that no route pattern is known for the request yet: a
	// route scope where the middleware is mounted outside any router.
	ErrNoRoutePattern Error = "keyfuncs: no route pattern"
)

// namedHeader is keyfuncs's error for a named header: it unwraps to ErrEmptyKey or
// ErrInvalidHeader and names the header as configured, never as the request sent it.
type namedHeader interface {
	error
	HeaderName() string
}

// Of returns a client-facing explanation of err and true when err is, or wraps, one of
// the errors above: "header X-Api-Key is missing or empty", "header X-Forwarded-For is
// malformed", "the client address could not be determined", "a forwarding header is
// malformed", "identity could not be determined". Header names come from the
// configuration, never from the request. It returns false for nil, for
// ErrNoRoutePattern (a mounting mistake, not the client's fault) and for errors it does
// not know, whose text may hold internal details.
func Of(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	var he namedHeader
	if errors.As(err, &he) {
		switch {
		case errors.Is(he, ErrEmptyKey):
			return "header " + he.HeaderName() + " is missing or empty", true
		case errors.Is(he, ErrInvalidHeader):
			return "header " + he.HeaderName() + " is malformed", true
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
