package ratebudget_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/limitertest"
)

// wantConfigError checks that err is a *ConfigError naming field (and rule, when not empty)
// that is neither a *StoreError nor a match of ErrStoreUnavailable.
var wantConfigError = limitertest.WantConfigError

func TestRuleValidate(t *testing.T) {
	for _, tt := range limitertest.RuleCases() {
		t.Run(tt.Name, func(t *testing.T) {
			err := tt.Rule.Validate()
			if tt.Field == "" {
				if err != nil {
					t.Fatalf("valid rule %+v: %v", tt.Rule, err)
				}
				return
			}
			wantConfigError(t, err, tt.Rule.Name, tt.Field)
		})
	}
}

func TestValidateRules(t *testing.T) {
	a := ratebudget.Rule{Name: "a", Limit: 1, Window: time.Second}
	b := ratebudget.Rule{Name: "b", Algorithm: ratebudget.TokenBucket, Limit: 1, Window: time.Second}
	aToken := ratebudget.Rule{Name: "a", Algorithm: ratebudget.TokenBucket, Limit: 5, Window: time.Minute}
	bad := ratebudget.Rule{Name: "bad", Limit: 0, Window: time.Second}
	tests := []struct {
		name        string
		rules       []ratebudget.Rule
		rule, field string // field "" = valid
	}{
		{"one", []ratebudget.Rule{a}, "", ""},
		{"two", []ratebudget.Rule{a, b}, "", ""},
		{"nil", nil, "", "rules"},
		{"empty", []ratebudget.Rule{}, "", "rules"},
		{"duplicate", []ratebudget.Rule{a, b, a}, "a", "Name"},
		{"duplicate name, other rule", []ratebudget.Rule{a, aToken}, "a", "Name"},
		{"invalid rule", []ratebudget.Rule{a, bad}, "bad", "Limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ratebudget.ValidateRules(tt.rules)
			if tt.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantConfigError(t, err, tt.rule, tt.field)
		})
	}
}

func TestValidateChecks(t *testing.T) {
	for _, tt := range limitertest.ChecksCases() {
		t.Run(tt.Name, func(t *testing.T) {
			err := ratebudget.ValidateChecks(tt.Checks)
			if tt.Field == "" {
				if err != nil {
					t.Fatalf("ValidateChecks: %v", err)
				}
				return
			}
			wantConfigError(t, err, tt.Rule, tt.Field)
		})
	}
}

func TestErrors(t *testing.T) {
	ce := &ratebudget.ConfigError{Rule: "api", Field: "Limit", Problem: "must be positive"}
	if got, want := ce.Error(), `ratebudget: rule "api": Limit must be positive`; got != want {
		t.Errorf("ConfigError with rule: %q, want %q", got, want)
	}
	ce = &ratebudget.ConfigError{Field: "WithTimeout", Problem: "must be positive"}
	if got, want := ce.Error(), "ratebudget: WithTimeout must be positive"; got != want {
		t.Errorf("ConfigError without rule: %q, want %q", got, want)
	}

	cause := errors.New("dial tcp: refused")
	for _, uncertain := range []bool{false, true} {
		var err error = &ratebudget.StoreError{Class: ratebudget.ClassConnection, Uncertain: uncertain, Err: cause}
		var notConfig *ratebudget.ConfigError
		if !errors.Is(err, ratebudget.ErrStoreUnavailable) || !errors.Is(err, cause) || errors.As(err, &notConfig) {
			t.Errorf("StoreError matching: %v", err)
		}
		if got := strings.Contains(err.Error(), "uncertain"); got != uncertain {
			t.Errorf("StoreError(uncertain=%v).Error() = %q", uncertain, err)
		}
		if !strings.Contains(err.Error(), "connection") || !strings.Contains(err.Error(), cause.Error()) {
			t.Errorf("StoreError.Error() = %q lacks class or cause", err)
		}
	}
}

// A Period is its name: the constants are "hour", "day", "week", "month" and "year".
func TestPeriodNames(t *testing.T) {
	for p, want := range map[ratebudget.Period]string{
		ratebudget.Hour: "hour", ratebudget.Day: "day", ratebudget.Week: "week", ratebudget.Month: "month",
		ratebudget.Year: "year",
	} {
		if got := string(p); got != want {
			t.Errorf("Period %q, want %q", got, want)
		}
	}
}

// Among several rules or checks, a rule without a name cannot be named by its Name: the
// error says which one by its index, and keeps Rule empty and Field "Name".
func TestUnnamedRuleErrorSaysWhich(t *testing.T) {
	a := ratebudget.Rule{Name: "a", Limit: 1, Window: time.Second}
	b := ratebudget.Rule{Name: "b", Limit: 1, Window: time.Second}
	unnamed := ratebudget.Rule{Limit: 1, Window: time.Second}
	want := func(t *testing.T, err error, text string) {
		t.Helper()
		wantConfigError(t, err, "", "Name")
		if err.Error() != text {
			t.Fatalf("error %q, want %q", err, text)
		}
	}
	want(t, unnamed.Validate(), "ratebudget: Name must not be empty")
	want(t, ratebudget.ValidateRules([]ratebudget.Rule{a, b, unnamed}), "ratebudget: rules[2]: Name must not be empty")
	want(t, ratebudget.ValidateRules([]ratebudget.Rule{unnamed, a}), "ratebudget: rules[0]: Name must not be empty")
	checks := []ratebudget.Check{{Rule: a, Cost: 1}, {Rule: unnamed, Cost: 1}}
	want(t, ratebudget.ValidateChecks(checks), "ratebudget: checks[1]: Name must not be empty")
	// A rule with a name, valid or not, is named by it.
	bad := ratebudget.Rule{Name: "a b", Limit: 1, Window: time.Second}
	if err := ratebudget.ValidateRules([]ratebudget.Rule{a, bad}); err == nil || strings.Contains(err.Error(), "rules[") {
		t.Fatalf("error %v, want one naming rule \"a b\" alone", err)
	}
}

// ValidateChecks on valid checks allocates nothing: every limiter calls it on every
// decision. Invalid checks are the caller's mistake, and build their error.
func TestValidateChecksAllocs(t *testing.T) {
	checks := []ratebudget.Check{
		{Rule: ratebudget.Rule{Name: "per-client", Limit: 10, Window: time.Second}, Identity: "203.0.113.7", Cost: 1},
		{Rule: ratebudget.Rule{Name: "service", Algorithm: ratebudget.TokenBucket, Limit: 1 << 30, Burst: 1 << 31, Window: time.Millisecond}, Cost: 1},
		{Rule: ratebudget.Rule{Name: "account", Algorithm: ratebudget.RollingWindow, Limit: bound.MaxLimit, Window: time.Hour}, Identity: "acct-42", Scope: "/orders", Cost: 7},
		{Rule: ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 4, Window: time.Minute}, Identity: "acct-42", Cost: 1},
	}
	var err error
	allocs := testing.AllocsPerRun(200, func() { err = ratebudget.ValidateChecks(checks) })
	if err != nil || allocs != 0 {
		t.Fatalf("ValidateChecks on valid checks: %v, %v allocations; want nil and 0", err, allocs)
	}
	checks[2].Cost = 0
	if err := ratebudget.ValidateChecks(checks); err == nil {
		t.Fatal("ValidateChecks accepted a zero cost")
	}
}

// A *ConfigError is recognised with errors.As, also when wrapped (by fmt.Errorf's %w or
// errors.Join), and a *StoreError or a plain error is not one.
func TestConfigErrorAs(t *testing.T) {
	err := ratebudget.Rule{Name: "r", Window: time.Second}.Validate()
	for _, wrapped := range []error{
		err,
		fmt.Errorf("loading rules: %w", err),
		errors.Join(errors.New("first"), fmt.Errorf("second: %w", err)),
	} {
		var ce *ratebudget.ConfigError
		if !errors.As(wrapped, &ce) || ce.Rule != "r" || ce.Field != "Limit" {
			t.Errorf("errors.As(%v) = %v (%+v), want the rule's ConfigError naming Limit", wrapped, ce != nil, ce)
		}
	}
	for _, other := range []error{
		errors.New("ratebudget: invalid configuration"),
		&ratebudget.StoreError{Class: ratebudget.ClassServer, Err: errors.New("OOM")},
		&ratebudget.StoreError{Class: ratebudget.ClassTimeout},
		nil,
	} {
		var ce *ratebudget.ConfigError
		if errors.As(other, &ce) {
			t.Errorf("errors.As(%v) found a ConfigError", other)
		}
	}
}

// causeError stands for a store client's error type (a *redis.Error, say).
type causeError struct{ msg string }

func (e *causeError) Error() string { return e.msg }

// A *StoreError matches ErrStoreUnavailable with errors.Is and gives its cause to
// errors.Is and errors.As, also wrapped; one without a cause still matches
// ErrStoreUnavailable; errors.Unwrap, which reads a single wrapped error, returns nil.
func TestStoreErrorUnwrap(t *testing.T) {
	cause := &causeError{"OOM command not allowed"}
	withCause := &ratebudget.StoreError{Class: ratebudget.ClassServer, Err: cause}
	for _, err := range []error{withCause, fmt.Errorf("deciding: %w", withCause)} {
		if !errors.Is(err, ratebudget.ErrStoreUnavailable) || !errors.Is(err, cause) {
			t.Errorf("errors.Is(%v): ErrStoreUnavailable %v, cause %v; want both", err,
				errors.Is(err, ratebudget.ErrStoreUnavailable), errors.Is(err, cause))
		}
		var ce *causeError
		if !errors.As(err, &ce) || ce != cause {
			t.Errorf("errors.As(%v, *causeError) = %v, want the cause", err, ce)
		}
		var se *ratebudget.StoreError
		if !errors.As(err, &se) || se != withCause {
			t.Errorf("errors.As(%v, *StoreError) = %v, want the StoreError", err, se)
		}
	}
	bare := &ratebudget.StoreError{Class: ratebudget.ClassBreakerOpen}
	if !errors.Is(bare, ratebudget.ErrStoreUnavailable) {
		t.Errorf("a StoreError without Err does not match ErrStoreUnavailable")
	}
	var ce *causeError
	if errors.As(bare, &ce) || errors.Is(bare, cause) {
		t.Errorf("a StoreError without Err matches a cause")
	}
	if got := errors.Unwrap(withCause); got != nil {
		t.Errorf("errors.Unwrap(StoreError) = %v, want nil", got)
	}
	if errors.Is(errors.New("ratebudget: budget store unavailable"), ratebudget.ErrStoreUnavailable) {
		t.Errorf("another error of the same text matches ErrStoreUnavailable")
	}
}
