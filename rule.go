package ratebudget

import (
	"fmt"
	"time"
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
	// [Settler]) or until Rule.Window, the lease's time to live, has passed since it was
	// taken or last renewed, so that the leases of a holder that crashed expire. A check
	// of an InFlight rule must cost 1: it holds one lease.
	InFlight
)

// String returns "fixed", "token", "rolling" or "inflight".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed"
	case TokenBucket:
		return "token"
	case RollingWindow:
		return "rolling"
	case InFlight:
		return "inflight"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Limits that keep every value exact in a Redis Lua number (a float64, exact below 2^53).
const (
	// MaxLimit is the largest accepted Rule.Limit and Rule.Burst.
	MaxLimit = 1 << 40
	// maxWindow is the longest accepted Rule.Window.
	maxWindow = 366 * 24 * time.Hour
	// maxNameLen is the longest accepted Rule.Name, in bytes.
	maxNameLen = 64
	// maxScaled bounds Burst×Window(ms), the token bucket's internal scale.
	maxScaled = 1 << 53
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
	// refilled per Window (TokenBucket), or the number of leases held at once (InFlight).
	// 1 to MaxLimit.
	Limit int64
	// Window is the length of the window, the refill period, or an InFlight lease's time
	// to live: a whole number of milliseconds, 1ms to 366 days (8784h).
	Window time.Duration
	// Burst is the TokenBucket's capacity, in cost units, 0 to MaxLimit; zero means Limit.
	// Other time rules require zero.
	Burst int64
}

// Capacity is the most cost one identity can ever spend at once under the rule: Burst for
// a token bucket (Limit when Burst is zero), Limit otherwise. A check whose cost exceeds it
// can never be admitted.
func (r Rule) Capacity() int64 {
	if r.Algorithm == TokenBucket && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Validate reports the first problem with the rule as a *[ConfigError] naming the field:
// a Name that is not 1 to 64 bytes of [A-Za-z0-9_.-], an unknown Algorithm, a Limit
// outside 1..MaxLimit, a Window outside 1ms..366 days or not a whole number of
// milliseconds, a Burst on another time rule than TokenBucket or outside 0..MaxLimit,
// or a token bucket whose capacity times its Window in milliseconds exceeds 2^53 (the
// scale of its exact refill arithmetic).
func (r Rule) Validate() error {
	if err := r.validateName(); err != nil {
		return err
	}
	if r.Algorithm > InFlight {
		return r.bad("Algorithm", "unknown value %d", uint8(r.Algorithm))
	}
	if r.Limit <= 0 || r.Limit > MaxLimit {
		return r.bad("Limit", "must be in 1..%d, got %d", int64(MaxLimit), r.Limit)
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

// validateBurst is Validate's check of the Burst and of a token bucket's scale, once
// the Limit and Window are valid.
func (r *Rule) validateBurst() error {
	if r.Burst != 0 {
		if r.Algorithm != TokenBucket {
			return r.bad("Burst", "applies to TokenBucket only, got %d for %v", r.Burst, r.Algorithm)
		}
		if r.Burst < 0 || r.Burst > MaxLimit {
			return r.bad("Burst", "must be in 0..%d, got %d", int64(MaxLimit), r.Burst)
		}
	}
	if r.Algorithm == TokenBucket {
		if c, w := r.Capacity(), r.Window.Milliseconds(); c > maxScaled/w {
			return r.bad("Burst", "capacity %d × window %dms exceeds 2^53; shorten the window or lower the capacity", c, w)
		}
	}
	return nil
}

// burstValid reports whether validateBurst would return nil, for a rule of a valid
// Window.
func (r *Rule) burstValid() bool {
	return r.Algorithm == TokenBucket && r.Burst >= 0 && r.Burst <= MaxLimit && r.Capacity() <= maxScaled/r.Window.Milliseconds()
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
