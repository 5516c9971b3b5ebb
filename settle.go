package ratebudget

import "errors"

// Ticket records where one admitted check's spend landed (the window, the rolling-window
// event, the lease), so that settling it adjusts exactly that spend (see "Settling a
// decision" in the package documentation). The zero Ticket records nothing: settling it
// changes nothing.
type Ticket struct {
	// At and ID are the issuing limiter's record of the spend (docs/SETTLING.md lists
	// what each limiter of this module keeps there). Callers only store and pass them
	// back.
	At, ID int64
	// Reservation is the issuing limiter's name for the decision the ticket belongs to,
	// the same in each of its tickets, or 0. The Redis limiter draws one per reservation,
	// so that a settle re-sent after a failure applies at most once; the in-process one
	// (package memory) leaves it 0.
	Reservation int64
}

// ErrLeaseLost is reported by a limiter's Renew when an [InFlight] lease had expired
// before it was renewed (see "Settling a decision" in the package documentation).
var ErrLeaseLost = errors.New("ratebudget: in-flight lease expired before it was renewed")
