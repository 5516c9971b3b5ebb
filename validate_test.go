package ratebudget_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
)

// wantConfigError checks that err is a *ConfigError naming field (and rule, when not empty)
// that matches ErrInvalidConfig and not ErrStoreUnavailable.
func wantConfigError(t *testing.T, err error, rule, field string) {
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
	if !errors.Is(err, ratebudget.ErrInvalidConfig) || errors.Is(err, ratebudget.ErrStoreUnavailable) {
		t.Fatalf("errors.Is(%v, ErrInvalidConfig) = %v, ErrStoreUnavailable = %v", err,
			errors.Is(err, ratebudget.ErrInvalidConfig), errors.Is(err, ratebudget.ErrStoreUnavailable))
	}
}

// The longest Rule.Name and Rule.Window, as Rule documents them.
const (
	maxNameLen = 64
	maxWindow  = 366 * 24 * time.Hour
)

func TestRuleValidate(t *testing.T) {
	valid := ratebudget.Rule{Name: "r", Limit: 10, Window: time.Second}
	with := func(f func(*ratebudget.Rule)) ratebudget.Rule {
		r := valid
		f(&r)
		return r
	}
	token := func(limit int64, window time.Duration, burst int64) ratebudget.Rule {
		return ratebudget.Rule{Name: "r", Algorithm: ratebudget.TokenBucket, Limit: limit, Window: window, Burst: burst}
	}
	tests := []struct {
		name  string
		rule  ratebudget.Rule
		field string // "" = valid
	}{
		{"valid fixed", valid, ""},
		{"valid rolling", with(func(r *ratebudget.Rule) { r.Algorithm = ratebudget.RollingWindow }), ""},
		{"valid token", token(10, time.Second, 0), ""},
		{"valid token burst", token(10, time.Second, 50), ""},
		{"valid inflight", with(func(r *ratebudget.Rule) { r.Algorithm = ratebudget.InFlight }), ""},
		{"name of every allowed byte", with(func(r *ratebudget.Rule) { r.Name = "AZaz09_.-" }), ""},
		{"name of 64 bytes", with(func(r *ratebudget.Rule) { r.Name = strings.Repeat("n", maxNameLen) }), ""},
		{"limit MaxLimit", with(func(r *ratebudget.Rule) { r.Limit = ratebudget.MaxLimit }), ""},
		{"window 1ms", with(func(r *ratebudget.Rule) { r.Window = time.Millisecond }), ""},
		{"window 366 days", with(func(r *ratebudget.Rule) { r.Window = maxWindow }), ""},
		{"token scale exactly 2^53", token(ratebudget.MaxLimit, 8192*time.Millisecond, 0), ""},

		{"name empty", with(func(r *ratebudget.Rule) { r.Name = "" }), "Name"},
		{"name too long", with(func(r *ratebudget.Rule) { r.Name = strings.Repeat("n", maxNameLen+1) }), "Name"},
		{"name with space", with(func(r *ratebudget.Rule) { r.Name = "a b" }), "Name"},
		{"name with colon", with(func(r *ratebudget.Rule) { r.Name = "a:b" }), "Name"},
		{"name with brace", with(func(r *ratebudget.Rule) { r.Name = "{a}" }), "Name"},
		{"name with slash", with(func(r *ratebudget.Rule) { r.Name = "a/b" }), "Name"},
		{"name not ASCII", with(func(r *ratebudget.Rule) { r.Name = "é" }), "Name"},
		{"name with NUL", with(func(r *ratebudget.Rule) { r.Name = "a\x00" }), "Name"},
		{"algorithm unknown", with(func(r *ratebudget.Rule) { r.Algorithm = 4 }), "Algorithm"},
		{"algorithm 255", with(func(r *ratebudget.Rule) { r.Algorithm = 255 }), "Algorithm"},
		{"limit zero", with(func(r *ratebudget.Rule) { r.Limit = 0 }), "Limit"},
		{"limit negative", with(func(r *ratebudget.Rule) { r.Limit = -1 }), "Limit"},
		{"limit above MaxLimit", with(func(r *ratebudget.Rule) { r.Limit = ratebudget.MaxLimit + 1 }), "Limit"},
		{"window zero", with(func(r *ratebudget.Rule) { r.Window = 0 }), "Window"},
		{"window negative", with(func(r *ratebudget.Rule) { r.Window = -time.Second }), "Window"},
		{"window below 1ms", with(func(r *ratebudget.Rule) { r.Window = 999 * time.Microsecond }), "Window"},
		{"window fractional ms", with(func(r *ratebudget.Rule) { r.Window = 1500 * time.Microsecond }), "Window"},
		{"window above 366 days", with(func(r *ratebudget.Rule) { r.Window = maxWindow + time.Millisecond }), "Window"},
		{"burst on fixed", with(func(r *ratebudget.Rule) { r.Burst = 5 }), "Burst"},
		{"burst on rolling", with(func(r *ratebudget.Rule) { r.Algorithm, r.Burst = ratebudget.RollingWindow, 5 }), "Burst"},
		{"burst on inflight", with(func(r *ratebudget.Rule) { r.Algorithm, r.Burst = ratebudget.InFlight, 5 }), "Burst"},
		{"burst negative", token(10, time.Second, -1), "Burst"},
		{"burst above MaxLimit", token(10, time.Second, ratebudget.MaxLimit+1), "Burst"},
		{"token scale above 2^53 by limit", token(ratebudget.MaxLimit, 8193*time.Millisecond, 0), "Burst"},
		{"token scale above 2^53 by burst", token(1, maxWindow, 1<<30), "Burst"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.rule.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("valid rule %+v: %v", tt.rule, err)
				}
				return
			}
			wantConfigError(t, err, tt.rule.Name, tt.field)
			// Limiters refuse the rule before spending anything.
			m, _ := newMemory(t)
			if _, err := m.Allow(context.Background(), []ratebudget.Check{{Rule: tt.rule, Cost: 1}}); err == nil {
				t.Fatal("Memory.Allow accepted an invalid rule")
			} else {
				wantConfigError(t, err, tt.rule.Name, tt.field)
			}
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
	a := ratebudget.Rule{Name: "a", Limit: 5, Window: time.Second}
	aOther := ratebudget.Rule{Name: "a", Algorithm: ratebudget.RollingWindow, Limit: 9, Window: time.Minute}
	b := ratebudget.Rule{Name: "b", Algorithm: ratebudget.TokenBucket, Limit: 5, Window: time.Second}
	bad := ratebudget.Rule{Name: "bad", Limit: 5, Window: 0}
	lease := ratebudget.Rule{Name: "lease", Algorithm: ratebudget.InFlight, Limit: 5, Window: time.Second}
	c := func(r ratebudget.Rule, identity, scope string, cost int64) ratebudget.Check {
		return ratebudget.Check{Rule: r, Identity: identity, Scope: scope, Cost: cost}
	}
	tests := []struct {
		name        string
		checks      []ratebudget.Check
		rule, field string // field "" = valid
	}{
		{"one", []ratebudget.Check{c(a, "", "", 1)}, "", ""},
		{"cost MaxLimit", []ratebudget.Check{c(a, "", "", ratebudget.MaxLimit)}, "", ""},
		{"same rule, other identity", []ratebudget.Check{c(a, "x", "", 1), c(a, "y", "", 1)}, "", ""},
		{"same rule, other scope", []ratebudget.Check{c(a, "x", "/a", 1), c(a, "x", "/b", 1)}, "", ""},
		{"other rules, same identity", []ratebudget.Check{c(a, "x", "", 1), c(b, "x", "", 1)}, "", ""},
		{"nil", nil, "", "checks"},
		{"empty", []ratebudget.Check{}, "", "checks"},
		{"cost zero", []ratebudget.Check{c(a, "", "", 1), c(b, "", "", 0)}, "b", "Cost"},
		{"cost negative", []ratebudget.Check{c(a, "", "", -1)}, "a", "Cost"},
		{"cost above MaxLimit", []ratebudget.Check{c(a, "", "", ratebudget.MaxLimit+1)}, "a", "Cost"},
		{"invalid rule", []ratebudget.Check{c(a, "", "", 1), c(bad, "", "", 1)}, "bad", "Window"},
		{"duplicate budget", []ratebudget.Check{c(a, "x", "s", 1), c(b, "x", "s", 1), c(a, "x", "s", 2)}, "a", "checks"},
		{"duplicate budget, shared", []ratebudget.Check{c(a, "", "", 1), c(a, "", "", 1)}, "a", "checks"},
		{"duplicate name, other rule", []ratebudget.Check{c(a, "x", "", 1), c(aOther, "x", "", 1)}, "a", "checks"},
		{"inflight cost 1", []ratebudget.Check{c(a, "x", "", 3), c(lease, "x", "", 1)}, "", ""},
		{"inflight cost 2", []ratebudget.Check{c(a, "x", "", 1), c(lease, "x", "", 2)}, "lease", "Cost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ratebudget.ValidateChecks(tt.checks)
			m, _ := newMemory(t)
			d, allowErr := m.Allow(context.Background(), tt.checks)
			if tt.field == "" {
				if err != nil || allowErr != nil {
					t.Fatalf("ValidateChecks: %v; Allow: %v", err, allowErr)
				}
				if !d.Allowed && !d.Exceeded {
					t.Fatalf("Allow: %+v", d)
				}
				return
			}
			wantConfigError(t, err, tt.rule, tt.field)
			wantConfigError(t, allowErr, tt.rule, tt.field)
			if d != (ratebudget.Decision{}) || m.Len() != 0 {
				t.Fatalf("an invalid request decided %+v and left %d budgets", d, m.Len())
			}
		})
	}
}

func TestNewMemoryOptions(t *testing.T) {
	tests := []struct {
		name  string
		opts  []ratebudget.MemoryOption
		field string // "" = valid
	}{
		{"none", nil, ""},
		{"clock", []ratebudget.MemoryOption{ratebudget.WithClock(time.Now)}, ""},
		{"sweep 1ms", []ratebudget.MemoryOption{ratebudget.WithSweepInterval(time.Millisecond)}, ""},
		{"sweep 1h", []ratebudget.MemoryOption{ratebudget.WithSweepInterval(time.Hour)}, ""},
		{"nil clock", []ratebudget.MemoryOption{ratebudget.WithClock(nil)}, "WithClock"},
		{"sweep zero", []ratebudget.MemoryOption{ratebudget.WithSweepInterval(0)}, "WithSweepInterval"},
		{"sweep negative", []ratebudget.MemoryOption{ratebudget.WithSweepInterval(-time.Second)}, "WithSweepInterval"},
		{"sweep below 1ms", []ratebudget.MemoryOption{ratebudget.WithSweepInterval(999 * time.Microsecond)}, "WithSweepInterval"},
		{"nil option", []ratebudget.MemoryOption{ratebudget.WithClock(time.Now), nil}, "MemoryOption"},
		{"first error wins", []ratebudget.MemoryOption{ratebudget.WithSweepInterval(0), ratebudget.WithClock(nil)}, "WithSweepInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ratebudget.NewMemory(tt.opts...)
			if tt.field == "" {
				if err != nil || m == nil {
					t.Fatalf("NewMemory: %v, %v", m, err)
				}
				if m.Len() != 0 {
					t.Fatalf("new limiter holds %d budgets", m.Len())
				}
				return
			}
			if m != nil {
				t.Fatalf("NewMemory returned a limiter with error %v", err)
			}
			wantConfigError(t, err, "", tt.field)
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
		var err error = &ratebudget.StoreError{Class: "connection", Uncertain: uncertain, Err: cause}
		if !errors.Is(err, ratebudget.ErrStoreUnavailable) || !errors.Is(err, cause) || errors.Is(err, ratebudget.ErrInvalidConfig) {
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

// A Memory declared as a value (var m ratebudget.Memory, &ratebudget.Memory{}) was
// never made by NewMemory: it holds no shards and no clock. Every method that decides
// or settles reports that as a *ConfigError naming Memory, and never panics (a
// middleware calls them on the request path).
func TestZeroMemoryIsAConfigError(t *testing.T) {
	var m ratebudget.Memory
	ctx := context.Background()
	checks := []ratebudget.Check{{Rule: ratebudget.Rule{Name: "r", Limit: 1, Window: time.Second}, Cost: 1}}
	tickets := []ratebudget.Ticket{{At: 1, ID: 1}}
	calls := map[string]func() error{
		"Allow":     func() error { _, err := m.Allow(ctx, checks); return err },
		"AllowEach": func() error { _, err := m.AllowEach(ctx, checks, make([]ratebudget.Outcome, 1)); return err },
		"Reserve":   func() error { _, err := m.Reserve(ctx, checks, make([]ratebudget.Ticket, 1), nil); return err },
		"Settle":    func() error { return m.Settle(ctx, checks, tickets, []int64{0}) },
		"Renew":     func() error { return m.Renew(ctx, checks, tickets) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s on a zero Memory panicked: %v", name, r)
				}
			}()
			wantConfigError(t, call(), "", "Memory")
		})
	}
	if n := m.Len(); n != 0 {
		t.Fatalf("zero Memory: Len %d, want 0", n)
	}
}

// Algorithm's String: each time rule's name, without allocating; "Algorithm(n)" for another.
func TestAlgorithmString(t *testing.T) {
	for a, want := range map[ratebudget.Algorithm]string{
		ratebudget.FixedWindow: "fixed", ratebudget.TokenBucket: "token", ratebudget.RollingWindow: "rolling",
		ratebudget.InFlight: "inflight", ratebudget.Algorithm(4): "Algorithm(4)", ratebudget.Algorithm(255): "Algorithm(255)",
	} {
		if got := a.String(); got != want {
			t.Errorf("Algorithm %d: String() = %q, want %q", uint8(a), got, want)
		}
		if a <= ratebudget.InFlight {
			if n := testing.AllocsPerRun(100, func() { _ = a.String() }); n != 0 {
				t.Errorf("Algorithm %d: String() allocates %v times, want 0", uint8(a), n)
			}
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
	m, _ := newMemory(t)
	_, err := m.Allow(context.Background(), checks)
	want(t, err, "ratebudget: checks[1]: Name must not be empty")
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
		{Rule: ratebudget.Rule{Name: "account", Algorithm: ratebudget.RollingWindow, Limit: ratebudget.MaxLimit, Window: time.Hour}, Identity: "acct-42", Scope: "/orders", Cost: 7},
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
