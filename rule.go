package ratebudget

import (
	"fmt"
	"time"

	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// Algorithm is a rule's time rule: how admitted work is counted over time.
type Algorithm uint8

const (
	// FixedWindow counts admitted cost in a window of Rule.Window that opens at the first
	// admitted request of an idle key. It is the zero value.
	FixedWindow Algorithm = iota
	// TokenBucket refills Rule.Limit tokens per Rule.Window into a bucket of capacity
	// Rule.Burst (Rule.Limit when zero).
	TokenBucket
	// RollingWindow admits while the cost admitted in the last Rule.Window, plus the
	// request's cost, stays within Rule.Limit. Its state is one event per millisecond in
	// which it admitted, up to Limit events for costs of 1 (docs/MEMORY.md), where a
	// fixed window or a token bucket keeps one value (and an InFlight rule one lease per
	// running request).
	RollingWindow
	// InFlight admits while fewer than Rule.Limit admitted requests of the budget are
	// still running. Each admission holds a lease until its decision is settled (see
	// "Settling a decision" in the package documentation) or until Rule.Window, the
	// lease's time to live, has passed since it was taken or last renewed, so that the
	// leases of a holder that crashed expire. A check of an InFlight rule must cost 1: it
	// holds one lease.
	InFlight
	// Calendar counts admitted cost in the calendar period (Rule.Period: an hour, a day,
	// a week, a month or a year of Rule.Location's calendar) that contains the current
	// instant, up to Rule.Limit per period: a daily quota resets at midnight, a monthly
	// one on the 1st, not a window after the first request. Its Window and Burst must be
	// zero.
	Calendar
)

// Period is the calendar period of a [Calendar] rule. A period is the half-open interval
// [start, end) of the rule's Location that contains an instant: from the start of the
// hour, day (midnight), week (midnight of Rule.WeekStart), month (midnight of the 1st) or
// year (midnight of 1 January) to the start of the next one. A day in a time zone is
// midnight to next midnight, 23 or 25 hours on the days its clocks change. Its value is
// its name: "hour", "day", "week", "month" or "year". The zero value "" is no period,
// which a Calendar rule refuses.
type Period string

// The calendar periods.
const (
	// Hour is the clock hour, from minute 0 to the next hour's minute 0 (an hour of a
	// zone's clock, which in a zone of a half-hour offset such as Asia/Kolkata starts at
	// UTC's half hour).
	Hour Period = "hour"
	// Day is from midnight to the next midnight.
	Day Period = "day"
	// Week is seven days from midnight of Rule.WeekStart.
	Week Period = "week"
	// Month is from midnight of the 1st to midnight of the next month's 1st.
	Month Period = "month"
	// Year is from midnight of 1 January to midnight of the next 1 January.
	Year Period = "year"
)

// known reports whether p is one of the calendar periods.
func (p Period) known() bool {
	switch p {
	case Hour, Day, Week, Month, Year:
		return true
	}
	return false
}

// Limits that keep every value exact in a Redis Lua number (a float64, exact below 2^53).
const (
	// maxLimit is the largest accepted Rule.Limit, Rule.Burst and Check.Cost: 2^40.
	maxLimit = bound.MaxLimit
	// maxWindow is the longest accepted Rule.Window.
	maxWindow = 366 * 24 * time.Hour
	// maxNameLen is the longest accepted Rule.Name, in bytes.
	maxNameLen = 64
	// maxScaled bounds Burst×Window(ms), the token bucket's internal scale.
	maxScaled = bound.MaxScaled
)

// Rule is one budget: how much work (Limit, in cost units) is admitted over which time
// (Window) under which time rule (Algorithm). Rules are values; validate them with
// [Rule.Validate] (the middleware and the limiters do it at construction).
//
// The rule's Name identifies the budget in the store: every route and every replica that
// uses a rule of that name, for the same identity and scope, spends from one budget.
//
// Its Limit, Window and Burst may change under the same Name (a deploy, or two versions
// side by side during one): the budget goes on from its state, under the rule deciding,
// and every limiter of this module treats the change alike (an open fixed window keeps
// its end, a token bucket keeps what was spent, rolling-window events and leases keep
// their times). What each time rule does then: docs/RULE-CHANGES.md. Its Algorithm is
// part of the budget: a rule of the same Name under another time rule is another budget.
type Rule struct {
	// Name names the budget: 1 to 64 bytes of [A-Za-z0-9_.-]. It appears in store keys,
	// response bodies, metrics and logs.
	Name string
	// Algorithm is the time rule. The zero value is FixedWindow.
	Algorithm Algorithm
	// Limit is the number of cost units admitted per Window (FixedWindow, RollingWindow),
	// refilled per Window (TokenBucket), the number of leases held at once (InFlight), or
	// admitted per calendar period (Calendar): at least 1, at most 2^40 (1,099,511,627,776).
	Limit int64
	// Window is the length of the window, the refill period, or an InFlight lease's time
	// to live: a whole number of milliseconds, 1ms to 366 days (8784h). A Calendar rule
	// requires zero: its windows are its periods.
	Window time.Duration
	// Burst is the TokenBucket's capacity, in cost units: at most 2^40 (1,099,511,627,776);
	// zero means Limit.
	// Other time rules require zero.
	Burst int64
	// Period is a Calendar rule's period, required there (the zero value "" is none).
	// Other time rules require "".
	Period Period
	// Location is the time zone whose calendar a Calendar rule's periods follow, e.g.
	// time.LoadLocation("America/New_York"); nil means UTC. time.Local is refused: it
	// differs between replicas. Other time rules require nil.
	Location *time.Location
	// WeekStart is the first day of a Calendar rule's Week period; the zero value is
	// Sunday. Other time rules and periods require zero (Sunday).
	WeekStart time.Weekday
}

// capacity is the most cost one identity can ever spend at once under the rule: Burst for
// a token bucket (Limit when Burst is zero), Limit otherwise (what a Decision reports as
// Limit). Package timerule's Capacity, which the limiters call, is held to it by a test.
func (r *Rule) capacity() int64 {
	if r.Algorithm == TokenBucket && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Validate reports the first problem with the rule as a *[ConfigError] naming the field:
// a Name that is not 1 to 64 bytes of [A-Za-z0-9_.-], an unknown Algorithm, a Limit
// outside 1..2^40, a Window outside 1ms..366 days or not a whole number of
// milliseconds (not zero, for a Calendar rule), a Burst on another time rule than
// TokenBucket or outside 0..2^40, a token bucket whose capacity times its Window in
// milliseconds exceeds 2^53 (the scale of its exact refill arithmetic), or a Period,
// Location or WeekStart that is invalid for a Calendar rule (no or an unknown Period,
// time.Local, a WeekStart out of Sunday..Saturday or on another Period than Week) or set
// on another time rule.
func (r Rule) Validate() error {
	if err := r.validateName(); err != nil {
		return err
	}
	if r.Algorithm > Calendar {
		return r.bad("Algorithm", "unknown value %d", uint8(r.Algorithm))
	}
	if r.Limit <= 0 || r.Limit > maxLimit {
		return r.bad("Limit", "must be in 1..%d, got %d", int64(maxLimit), r.Limit)
	}
	if r.Algorithm == Calendar {
		return r.validateCalendar()
	}
	if err := r.validateNotCalendar(); err != nil {
		return err
	}
	if r.Window < time.Millisecond || r.Window > maxWindow {
		return r.bad("Window", "must be in 1ms..%v, got %v", maxWindow, r.Window)
	}
	if r.Window%time.Millisecond != 0 {
		return r.bad("Window", "must be a whole number of milliseconds, got %v", r.Window)
	}
	return r.validateBurst()
}

// bad is the *ConfigError of r's field.
func (r *Rule) bad(field, format string, args ...any) error {
	return &ConfigError{Rule: r.Name, Field: field, Problem: fmt.Sprintf(format, args...)}
}

// validateName is Validate's check of the Name.
func (r *Rule) validateName() error {
	if r.Name == "" {
		return r.bad("Name", "must not be empty")
	}
	if len(r.Name) > maxNameLen {
		return r.bad("Name", "is %d bytes, longer than %d", len(r.Name), maxNameLen)
	}
	for i := 0; i < len(r.Name); i++ {
		if c := r.Name[i]; !nameByte[c] {
			return r.bad("Name", "has byte %q at %d; use only [A-Za-z0-9_.-]", c, i)
		}
	}
	return nil
}

// validateCalendar is Validate's check of a Calendar rule's fields, once its Name,
// Algorithm and Limit are valid.
func (r *Rule) validateCalendar() error {
	switch {
	case r.Period == "":
		return r.bad("Period", "must be set for a Calendar rule (Hour, Day, Week, Month or Year)")
	case !r.Period.known():
		return r.bad("Period", "unknown value %q; use hour, day, week, month or year", string(r.Period))
	case r.Location == time.Local:
		return r.bad("Location", "must not be time.Local, which differs between replicas; name the zone, e.g. time.LoadLocation(\"America/New_York\")")
	case r.WeekStart < time.Sunday || r.WeekStart > time.Saturday:
		return r.bad("WeekStart", "must be Sunday..Saturday, got %d", int(r.WeekStart))
	case r.WeekStart != time.Sunday && r.Period != Week:
		return r.bad("WeekStart", "applies to the Week period only, got %v for %v", r.WeekStart, r.Period)
	case r.Window != 0:
		return r.bad("Window", "must be zero for a Calendar rule (its windows are its periods), got %v", r.Window)
	case r.Burst != 0:
		return r.bad("Burst", "applies to TokenBucket only, got %d for %v", r.Burst, algname.Of(r.Algorithm))
	}
	return nil
}

// validateNotCalendar refuses the Calendar fields on another time rule.
func (r *Rule) validateNotCalendar() error {
	switch {
	case r.Period != "":
		return r.bad("Period", "applies to Calendar only, got %v for %v", r.Period, algname.Of(r.Algorithm))
	case r.Location != nil:
		return r.bad("Location", "applies to Calendar only, got %v for %v", r.Location, algname.Of(r.Algorithm))
	case r.WeekStart != 0:
		return r.bad("WeekStart", "applies to Calendar only, got %v for %v", r.WeekStart, algname.Of(r.Algorithm))
	}
	return nil
}

// windowValid reports whether Validate's checks of the Window and of the Calendar fields
// pass for a rule of another time rule than Calendar, without building an error: part of
// checksValid, small enough to be inlined.
func (r *Rule) windowValid() bool {
	w := r.Window // in 1ms..maxWindow, whole ms; no Calendar field set, not Calendar (nor above)
	return uint64(w-time.Millisecond) <= uint64(maxWindow-time.Millisecond) && w%time.Millisecond == 0 &&
		r.Location == nil && r.Period == "" && int(r.WeekStart)|int(r.Algorithm/Calendar) == 0
}

// calendarValid reports whether validateCalendar would return nil, for a Calendar rule.
func (r *Rule) calendarValid() bool {
	return r.Period.known() && r.Location != time.Local &&
		uint(r.WeekStart) <= uint(time.Saturday) && (r.WeekStart == time.Sunday || r.Period == Week) &&
		r.Window == 0 && r.Burst == 0
}

// validateBurst is Validate's check of the Burst and of a token bucket's scale, once
// the Limit and Window are valid.
func (r *Rule) validateBurst() error {
	if r.Burst != 0 {
		if r.Algorithm != TokenBucket {
			return r.bad("Burst", "applies to TokenBucket only, got %d for %v", r.Burst, algname.Of(r.Algorithm))
		}
		if r.Burst < 0 || r.Burst > maxLimit {
			return r.bad("Burst", "must be in 0..%d, got %d", int64(maxLimit), r.Burst)
		}
	}
	if r.Algorithm == TokenBucket {
		if c, w := r.capacity(), r.Window.Milliseconds(); c > maxScaled/w {
			return r.bad("Burst", "capacity %d × window %dms exceeds 2^53; shorten the window or lower the capacity", c, w)
		}
	}
	return nil
}

// burstValid reports whether validateBurst would return nil, for a rule of a valid
// Window.
func (r *Rule) burstValid() bool {
	return r.Algorithm == TokenBucket && r.Burst >= 0 && r.Burst <= maxLimit && r.capacity() <= maxScaled/r.Window.Milliseconds()
}

// nameByte marks the bytes allowed in a rule name: [A-Za-z0-9_.-].
var nameByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
	}
	return t
}()

// ValidateRules validates each rule ([Rule.Validate]) and checks that there is at least
// one and that names are unique. It returns a *[ConfigError] naming the field at fault
// (and a rule without a name by its index: "rules[2]: Name must not be empty").
func ValidateRules(rules []Rule) error {
	if len(rules) == 0 {
		return &ConfigError{Field: "rules", Problem: "must contain at least one rule"}
	}
	seen := make(map[string]struct{}, len(rules))
	for i, r := range rules {
		if err := r.Validate(); err != nil {
			return locate(err, "rules", i)
		}
		if _, dup := seen[r.Name]; dup {
			return &ConfigError{Rule: r.Name, Field: "Name", Problem: "is used by more than one rule"}
		}
		seen[r.Name] = struct{}{}
	}
	return nil
}
