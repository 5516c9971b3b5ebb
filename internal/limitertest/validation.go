package limitertest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// IsConfigError reports whether err is, or wraps, a *ratebudget.ConfigError.
func IsConfigError(err error) bool {
	var ce *ratebudget.ConfigError
	return errors.As(err, &ce)
}

// WantConfigError checks that err is a *ratebudget.ConfigError naming field (and rule,
// when not empty), and neither a *ratebudget.StoreError nor a match of
// ratebudget.ErrStoreUnavailable.
func WantConfigError(t testing.TB, err error, rule, field string) {
	t.Helper()
	var ce *ratebudget.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v (%T), want a *ConfigError for %s", err, err, field)
	}
	if ce.Field != field || ce.Rule != rule {
		t.Fatalf("got rule %q field %q (%v), want rule %q field %q", ce.Rule, ce.Field, err, rule, field)
	}
	if ce.Problem == "" || !strings.Contains(err.Error(), field) {
		t.Fatalf("error %q does not explain the problem with %s", err, field)
	}
	var se *ratebudget.StoreError
	if errors.As(err, &se) || errors.Is(err, ratebudget.ErrStoreUnavailable) {
		t.Fatalf("errors.As(%v, *StoreError) = %v, errors.Is(ErrStoreUnavailable) = %v, want neither", err,
			errors.As(err, &se), errors.Is(err, ratebudget.ErrStoreUnavailable))
	}
}

// The longest Rule.Name and Rule.Window, as Rule documents them.
const (
	maxNameLen = 64
	maxWindow  = 366 * 24 * time.Hour
)

// RuleCase is a rule and the field [ratebudget.Rule.Validate] names for it: "" when the
// rule is valid.
type RuleCase struct {
	Name  string
	Rule  ratebudget.Rule
	Field string
}

// RuleCases are the rules, valid and not, that Rule.Validate and every limiter's
// decisions are held to: at the bounds of each field and one step beyond.
func RuleCases() []RuleCase {
	valid := ratebudget.Rule{Name: "r", Limit: 10, Window: time.Second}
	with := func(f func(*ratebudget.Rule)) ratebudget.Rule {
		r := valid
		f(&r)
		return r
	}
	cal := func(f func(*ratebudget.Rule)) ratebudget.Rule {
		r := ratebudget.Rule{Name: "r", Algorithm: ratebudget.Calendar, Limit: 10, Period: ratebudget.Day}
		f(&r)
		return r
	}
	token := func(limit int64, window time.Duration, burst int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "r", Algorithm: ratebudget.TokenBucket, Limit: limit, Window: window, Burst: burst}
	}
	return []RuleCase{
		{"valid fixed", valid, ""},
		{"valid rolling", with(func(r *ratebudget.Rule) { r.Algorithm = ratebudget.RollingWindow }), ""},
		{"valid token", token(10, time.Second, 0), ""},
		{"valid token burst", token(10, time.Second, 50), ""},
		{"valid inflight", with(func(r *ratebudget.Rule) { r.Algorithm = ratebudget.InFlight }), ""},
		{"name of every allowed byte", with(func(r *ratebudget.Rule) { r.Name = "AZaz09_.-" }), ""},
		{"name of 64 bytes", with(func(r *ratebudget.Rule) { r.Name = strings.Repeat("n", maxNameLen) }), ""},
		{"limit MaxLimit", with(func(r *ratebudget.Rule) { r.Limit = bound.MaxLimit }), ""},
		{"window 1ms", with(func(r *ratebudget.Rule) { r.Window = time.Millisecond }), ""},
		{"window 366 days", with(func(r *ratebudget.Rule) { r.Window = maxWindow }), ""},
		{"token scale exactly 2^53", token(bound.MaxLimit, 8192*time.Millisecond, 0), ""},

		{"name empty", with(func(r *ratebudget.Rule) { r.Name = "" }), "Name"},
		{"name too long", with(func(r *ratebudget.Rule) { r.Name = strings.Repeat("n", maxNameLen+1) }), "Name"},
		{"name with space", with(func(r *ratebudget.Rule) { r.Name = "a b" }), "Name"},
		{"name with colon", with(func(r *ratebudget.Rule) { r.Name = "a:b" }), "Name"},
		{"name with brace", with(func(r *ratebudget.Rule) { r.Name = "{a}" }), "Name"},
		{"name with slash", with(func(r *ratebudget.Rule) { r.Name = "a/b" }), "Name"},
		{"name not ASCII", with(func(r *ratebudget.Rule) { r.Name = "é" }), "Name"},
		{"name with NUL", with(func(r *ratebudget.Rule) { r.Name = "a\x00" }), "Name"},
		{"algorithm unknown", with(func(r *ratebudget.Rule) { r.Algorithm = ratebudget.Calendar + 1 }), "Algorithm"},
		{"algorithm 255", with(func(r *ratebudget.Rule) { r.Algorithm = 255 }), "Algorithm"},
		{"limit zero", with(func(r *ratebudget.Rule) { r.Limit = 0 }), "Limit"},
		{"limit negative", with(func(r *ratebudget.Rule) { r.Limit = -1 }), "Limit"},
		{"limit above MaxLimit", with(func(r *ratebudget.Rule) { r.Limit = bound.MaxLimit + 1 }), "Limit"},
		{"window zero", with(func(r *ratebudget.Rule) { r.Window = 0 }), "Window"},
		{"window negative", with(func(r *ratebudget.Rule) { r.Window = -time.Second }), "Window"},
		{"window below 1ms", with(func(r *ratebudget.Rule) { r.Window = 999 * time.Microsecond }), "Window"},
		{"window fractional ms", with(func(r *ratebudget.Rule) { r.Window = 1500 * time.Microsecond }), "Window"},
		{"window above 366 days", with(func(r *ratebudget.Rule) { r.Window = maxWindow + time.Millisecond }), "Window"},
		{"burst on fixed", with(func(r *ratebudget.Rule) { r.Burst = 5 }), "Burst"},
		{"burst on rolling", with(func(r *ratebudget.Rule) { r.Algorithm, r.Burst = ratebudget.RollingWindow, 5 }), "Burst"},
		{"burst on inflight", with(func(r *ratebudget.Rule) { r.Algorithm, r.Burst = ratebudget.InFlight, 5 }), "Burst"},
		{"burst negative", token(10, time.Second, -1), "Burst"},
		{"burst above MaxLimit", token(10, time.Second, bound.MaxLimit+1), "Burst"},
		{"token scale above 2^53 by limit", token(bound.MaxLimit, 8193*time.Millisecond, 0), "Burst"},
		{"token scale above 2^53 by burst", token(1, maxWindow, 1<<30), "Burst"},

		{"valid calendar day", cal(func(r *ratebudget.Rule) {}), ""},
		{"valid calendar year", cal(func(r *ratebudget.Rule) { r.Period = ratebudget.Year }), ""},
		{"valid calendar week from saturday", cal(func(r *ratebudget.Rule) { r.Period, r.WeekStart = ratebudget.Week, time.Saturday }), ""},
		{"valid calendar in UTC", cal(func(r *ratebudget.Rule) { r.Location = time.UTC }), ""},
		{"valid calendar in a named zone", cal(func(r *ratebudget.Rule) { r.Location = time.FixedZone("X", 3600) }), ""},
		{"calendar without period", cal(func(r *ratebudget.Rule) { r.Period = "" }), "Period"},
		{"calendar period unknown", cal(func(r *ratebudget.Rule) { r.Period = "fortnight" }), "Period"},
		{"calendar in time.Local", cal(func(r *ratebudget.Rule) { r.Location = time.Local }), "Location"},
		{"calendar with window", cal(func(r *ratebudget.Rule) { r.Window = time.Hour }), "Window"},
		{"calendar with burst", cal(func(r *ratebudget.Rule) { r.Burst = 5 }), "Burst"},
		{"calendar limit zero", cal(func(r *ratebudget.Rule) { r.Limit = 0 }), "Limit"},
		{"calendar week start out of range", cal(func(r *ratebudget.Rule) { r.Period, r.WeekStart = ratebudget.Week, 7 }), "WeekStart"},
		{"calendar week start negative", cal(func(r *ratebudget.Rule) { r.Period, r.WeekStart = ratebudget.Week, -1 }), "WeekStart"},
		{"calendar week start on a day", cal(func(r *ratebudget.Rule) { r.WeekStart = time.Monday }), "WeekStart"},
		{"period on fixed", with(func(r *ratebudget.Rule) { r.Period = ratebudget.Day }), "Period"},
		{"location on rolling", with(func(r *ratebudget.Rule) { r.Algorithm, r.Location = ratebudget.RollingWindow, time.UTC }), "Location"},
		{"week start on token", with(func(r *ratebudget.Rule) { r.Algorithm, r.WeekStart = ratebudget.TokenBucket, time.Monday }), "WeekStart"},
	}
}

// ChecksCase is a request's checks and the rule and field [ratebudget.ValidateChecks]
// names for them: Field "" when they are valid.
type ChecksCase struct {
	Name        string
	Checks      []ratebudget.Check
	Rule, Field string
}

// ChecksCases are the requests, valid and not, that ValidateChecks and every limiter's
// decisions are held to.
func ChecksCases() []ChecksCase {
	a := ratebudget.Rule{Name: "a", Limit: 5, Window: time.Second}
	aOther := ratebudget.Rule{Name: "a", Algorithm: ratebudget.RollingWindow, Limit: 9, Window: time.Minute}
	b := ratebudget.Rule{Name: "b", Algorithm: ratebudget.TokenBucket, Limit: 5, Window: time.Second}
	bad := ratebudget.Rule{Name: "bad", Limit: 5, Window: 0}
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 5, Window: time.Second}
	day := ratebudget.Rule{Name: "day", Algorithm: ratebudget.Calendar, Limit: 5, Period: ratebudget.Day}
	dayWindow, noPeriod, local, fixedPeriod := day, day, day, a
	dayWindow.Window, noPeriod.Period, local.Location, fixedPeriod.Period = time.Hour, "", time.Local, ratebudget.Day
	c := func(r ratebudget.Rule, identity, scope string, cost int64) ratebudget.Check {
		return ratebudget.Check{Rule: r, Identity: identity, Scope: scope, Cost: cost}
	}
	return []ChecksCase{
		{"one", []ratebudget.Check{c(a, "", "", 1)}, "", ""},
		{"cost MaxLimit", []ratebudget.Check{c(a, "", "", bound.MaxLimit)}, "", ""},
		{"same rule, other identity", []ratebudget.Check{c(a, "x", "", 1), c(a, "y", "", 1)}, "", ""},
		{"same rule, other scope", []ratebudget.Check{c(a, "x", "/a", 1), c(a, "x", "/b", 1)}, "", ""},
		{"other rules, same identity", []ratebudget.Check{c(a, "x", "", 1), c(b, "x", "", 1)}, "", ""},
		{"nil", nil, "", "checks"},
		{"empty", []ratebudget.Check{}, "", "checks"},
		{"cost zero", []ratebudget.Check{c(a, "", "", 1), c(b, "", "", 0)}, "b", "Cost"},
		{"cost negative", []ratebudget.Check{c(a, "", "", -1)}, "a", "Cost"},
		{"cost above MaxLimit", []ratebudget.Check{c(a, "", "", bound.MaxLimit+1)}, "a", "Cost"},
		{"invalid rule", []ratebudget.Check{c(a, "", "", 1), c(bad, "", "", 1)}, "bad", "Window"},
		{"duplicate budget", []ratebudget.Check{c(a, "x", "s", 1), c(b, "x", "s", 1), c(a, "x", "s", 2)}, "a", "checks"},
		{"duplicate budget, shared", []ratebudget.Check{c(a, "", "", 1), c(a, "", "", 1)}, "a", "checks"},
		{"duplicate name, other rule", []ratebudget.Check{c(a, "x", "", 1), c(aOther, "x", "", 1)}, "a", "checks"},
		{"inflight cost 1", []ratebudget.Check{c(a, "x", "", 3), c(lease, "x", "", 1)}, "", ""},
		{"inflight cost 2", []ratebudget.Check{c(a, "x", "", 1), c(lease, "x", "", 2)}, "lease", "Cost"},
		{"calendar", []ratebudget.Check{c(a, "x", "", 1), c(day, "x", "", 3)}, "", ""},
		{"calendar with window", []ratebudget.Check{c(a, "x", "", 1), c(dayWindow, "x", "", 1)}, "day", "Window"},
		{"calendar without period", []ratebudget.Check{c(noPeriod, "x", "", 1)}, "day", "Period"},
		{"calendar in time.Local", []ratebudget.Check{c(local, "x", "", 1)}, "day", "Location"},
		{"period on fixed", []ratebudget.Check{c(fixedPeriod, "x", "", 1)}, "a", "Period"},
	}
}
