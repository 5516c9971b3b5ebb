// Package algname names the time rules (ratebudget.Algorithm) as the module spells them
// in store keys and error messages: one definition, which the root package's validation,
// package lua's keys (through internal/budgetkey) and the middleware's errors share.
package algname

import "strconv"

// Of returns "fixed", "token", "rolling", "inflight" or "calendar" for the time rules
// FixedWindow to Calendar, without allocating, and "Algorithm(n)" for another value n.
func Of[A ~uint8](a A) string {
	switch a {
	case 0:
		return "fixed"
	case 1:
		return "token"
	case 2:
		return "rolling"
	case 3:
		return "inflight"
	case 4:
		return "calendar"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}
