package keyfuncs

import "github.com/ratebudget/ratebudget/internal/keyreason"

// headerError is keyreason.ErrEmptyKey or keyreason.ErrInvalidHeader for a named
// header. Its text is the sentinel's followed by the header's name, as
// fmt.Errorf("%w: %s") gave before. The middleware's 400 names the header
// (HeaderName), never the value the request sent.
type headerError struct {
	kind keyreason.Error
	name string
}

func (e *headerError) Error() string { return string(e.kind) + ": " + e.name }
func (e *headerError) Unwrap() error { return e.kind }

// HeaderName returns the header's name as configured.
func (e *headerError) HeaderName() string { return e.name }
